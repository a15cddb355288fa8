// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Threads whose ids share one slot of `sonde why --thread-slots SLOTS`: it
 * starts threads until KEEP of them have an id that is a multiple of SLOTS
 * (the others end at once), names them slot0, slot1... and has slot i spin
 * for i + 1 ms, then sleep 2 ms, over and over: each a CPU share of its own,
 * so that records mixed up show. The main thread waits in pthread_join.
 * Usage: whyslots SLOTS KEEP SECONDS; prints "ready TID..." once all run. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

#define MAX_KEEP 16

static unsigned slots;
static double until;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static pid_t last_tid;

static double now(int clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct arg {
	int index;
	int decided; /* under mu: whether it is kept is known */
	int keep;
};

static void *worker(void *p)
{
	struct arg *a = p;
	pid_t tid = syscall(SYS_gettid);
	/* Reports its id, and waits to hear whether it is kept. */
	pthread_mutex_lock(&mu);
	last_tid = tid;
	pthread_cond_broadcast(&cv);
	while (!a->decided)
		pthread_cond_wait(&cv, &mu);
	int keep = a->keep;
	pthread_mutex_unlock(&mu);
	if (!keep)
		return NULL;
	char name[16];
	snprintf(name, sizeof(name), "slot%d", a->index);
	pthread_setname_np(pthread_self(), name);
	double spin = (a->index + 1) / 1000.0;
	struct timespec nap = {0, 2000000};
	while (now(CLOCK_MONOTONIC) < until) {
		double t0 = now(CLOCK_THREAD_CPUTIME_ID);
		while (now(CLOCK_THREAD_CPUTIME_ID) - t0 < spin)
			;
		nanosleep(&nap, NULL);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	slots = atoi(argv[1]);
	int keep = atoi(argv[2]);
	if (!slots || keep < 1 || keep > MAX_KEEP)
		return 2;
	until = now(CLOCK_MONOTONIC) + atof(argv[3]);
	static struct arg args[MAX_KEEP];
	pthread_t kept[MAX_KEEP];
	pid_t tids[MAX_KEEP];
	int n = 0;
	for (int tries = 0; n < keep && tries < 100000; tries++) {
		pthread_t t;
		args[n] = (struct arg){.index = n};
		pthread_mutex_lock(&mu);
		last_tid = 0;
		if (pthread_create(&t, NULL, worker, &args[n])) {
			pthread_mutex_unlock(&mu);
			return 1;
		}
		while (!last_tid)
			pthread_cond_wait(&cv, &mu);
		int keep_it = last_tid % slots == 0;
		args[n].keep = keep_it;
		args[n].decided = 1;
		pthread_cond_broadcast(&cv);
		pthread_mutex_unlock(&mu);
		if (keep_it) {
			kept[n] = t;
			tids[n] = last_tid;
			n++;
		} else {
			pthread_join(t, NULL);
		}
	}
	if (n < keep)
		return 1;
	printf("ready");
	for (int i = 0; i < n; i++)
		printf(" %d", tids[i]);
	printf("\n");
	fflush(stdout);
	for (int i = 0; i < n; i++)
		pthread_join(kept[i], NULL);
	return 0;
}
