// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* sonde why's bound on lock releasers' stack walks: a pool of THREADS
 * workers waiting on a condition variable, woken all at once by a
 * dispatcher thread every 12 ms (pthread_cond_broadcast), each taking the
 * mutex in turn: thousands of lock releases a second, each ending a wait
 * of about 12 ms (every one would be walked, but for the per-CPU bound).
 * Usage: whypool THREADS SECONDS; prints "ready" once the pool waits. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static unsigned long round_no;

static void *worker(void *a)
{
	unsigned long seen = 0;
	pthread_mutex_lock(&mu);
	for (;;) {
		while (round_no == seen)
			pthread_cond_wait(&cv, &mu);
		seen = round_no;
	}
	pthread_mutex_unlock(&mu);
	return a;
}

static void *dispatcher(void *a)
{
	struct timespec t = {0, 12 * 1000 * 1000};
	for (;;) {
		nanosleep(&t, NULL);
		pthread_mutex_lock(&mu);
		round_no++;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
	}
	return a;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: whypool THREADS SECONDS\n");
		return 2;
	}
	int n = atoi(argv[1]);
	pthread_t t;
	for (int i = 0; i < n; i++) {
		pthread_create(&t, NULL, worker, NULL);
		pthread_setname_np(t, "worker");
	}
	pthread_create(&t, NULL, dispatcher, NULL);
	pthread_setname_np(t, "dispatcher");
	usleep(100 * 1000);
	printf("ready\n");
	fflush(stdout);
	sleep(atoi(argv[2]));
	return 0;
}
