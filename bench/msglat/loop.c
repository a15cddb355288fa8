/* Tight loops for bench/msglat/run, each printing ns per iteration:
 *   loop getppid N | write N     (a process msglat does not trace)
 *   loop tcp N [WAIT_S]          64-byte write on one end of a loopback TCP
 *                                connection, read of it on the other: one
 *                                message through the process (ids all 0, so
 *                                each write pairs with the read before it);
 *                                WAIT_S seconds between connecting and the
 *                                loop, for sonde to attach. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc < 3)
		return 2;
	long n = atol(argv[2]);
	char buf[64] = {0};
	double t0 = now();
	if (!strcmp(argv[1], "getppid")) {
		for (long i = 0; i < n; i++)
			syscall(SYS_getppid);
	} else if (!strcmp(argv[1], "write")) {
		int fd = open("/dev/null", O_WRONLY);
		for (long i = 0; i < n; i++)
			if (write(fd, buf, sizeof(buf)) < 0)
				return 1;
	} else {
		struct sockaddr_in a = {.sin_family = AF_INET,
		                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t al = sizeof(a);
		int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		if (bind(l, (void *)&a, al) || listen(l, 1) || getsockname(l, (void *)&a, &al))
			return 1;
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(c, (void *)&a, al))
			return 1;
		int d = accept(l, NULL, NULL);
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (argc > 3)
			sleep(atoi(argv[3]));
		t0 = now();
		for (long i = 0; i < n; i++)
			if (write(c, buf, sizeof(buf)) != sizeof(buf) ||
			    read(d, buf, sizeof(buf)) != sizeof(buf))
				return 1;
	}
	printf("%.1f\n", (now() - t0) / n);
	return 0;
}
