/* Clock helpers shared by the workloads (now() in calltree.c, libcblock.c,
 * edges.c, selfcheck.c; spin() in the latency ones, lat.c and slowfn.c): spin()
 * burns wall-clock time, so a call lasts its time plus little. */
#ifndef SONDE_WORKLOAD_SPIN_H
#define SONDE_WORKLOAD_SPIN_H
#include <time.h>

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline, unused)) static void spin(double sec)
{
	double end = now() + sec;
	while (now() < end)
		;
}
#endif
