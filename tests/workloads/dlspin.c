/*
 * dlspin SECONDS LIB...: loads each library with dlopen and calls its
 * spin_in_lib() for 20 ms in turn until SECONDS have passed (for the
 * hostile-ELF test: the libraries are crafted copies of spinlib.c).
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: dlspin SECONDS LIB...\n");
		return 2;
	}
	int n = argc - 2;
	void (*fn[16])(double);
	for (int i = 0; i < n && i < 16; i++) {
		void *h = dlopen(argv[i + 2], RTLD_NOW | RTLD_LOCAL);
		if (!h || !(fn[i] = (void (*)(double))dlsym(h, "spin_in_lib"))) {
			fprintf(stderr, "dlspin: %s: %s\n", argv[i + 2], dlerror());
			return 1;
		}
	}
	printf("ready\n");
	fflush(stdout);
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	double end = t.tv_sec + t.tv_nsec / 1e9 + atof(argv[1]);
	for (;;) {
		for (int i = 0; i < n && i < 16; i++)
			fn[i](0.02);
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec + t.tv_nsec / 1e9 >= end)
			return 0;
	}
}
