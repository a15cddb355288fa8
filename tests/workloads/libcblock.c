/*
 * Blocking through libc, each from its own named function, in a 1:2:3:4:5
 * split of the main thread's blocked time per round (90 ms; long enough
 * that wake-up latencies on a loaded host hardly move the split):
 *   in_usleep: usleep(6 ms)
 *   in_poll:   poll(NULL, 0, 12 ms)
 *   in_read:   read() on a pipe a helper writes 18 ms after being asked
 *   in_mutex:  pthread_mutex_lock() of a mutex the helper holds for 24 ms
 *   in_cond:   pthread_cond_wait() that the helper signals after 30 ms
 * The helper thread is asked through another pipe. Build without frame
 * pointers: libc's functions have none either, and the callers of libc's
 * blocking calls are what an off-CPU profile must show.
 *   libcblock [SECONDS=10]
 */
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include "spin.h" /* now() */

static int ask[2], answer[2];
static pthread_mutex_t held = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t cmu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
/* taken: times the helper has taken `held` (a flag it clears again after
 * 24 ms could be missed by a main thread that does not run for that long,
 * which then waited for the next time, forever). */
static atomic_int taken, signalled;
volatile unsigned long sink;

static void ms_sleep(int ms)
{
	struct timespec ts = {0, ms * 1000000L};
	nanosleep(&ts, NULL);
}

static void *helper(void *arg)
{
	char c;
	(void)arg;
	while (read(ask[0], &c, 1) == 1) {
		if (c == 'r') {
			ms_sleep(18);
			if (write(answer[1], &c, 1) != 1)
				break;
		} else if (c == 'm') {
			pthread_mutex_lock(&held);
			atomic_fetch_add(&taken, 1);
			ms_sleep(24);
			pthread_mutex_unlock(&held);
		} else if (c == 'c') {
			ms_sleep(30);
			pthread_mutex_lock(&cmu);
			atomic_store(&signalled, 1);
			pthread_cond_signal(&cv);
			pthread_mutex_unlock(&cmu);
		}
	}
	return NULL;
}

static void tell(char c)
{
	if (write(ask[1], &c, 1) != 1)
		exit(1);
}

__attribute__((noinline)) void in_usleep(void)
{
	usleep(6000);
	sink++;
}
__attribute__((noinline)) void in_poll(void)
{
	poll(NULL, 0, 12);
	sink++;
}

__attribute__((noinline)) void in_read(void)
{
	char c;
	tell('r');
	if (read(answer[0], &c, 1) != 1)
		exit(1);
	sink++;
}

__attribute__((noinline)) void in_mutex(void)
{
	int before = atomic_load(&taken);
	tell('m');
	/* The helper takes it within microseconds; yielding lets the helper
	 * run on this CPU when both run under SCHED_FIFO. */
	while (atomic_load(&taken) == before)
		sched_yield();
	pthread_mutex_lock(&held);
	pthread_mutex_unlock(&held);
	sink++;
}

__attribute__((noinline)) void in_cond(void)
{
	pthread_mutex_lock(&cmu);
	atomic_store(&signalled, 0);
	tell('c');
	while (!atomic_load(&signalled))
		pthread_cond_wait(&cv, &cmu);
	pthread_mutex_unlock(&cmu);
	sink++;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 10;
	pthread_t t;
	if (pipe(ask) || pipe(answer) || pthread_create(&t, NULL, helper, NULL))
		return 1;
	double end = now() + secs;
	while (now() < end) {
		in_usleep();
		in_poll();
		in_read();
		in_mutex();
		in_cond();
	}
	return 0;
}
