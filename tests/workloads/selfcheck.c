/*
 * A target that checks its own work while it is probed, for the attach and
 * detach cycles of `sonde funclatency` and `sonde slow`: two threads call
 * mix() (a uprobe and uretprobe target) 20,000 times a round, compare each
 * round's checksum with the first one's, then rest as long as the round took
 * (at least 0.5 ms): probed, a round is 40,000 traps, and two threads
 * calling without a rest kept both of CI's cores busy for the whole test.
 * Runs until SIGTERM, then prints "rounds N mismatches M" and exits 0, or 3
 * when any round differed.
 */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <unistd.h>
#include "spin.h" /* now() */

static volatile sig_atomic_t stop;
static volatile uint64_t rounds, mismatches;

__attribute__((noinline)) uint64_t mix(uint64_t x)
{
	x ^= x >> 31;
	x *= 0x7fb5d329728ea185ULL;
	x ^= x >> 27;
	__asm__ volatile("" : "+r"(x));
	return x;
}

static uint64_t round_sum(void)
{
	uint64_t s = 0;
	for (uint64_t i = 0; i < 20000; i++)
		s += mix(i);
	return s;
}

static void *worker(void *arg)
{
	(void)arg;
	uint64_t want = round_sum();
	while (!stop) {
		double t0 = now();
		if (round_sum() != want)
			__atomic_add_fetch(&mismatches, 1, __ATOMIC_RELAXED);
		__atomic_add_fetch(&rounds, 1, __ATOMIC_RELAXED);
		double took = now() - t0;
		if (took < 0.0005)
			took = 0.0005;
		struct timespec rest = {(time_t)took, (long)((took - (time_t)took) * 1e9)};
		nanosleep(&rest, NULL);
	}
	return NULL;
}

static void on_term(int sig)
{
	(void)sig;
	stop = 1;
}

int main(void)
{
	signal(SIGTERM, on_term);
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	printf("ready\n");
	fflush(stdout);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	printf("rounds %llu mismatches %llu\n", (unsigned long long)rounds,
	       (unsigned long long)mismatches);
	return mismatches ? 3 : 0;
}
