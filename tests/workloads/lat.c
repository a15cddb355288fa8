/*
 * Known latencies for `sonde funclatency` tests: after argv[1] seconds,
 * one_ms() x100 (1.2 ms each) and ten_ms() x10 (12 ms each), spinning on the
 * clock so each call lasts its time plus little; recurse(4) x10 (five nested
 * calls of ~1.2 ms each, the innermost spinning); then hang(0.2) and
 * hang(argv[2] seconds), and exit. Build with -fno-inline -fno-optimize-sibling-calls.
 * A call preempted at its start or end lasts longer: with argv[3], each
 * one_ms() and ten_ms() call's duration goes there twice ("one_ms INNER
 * OUTER"): measured inside the function, and around the call. A uprobe's
 * window lies between the two, the test's oracle for where each call lands.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "spin.h"

/* Each returns its own duration, measured inside it. */
__attribute__((noinline)) double one_ms(void)
{
	double t0 = now();
	spin(0.0012);
	return now() - t0;
}

__attribute__((noinline)) double ten_ms(void)
{
	double t0 = now();
	spin(0.012);
	return now() - t0;
}

__attribute__((noinline)) int recurse(int depth)
{
	if (depth == 0) {
		spin(0.0012);
		return 0;
	}
	return recurse(depth - 1) + 1;
}

__attribute__((noinline)) void hang(double sec)
{
	struct timespec ts = {(time_t)sec, (long)((sec - (time_t)sec) * 1e9)};
	nanosleep(&ts, NULL);
}

int main(int argc, char **argv)
{
	double wait = argc > 1 ? atof(argv[1]) : 1;
	struct timespec ts = {(time_t)wait, (long)((wait - (time_t)wait) * 1e9)};
	nanosleep(&ts, NULL); /* time for the tracer to attach */
	FILE *log = argc > 3 ? fopen(argv[3], "w") : NULL;
	for (int i = 0; i < 110; i++) {
		double t0 = now();
		double inner = i < 100 ? one_ms() : ten_ms();
		double outer = now() - t0;
		if (log)
			fprintf(log, "%s %.0f %.0f\n", i < 100 ? "one_ms" : "ten_ms", inner * 1e9,
			        outer * 1e9);
	}
	if (log)
		fclose(log);
	int r = 0;
	for (int i = 0; i < 10; i++)
		r += recurse(4);
	hang(0.2);
	hang(argc > 2 ? atof(argv[2]) : 0);
	return r == 40 ? 0 : 1;
}
