/*
 * A JIT in miniature for `sonde profile` tests: copies a spinning loop into
 * an anonymous executable page, names it in /tmp/perf-PID.map as perf's JIT
 * interface does, and runs it until killed. With --print it writes no map
 * but prints "START SIZE" (hex) of its code on stdout, for tests that plant
 * the map themselves.
 */
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	/* loop: pause; jmp loop */
	static const unsigned char code[] = {0xf3, 0x90, 0xeb, 0xfc};
	unsigned char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
	                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	memcpy(p, code, sizeof(code));
	if (argc > 1 && strcmp(argv[1], "--print") == 0) {
		printf("%lx %zx\n", (unsigned long)p, sizeof(code));
		fflush(stdout);
		((void (*)(void))p)();
		return 0;
	}
	char path[64];
	snprintf(path, sizeof(path), "/tmp/perf-%d.map", getpid());
	FILE *f = fopen(path, "w");
	if (!f)
		return 1;
	fprintf(f, "%lx %zx jitted_spin\n", (unsigned long)p, sizeof(code));
	fclose(f);
	((void (*)(void))p)();
	return 0;
}
