/*
 * Responses after idle gaps on one loopback connection (seed 002), for the
 * VM test of `sonde cwnd`: a server answers each 1-byte request with SIZE
 * bytes; a client sends COUNT requests, GAP_MS apart, and reads each
 * response whole. Before writing each response the server prints the
 * socket's cwnd from TCP_INFO (the value `ss -ti` shows), an oracle for
 * sonde's cwnd_before:
 *
 *   bursts PORT CC COUNT GAP_MS SIZE   ->  "response I cwnd N" lines
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

int main(int argc, char **argv)
{
	if (argc != 6) {
		fprintf(stderr, "usage: bursts PORT CC COUNT GAP_MS SIZE\n");
		return 2;
	}
	int port = atoi(argv[1]), count = atoi(argv[3]), gap_ms = atoi(argv[4]);
	size_t size = strtoul(argv[5], NULL, 10);
	const char *cc = argv[2];
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons(port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (void *)&a, sizeof(a)) || listen(l, 1))
		die("listen");
	char *buf = malloc(size);
	memset(buf, 'r', size);
	pid_t child = fork();
	if (child == 0) {
		int c = socket(AF_INET, SOCK_STREAM, 0);
		if (connect(c, (void *)&a, sizeof(a)))
			die("connect");
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		for (int i = 0; i < count; i++) {
			if (i)
				usleep(gap_ms * 1000);
			if (write(c, "q", 1) != 1)
				die("request");
			size_t got = 0;
			while (got < size) {
				ssize_t n = read(c, buf, size - got);
				if (n <= 0)
					die("response");
				got += n;
			}
		}
		close(c);
		_exit(0);
	}
	int s = accept(l, NULL, NULL);
	if (s < 0)
		die("accept");
	if (setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, strlen(cc)))
		die("TCP_CONGESTION");
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	char q;
	for (int i = 0; read(s, &q, 1) == 1; i++) {
		struct tcp_info ti;
		socklen_t len = sizeof(ti);
		if (getsockopt(s, IPPROTO_TCP, TCP_INFO, &ti, &len))
			die("TCP_INFO");
		printf("response %d cwnd %u\n", i, ti.tcpi_snd_cwnd);
		fflush(stdout);
		size_t put = 0;
		while (put < size) {
			ssize_t n = write(s, buf + put, size - put);
			if (n <= 0)
				die("write");
			put += n;
		}
	}
	waitpid(child, NULL, 0);
	return 0;
}
