/* Context-switch-heavy ping-pong for bench/offcpu/run: two processes pinned
 * to one CPU pass a byte back and forth through two pipes for argv[1]
 * seconds; prints round trips (each is two context switches). */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double secs = atof(argv[1]);
	int cpu = argc > 2 ? atoi(argv[2]) : 0;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	sched_setaffinity(0, sizeof(set), &set);
	int a[2], b[2];
	if (pipe(a) || pipe(b))
		return 1;
	pid_t child = fork();
	char c = 0;
	if (child == 0) {
		while (read(a[0], &c, 1) == 1)
			if (write(b[1], &c, 1) != 1)
				break;
		_exit(0);
	}
	unsigned long n = 0;
	double end = now() + secs;
	while (now() < end) {
		if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1)
			break;
		n++;
	}
	kill(child, SIGKILL);
	printf("%lu\n", n);
	return 0;
}
