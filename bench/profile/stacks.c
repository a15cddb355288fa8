/* Many unique stacks for bench/profile/run: a random walk through 16
 * functions, 4 levels deep (65,536 possible stacks), for argv[1] seconds.
 * Built with frame pointers. */
#include <stdlib.h>
#include <time.h>

volatile unsigned long sink;
static double end_at;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

typedef void (*fn)(int);
static fn table[16];

#define F(n)                                                                                       \
	__attribute__((noinline)) static void f##n(int depth)                                      \
	{                                                                                          \
		if (depth == 0) {                                                                  \
			for (int i = 0; i < 20000; i++)                                            \
				sink += i;                                                         \
			return;                                                                    \
		}                                                                                  \
		table[rand() & 15](depth - 1);                                                     \
		sink++;                                                                            \
	}
F(0);
F(1);
F(2);
F(3);
F(4);
F(5);
F(6);
F(7);
F(8);
F(9);
F(10);
F(11);
F(12);
F(13);
F(14);
F(15);

int main(int argc, char **argv)
{
	fn t[16] = {f0, f1, f2, f3, f4, f5, f6, f7, f8, f9, f10, f11, f12, f13, f14, f15};
	for (int i = 0; i < 16; i++)
		table[i] = t[i];
	end_at = now() + atof(argv[1]);
	while (now() < end_at)
		table[rand() & 15](3);
	return 0;
}
