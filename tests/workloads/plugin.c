/* A library edges.c dlopen()s after it started (build with -shared -fPIC). */
#include <time.h>

volatile unsigned long plugin_sink;

__attribute__((noinline)) static void plugin_work(void)
{
	for (int i = 0; i < 100000; i++)
		plugin_sink = plugin_sink * 31 + i;
}

void plugin_spin(double end)
{
	struct timespec ts;
	double t = 0;
	while (t < end) {
		plugin_work();
		clock_gettime(CLOCK_MONOTONIC, &ts);
		t = ts.tv_sec + ts.tv_nsec / 1e9;
	}
	plugin_sink++;
}
