/* Context-switch-heavy ping-pong for bench/offcpu/run: two processes pass a
 * byte back and forth through two pipes for argv[1] seconds; prints round
 * trips. Both run on CPU argv[2] (default 0: every hop is a switch from one
 * to the other), or the child on CPU argv[3] when given (every hop wakes a
 * CPU that idles meanwhile: two switches per hop). argv[4]: microseconds of
 * CPU work per hop before answering (default 0), for a lower switch rate. */
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
	double work = argc > 4 ? atof(argv[4]) / 1e6 : 0;
	pid_t child = fork();
	char c = 0;
	if (child == 0) {
		if (argc > 3) {
			CPU_ZERO(&set);
			CPU_SET(atoi(argv[3]), &set);
			sched_setaffinity(0, sizeof(set), &set);
		}
		while (read(a[0], &c, 1) == 1) {
			for (double t = work > 0 ? now() + work : 0; now() < t;)
				;
			if (write(b[1], &c, 1) != 1)
				break;
		}
		_exit(0);
	}
	unsigned long n = 0;
	double end = now() + secs;
	while (now() < end) {
		if (write(a[1], &c, 1) != 1 || read(b[0], &c, 1) != 1)
			break;
		for (double t = work > 0 ? now() + work : 0; now() < t;)
			;
		n++;
	}
	kill(child, SIGKILL);
	printf("%lu\n", n);
	return 0;
}
