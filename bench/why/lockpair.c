// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* bench/why/releases: a mutex held HOLD_US (sleeping) by one thread, then
 * let go for 100 us, and waited for by another: one lock release a cycle.
 * Usage: lockpair SECONDS HOLD_US; prints the cycles done. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static volatile int stop;
static long hold_us, cycles;

static void us_sleep(long us)
{
	struct timespec t = {us / 1000000, (us % 1000000) * 1000};
	nanosleep(&t, NULL);
}

static void *holder(void *a)
{
	while (!stop) {
		pthread_mutex_lock(&mu);
		us_sleep(hold_us);
		pthread_mutex_unlock(&mu);
		us_sleep(100);
	}
	return a;
}

static void *waiter(void *a)
{
	us_sleep(50);
	while (!stop) {
		pthread_mutex_lock(&mu);
		cycles++;
		pthread_mutex_unlock(&mu);
		us_sleep(20);
	}
	return a;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: lockpair SECONDS HOLD_US\n");
		return 2;
	}
	hold_us = atol(argv[2]);
	pthread_t h, w;
	pthread_create(&h, NULL, holder, NULL);
	pthread_create(&w, NULL, waiter, NULL);
	sleep(atoi(argv[1]));
	stop = 1;
	pthread_join(h, NULL);
	pthread_join(w, NULL);
	printf("%ld\n", cycles);
	return 0;
}
