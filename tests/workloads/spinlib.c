/*
 * A shared library whose one function burns CPU, for the hostile-ELF test:
 * copies of it with crafted unwind tables, DWARF and section headers are
 * loaded by dlspin.c (the loader reads none of those, so the code runs).
 */
#include <time.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

volatile unsigned long spin_sink;

__attribute__((noinline)) void spin_in_lib(double secs)
{
	double end = now() + secs;
	while (now() < end)
		for (int i = 0; i < 10000; i++)
			spin_sink += i;
}
