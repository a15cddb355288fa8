/*
 * A JIT in miniature for `sonde profile` tests: copies a spinning loop into
 * an anonymous executable page, names it in /tmp/perf-PID.map as perf's JIT
 * interface does, and runs it until killed. With --print it writes no map
 * but prints "START SIZE" (hex) of its code on stdout, for tests that plant
 * the map themselves. With --jitdump it names the code in a jitdump file
 * instead (/tmp/jit-PID.dump, mapped executable as perf's JIT interface
 * wants): a code load of it at a decoy address, then a code move to where
 * it runs. With --late SECS it runs code it never names for half a
 * second, then makes its map and compiles twice, as a JIT does: code it
 * names in its map at once and runs for SECS seconds, then code it names
 * (appending to the map) and runs SECS seconds more, then it exits. The
 * pages are all mapped at the start, so the second naming is no new
 * mapping.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static void put(FILE *f, const void *p, size_t n)
{
	fwrite(p, 1, n, f);
}

static int jitdump(unsigned char *code, size_t size)
{
	char path[64];
	snprintf(path, sizeof(path), "/tmp/jit-%d.dump", getpid());
	FILE *f = fopen(path, "w+");
	if (!f)
		return 1;
	uint32_t head[6] = {0x4A695444, 1, 40, 62 /* EM_X86_64 */, 0, (uint32_t)getpid()};
	uint64_t ts = 0, flags = 0;
	put(f, head, sizeof(head));
	put(f, &ts, 8);
	put(f, &flags, 8);
	static const char name[] = "jitted_dump_spin";
	uint64_t decoy = 0x1000;
	/* JIT_CODE_LOAD: id, total size, timestamp; pid, tid, vma, code address, size, index, name, code */
	uint32_t rec[2] = {0, (uint32_t)(16 + 40 + sizeof(name) + size)};
	uint32_t ids[2] = {(uint32_t)getpid(), (uint32_t)getpid()};
	uint64_t load[4] = {decoy, decoy, size, 1};
	put(f, rec, 8);
	put(f, &ts, 8);
	put(f, ids, 8);
	put(f, load, sizeof(load));
	put(f, name, sizeof(name));
	put(f, code, size);
	/* JIT_CODE_MOVE: pid, tid, vma, old address, new address, size, index */
	uint32_t mrec[2] = {1, 16 + 48};
	uint64_t move[5] = {(uint64_t)code, decoy, (uint64_t)code, size, 1};
	put(f, mrec, 8);
	put(f, &ts, 8);
	put(f, ids, 8);
	put(f, move, sizeof(move));
	fflush(f);
	return mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fileno(f), 0) == MAP_FAILED;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* Two functions, each its own page, named in the map one after the other. */
static int late(double secs)
{
	/* mov ecx, 0x100000; 1: pause; dec ecx; jnz 1b; ret */
	static const unsigned char code[] = {0xb9, 0x00, 0x00, 0x10, 0x00, 0xf3,
	                                     0x90, 0xff, 0xc9, 0x75, 0xfa, 0xc3};
	unsigned char *p = mmap(NULL, 3 * 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
	                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return 1;
	for (int i = 0; i < 3; i++)
		memcpy(p + 4096 * i, code, sizeof(code));
	for (double end = now_s() + 0.5; now_s() < end;)
		((void (*)(void))(p + 8192))();
	char path[64];
	snprintf(path, sizeof(path), "/tmp/perf-%d.map", getpid());
	FILE *f = fopen(path, "w");
	if (!f)
		return 1;
	const char *names[2] = {"jitted_early", "jitted_late"};
	for (int i = 0; i < 2; i++) {
		unsigned char *fn = p + 4096 * i;
		fprintf(f, "%lx %zx %s\n", (unsigned long)fn, sizeof(code), names[i]);
		fflush(f);
		for (double end = now_s() + secs; now_s() < end;)
			((void (*)(void))fn)();
	}
	fclose(f);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc > 2 && strcmp(argv[1], "--late") == 0)
		return late(atof(argv[2]));
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
	if (argc > 1 && strcmp(argv[1], "--jitdump") == 0) {
		if (jitdump(p, sizeof(code)))
			return 1;
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
