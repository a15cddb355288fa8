/*
 * A workload with a known CPU split for `sonde profile` tests and labs:
 * heavy() burns twice the CPU time of light() (through the inlined
 * light_inner()), both called from main's loop,
 * for the seconds given as argv[1] (default 10). Built with frame pointers
 * for the frame-pointer tests and without for the unwind-table ones:
 *   cc -O2 -g -fno-omit-frame-pointer -fno-inline -o burn burn.c
 * The hot loop is pure computation: the CPU clock is read once per 50,000
 * additions (tens of microseconds), so a host where that system call is slow
 * (half of the samples landed in it on one) does not change the profile.
 * No call is in tail position, so the call tree is the same with or without
 * sibling-call optimisation.
 */
#include <stdlib.h>
#include <time.h>

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

volatile unsigned long sink;

/* Spins for `sec` seconds of this thread's CPU time. */
__attribute__((noinline)) static void spin(double sec)
{
	double end = cpu_now() + sec;
	do {
		for (int i = 0; i < 50000; i++) /* BURN_LOOP */
			sink += i;              /* BURN_LINE */
	} while (cpu_now() < end);
}

__attribute__((noinline)) void heavy(void)
{
	spin(0.020);
	sink++;
}

/* Inlined even with -fno-inline: symbolizers must show it as its own frame. */
static inline __attribute__((always_inline)) void light_inner(void)
{
	spin(0.010);
}

__attribute__((noinline)) void light(void)
{
	light_inner();
	sink++;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 10;
	double end = cpu_now() + secs;
	while (cpu_now() < end) {
		heavy();
		light();
	}
	return 0;
}
