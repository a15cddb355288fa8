/*
 * Edge cases for user stack walks, one per mode:
 *   edges signal SECONDS   a SIGPROF handler (every 1 ms of CPU) spins in
 *                          on_signal() while interrupting interrupted()
 *   edges deep SECONDS N   recurse() N deep, then spins in bottom()
 *   edges dlopen SECONDS LIB  after 0.3 s dlopen()s LIB and spins in its
 *                          plugin_spin() called from call_plugin()
 *   edges vdso SECONDS     vdso_loop() reads the clock through the vDSO
 *   edges altsignal SECONDS  as signal, on a thread whose handler runs on an
 *                          alternate stack (sigaltstack) mapped above the
 *                          thread's own stack
 *   edges storm SECONDS    storm() raises SIGUSR1 at itself without pause:
 *                          most of its time is the kernel entering and
 *                          leaving the short handler on_usr1()
 */
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "spin.h" /* now() */

volatile unsigned long sink;

__attribute__((noinline)) void spin_units(unsigned long n)
{
	for (unsigned long i = 0; i < n; i++)
		sink = sink * 31 + i;
}

__attribute__((noinline)) void on_signal(int sig)
{
	spin_units(300000);
	sink += sig;
}

__attribute__((noinline)) void interrupted(double end)
{
	while (now() < end)
		spin_units(100000);
	sink++;
}

__attribute__((noinline)) void bottom(double end)
{
	while (now() < end)
		spin_units(100000);
	sink++;
}

__attribute__((noinline)) int recurse(int n, double end)
{
	int r = n > 0 ? recurse(n - 1, end) : (bottom(end), 0);
	sink += r;
	return r + 1;
}

__attribute__((noinline)) void call_plugin(void (*f)(double), double end)
{
	f(end);
	sink++;
}

__attribute__((noinline)) void vdso_loop(double end)
{
	struct timespec ts;
	double t = 0;
	while (t < end) {
		clock_gettime(CLOCK_MONOTONIC, &ts);
		t = ts.tv_sec + ts.tv_nsec / 1e9;
	}
}

__attribute__((noinline)) void on_usr1(int sig)
{
	for (int i = 0; i < 50; i++)
		sink += (unsigned long)i * sig;
}

__attribute__((noinline)) void storm(double end)
{
	while (now() < end)
		for (int i = 0; i < 1000; i++)
			raise(SIGUSR1);
}

struct alt {
	void *stack;
	double end;
};

/* Takes SIGPROF on the alternate stack; its own stack was mapped after
 * that one, so lies below it. */
static void *alt_thread(void *arg)
{
	struct alt *a = arg;
	char here;
	/* The test is of a handler's stack above the thread's: say so when
	 * the mappings fell the other way. */
	if ((void *)&here > a->stack) {
		fprintf(stderr, "edges: the alternate stack is below the thread's stack\n");
		exit(3);
	}
	stack_t ss = {.ss_sp = a->stack, .ss_size = 1 << 20};
	sigaltstack(&ss, NULL);
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGPROF);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	interrupted(a->end);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	double end = now() + atof(argv[2]);
	if (!strcmp(argv[1], "signal")) {
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_signal;
		sigaction(SIGPROF, &sa, NULL);
		struct itimerval it = {{0, 1000}, {0, 1000}};
		setitimer(ITIMER_PROF, &it, NULL);
		interrupted(end);
	} else if (!strcmp(argv[1], "altsignal")) {
		struct alt a = {mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE,
		                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0),
		                end};
		if (a.stack == MAP_FAILED)
			return 1;
		/* The main thread never takes the signal. */
		sigset_t set;
		sigemptyset(&set);
		sigaddset(&set, SIGPROF);
		pthread_sigmask(SIG_BLOCK, &set, NULL);
		struct sigaction sa;
		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = on_signal;
		sa.sa_flags = SA_ONSTACK;
		sigaction(SIGPROF, &sa, NULL);
		pthread_t t;
		if (pthread_create(&t, NULL, alt_thread, &a))
			return 1;
		struct itimerval it = {{0, 1000}, {0, 1000}};
		setitimer(ITIMER_PROF, &it, NULL);
		pthread_join(t, NULL);
	} else if (!strcmp(argv[1], "deep") && argc > 3) {
		recurse(atoi(argv[3]), end);
	} else if (!strcmp(argv[1], "dlopen") && argc > 3) {
		usleep(300000);
		void *h = dlopen(argv[3], RTLD_NOW);
		void (*f)(double) = h ? (void (*)(double))dlsym(h, "plugin_spin") : NULL;
		if (!f)
			return 1;
		call_plugin(f, end);
	} else if (!strcmp(argv[1], "vdso")) {
		vdso_loop(end);
	} else if (!strcmp(argv[1], "storm")) {
		signal(SIGUSR1, on_usr1);
		storm(end);
	} else {
		return 2;
	}
	return 0;
}
