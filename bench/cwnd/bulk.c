// One TCP bulk transfer over loopback for SECONDS: a receiver child reads
// and discards, the sender writes 256 KiB chunks as fast as it can. Prints
// the sender's throughput in MB/s. Run inside a network namespace.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
	double secs = argc > 1 ? atof(argv[1]) : 3;
	int port = argc > 2 ? atoi(argv[2]) : 7300;
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons(port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (void *)&a, sizeof(a)) || listen(l, 1)) {
		perror("listen");
		return 1;
	}
	pid_t child = fork();
	if (child == 0) {
		int c = accept(l, NULL, NULL);
		static char buf[1 << 18];
		while (read(c, buf, sizeof(buf)) > 0)
			;
		_exit(0);
	}
	int s = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(s, (void *)&a, sizeof(a))) {
		perror("connect");
		return 1;
	}
	static char chunk[1 << 18];
	memset(chunk, 'x', sizeof(chunk));
	double t0 = now(), t;
	unsigned long long sent = 0;
	while ((t = now()) - t0 < secs) {
		ssize_t n = write(s, chunk, sizeof(chunk));
		if (n <= 0)
			return 1;
		sent += n;
	}
	close(s);
	waitpid(child, NULL, 0);
	printf("%.1f\n", sent / (t - t0) / 1e6);
	return 0;
}
