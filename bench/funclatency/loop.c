/* Tight loops for bench/funclatency/run: argv[1] "func" calls target()
 * argv[2] times, "syscall" calls getppid() argv[2] times; prints the
 * wall-clock ns per call. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

__attribute__((noinline)) int target(int x)
{
	__asm__ volatile("" ::: "memory");
	return x + 1;
}

int main(int argc, char **argv)
{
	long n = argc > 2 ? atol(argv[2]) : 1000000;
	int sys = argc > 1 && !strcmp(argv[1], "syscall");
	struct timespec a, b;
	clock_gettime(CLOCK_MONOTONIC, &a);
	int x = 0;
	for (long i = 0; i < n; i++)
		x = sys ? (int)syscall(SYS_getppid) + x : target(x);
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n + 0 * x);
	return 0;
}
