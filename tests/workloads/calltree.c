/*
 * A CPU-bound workload with a known call tree, for comparing stack walks:
 * every round spends its work units in
 *   round -> alpha -> beta -> gamma -> work   5 units (50%)
 *   round -> alpha -> delta -> work           3 units (30%)
 *   round -> epsilon -> work                  2 units (20%)
 * under main -> descend x DEPTH (to give stacks a realistic depth).
 * The hot loop is pure computation: the clock is read once per round (a few
 * ms), so the split does not depend on how costly a syscall is on the host.
 * No call is in tail position (each result is used), so the tree is the
 * same with or without sibling-call optimisation.
 *   calltree [SECONDS=10] [DEPTH=0] [count]
 * With `count`, prints "SECOND ROUNDS" once a second (rounds done so far),
 * for bench/unwind's throughput in a steady-state window.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "spin.h" /* now() */

#define UNIT 200000UL

volatile unsigned long sink;

__attribute__((noinline)) unsigned long work(unsigned long units)
{
	unsigned long s = sink;
	for (unsigned long i = 0; i < units * UNIT; i++)
		s = s * 6364136223846793005UL + i; /* WORK_LINE */
	return s;
}

__attribute__((noinline)) unsigned long gamma_(void)
{
	unsigned long r = work(5);
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long beta(void)
{
	unsigned long r = gamma_();
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long delta(void)
{
	unsigned long r = work(3);
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long alpha(void)
{
	unsigned long r = beta();
	r += delta();
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long epsilon(void)
{
	unsigned long r = work(2);
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long round_(void)
{
	unsigned long r = alpha();
	r += epsilon();
	sink += r;
	return r;
}

__attribute__((noinline)) unsigned long descend(int d)
{
	unsigned long r = d > 0 ? descend(d - 1) : round_();
	sink += r;
	return r;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 10;
	int depth = argc > 2 ? atoi(argv[2]) : 0;
	int count = argc > 3 && !strcmp(argv[3], "count");
	double start = now(), end = start + secs, t;
	unsigned long rounds = 0;
	int second = 1;
	while ((t = now()) < end) {
		sink += descend(depth);
		rounds++;
		if (count && t - start >= second) {
			printf("%d %lu\n", second++, rounds);
			fflush(stdout);
		}
	}
	return 0;
}
