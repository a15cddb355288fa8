/*
 * A workload with a built-in blocking pattern for `sonde offcpu`/`wakeup`
 * tests: thread "sleeper" sleeps 20 ms in sleep_long() and 10 ms in
 * sleep_short() per loop (off-CPU split 2:1); thread "reader" blocks in
 * reader_wait() on a pipe that thread "writer" writes from writer_tick()
 * every 5 ms. Syscalls are issued inline so the blocking function is the
 * leaf of the user stack (a frame-pointer walk from inside libc would skip
 * the function that called it). Runs argv[1] seconds. Build with
 *   cc -O2 -g -fno-omit-frame-pointer -fno-optimize-sibling-calls -fno-inline -pthread
 */
#include <pthread.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static long sys3(long n, long a, long b, long c)
{
	long ret;
	__asm__ volatile("syscall"
	                 : "=a"(ret)
	                 : "a"(n), "D"(a), "S"(b), "d"(c)
	                 : "rcx", "r11", "memory");
	return ret;
}

static int fds[2];
static volatile int done;

__attribute__((noinline)) void sleep_long(void)
{
	struct timespec ts = {0, 20 * 1000 * 1000};
	sys3(SYS_nanosleep, (long)&ts, 0, 0);
}

__attribute__((noinline)) void sleep_short(void)
{
	struct timespec ts = {0, 10 * 1000 * 1000};
	sys3(SYS_nanosleep, (long)&ts, 0, 0);
}

__attribute__((noinline)) static void *sleeper_main(void *arg)
{
	prctl(PR_SET_NAME, "sleeper");
	while (!done) {
		sleep_long();
		sleep_short();
	}
	return arg;
}

/* With argv[2] == "tiny": a thread that blocks ~300 us at a time, thousands
 * of times a second (offcpu samples blocks under 1 ms). */
__attribute__((noinline)) void sleep_tiny(void)
{
	struct timespec ts = {0, 300 * 1000};
	sys3(SYS_nanosleep, (long)&ts, 0, 0);
}

__attribute__((noinline)) static void *ticker_main(void *arg)
{
	prctl(PR_SET_NAME, "ticker");
	prctl(PR_SET_TIMERSLACK, 1);
	while (!done)
		sleep_tiny();
	return arg;
}

__attribute__((noinline)) void reader_wait(void)
{
	char c;
	sys3(SYS_read, fds[0], (long)&c, 1);
}

__attribute__((noinline)) static void *reader_main(void *arg)
{
	prctl(PR_SET_NAME, "reader");
	while (!done)
		reader_wait();
	return arg;
}

__attribute__((noinline)) void writer_tick(void)
{
	char c = 'x';
	sys3(SYS_write, fds[1], (long)&c, 1);
}

__attribute__((noinline)) static void *writer_main(void *arg)
{
	prctl(PR_SET_NAME, "writer");
	struct timespec ts = {0, 5 * 1000 * 1000};
	while (!done) {
		nanosleep(&ts, NULL);
		writer_tick();
	}
	return arg;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 10;
	if (pipe(fds))
		return 1;
	pthread_t t[4];
	int n = 3;
	pthread_create(&t[0], NULL, sleeper_main, NULL);
	pthread_create(&t[1], NULL, reader_main, NULL);
	pthread_create(&t[2], NULL, writer_main, NULL);
	if (argc > 2 && argv[2][0] == 't')
		pthread_create(&t[n++], NULL, ticker_main, NULL);
	struct timespec end = {(time_t)secs, (long)((secs - (time_t)secs) * 1e9)};
	nanosleep(&end, NULL);
	done = 1;
	writer_tick(); /* release the reader */
	for (int i = 0; i < n; i++)
		pthread_join(t[i], NULL);
	return 0;
}
