// For `sonde why`'s test of page faults: `whyfault FILE SECONDS`. A thread
// named "faulter" maps FILE with read-ahead off and touches pages of it at
// random: each an uncached page, a page fault that reads it from the disk
// outside any system call; each round it unmaps FILE and drops its cache.
// The main thread waits for the end.
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static const char *file;
static volatile unsigned long sink;

static void *faulter(void *a)
{
	int fd = open(file, O_RDONLY);
	if (fd < 0) {
		perror(file);
		exit(1);
	}
	size_t len = lseek(fd, 0, SEEK_END);
	unsigned int seed = 2;
	for (;;) {
		volatile const char *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
		if (p == MAP_FAILED || madvise((void *)p, len, MADV_RANDOM)) {
			perror("mmap");
			exit(1);
		}
		for (int i = 0; i < 256; i++)
			sink += p[(size_t)(rand_r(&seed) % (len / 4096)) * 4096];
		munmap((void *)p, len);
		posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
	}
	return a;
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: whyfault FILE SECONDS\n");
		return 2;
	}
	file = argv[1];
	pthread_t t;
	if (pthread_create(&t, NULL, faulter, NULL))
		return 1;
	pthread_setname_np(t, "faulter");
	sleep(atoi(argv[2]));
	return 0;
}
