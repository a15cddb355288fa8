/*
 * A CPU-bound workload with a known call tree, for comparing stack walks:
 * every round spends its work units in
 *   round -> alpha -> beta -> gamma -> work   5 units (50%)
 *   round -> alpha -> delta -> work           3 units (30%)
 *   round -> epsilon -> work                  2 units (20%)
 * under main -> descend x DEPTH (to give stacks a realistic depth).
 * The hot loop is pure computation: the clock is read once per round (a few
 * ms), so the split does not depend on how costly a syscall is on the host.
 * Each round's units are scaled by a pseudo-random 1 to 4 (the split stays
 * 5:3:2 in every round): rounds of one fixed length can lock in phase with a
 * sampling profiler's period (a slow TCG guest made rounds of about three
 * 99 Hz periods, and epsilon took 40% of the samples).
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

__attribute__((noinline)) unsigned long gamma_(unsigned long k)
{
	unsigned long r = work(5 * k);
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long beta(unsigned long k)
{
	unsigned long r = gamma_(k);
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long delta(unsigned long k)
{
	unsigned long r = work(3 * k);
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long alpha(unsigned long k)
{
	unsigned long r = beta(k);
	r += delta(k);
	sink += r;
	return r;
}
__attribute__((noinline)) unsigned long epsilon(unsigned long k)
{
	unsigned long r = work(2 * k);
	sink += r;
	return r;
}
static unsigned long seed = 88172645463325252UL;

__attribute__((noinline)) unsigned long round_(void)
{
	seed ^= seed << 13; /* xorshift64 */
	seed ^= seed >> 7;
	seed ^= seed << 17;
	unsigned long k = 1 + (seed >> 60) % 4;
	unsigned long r = alpha(k);
	r += epsilon(k);
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
