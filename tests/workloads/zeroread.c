/*
 * zeroread N MiB: N readv() calls of MiB MiB each from /dev/zero, for the
 * vmtest checks of kernel-function probes: each call is one call of
 * read_iter_zero (readv goes by the file's read_iter, on every kernel and
 * architecture, where read() may take read_zero), spent clearing memory on
 * CPU.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/uio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: zeroread CALLS MIB\n");
		return 2;
	}
	int n = atoi(argv[1]);
	size_t len = (size_t)atoi(argv[2]) << 20;
	char *buf = malloc(len);
	int fd = open("/dev/zero", O_RDONLY);
	if (!buf || fd < 0) {
		perror("zeroread");
		return 1;
	}
	for (int i = 0; i < n; i++) {
		struct iovec v = {.iov_base = buf, .iov_len = len};
		if (readv(fd, &v, 1) != (ssize_t)len) {
			perror("readv");
			return 1;
		}
	}
	return 0;
}
