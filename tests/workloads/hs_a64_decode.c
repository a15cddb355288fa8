// The kernel walk's decoder of AArch64 HotSpot prologues
// (src/engine/runtime/java/hs_a64.h), built for the host: reads lines
// "DONE W0 W1 ..." (the instructions done before pc, then the words from the
// method's entry, in hex) and prints "OK STATE LOWERED" for each.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned int __u32;
typedef unsigned long long __u64;
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#define __TARGET_ARCH_arm64 1
#include "arch.h"
#include "hs_a64.h"

int main(void)
{
	char line[8192];
	while (fgets(line, sizeof line, stdin)) {
		__u32 w[32];
		memset(w, 0, sizeof w);
		char *p = line, *end;
		__u64 done = strtoull(p, &end, 10);
		p = end;
		for (int i = 0; i < 32; i++) {
			unsigned long x = strtoul(p, &end, 16);
			if (end == p)
				break;
			w[i] = (__u32)x;
			p = end;
		}
		int state;
		__u32 lowered;
		int ok = hs_a64_pro_words(w, done, &state, &lowered);
		printf("%d %d %u\n", ok, state, lowered);
	}
	return 0;
}
