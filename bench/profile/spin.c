/* CPU-bound throughput for bench/profile/run: spins for argv[1] seconds
 * (wall clock) and prints how many loop iterations it managed. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

volatile unsigned long sink;

int main(int argc, char **argv)
{
	double end = now() + atof(argv[1]);
	unsigned long n = 0;
	while (now() < end) {
		for (int i = 0; i < 10000; i++)
			sink += i;
		n++;
	}
	printf("%lu\n", n);
	return 0;
}
