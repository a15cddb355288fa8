/*
 * For `sonde slow` tests: handle() is called 20 times a loop for argv[1]
 * seconds; one call in ten comes through via_slow() and spends 5 ms in
 * inner_slow(), the others come through via_fast() and spend 50 us in
 * inner_fast(). With --over 1ms, only the via_slow() calls are slow, and
 * what they do once slow is inner_slow(). Spins on the clock.
 */
#include <stdlib.h>
#include <time.h>
#include "spin.h"

__attribute__((noinline)) void inner_slow(void)
{
	spin(0.005);
}

__attribute__((noinline)) void inner_fast(void)
{
	spin(0.00005);
}

__attribute__((noinline)) void handle(int slow)
{
	if (slow)
		inner_slow();
	else
		inner_fast();
}

__attribute__((noinline)) void via_slow(void)
{
	handle(1);
}

__attribute__((noinline)) void via_fast(void)
{
	handle(0);
}

int main(int argc, char **argv)
{
	double end = now() + (argc > 1 ? atof(argv[1]) : 5);
	struct timespec pause = {0, 2 * 1000 * 1000};
	while (now() < end) {
		for (int i = 0; i < 20; i++) {
			if (i % 10 == 0)
				via_slow();
			else
				via_fast();
		}
		nanosleep(&pause, NULL);
	}
	return 0;
}
