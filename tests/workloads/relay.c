/*
 * A relay that reuses its listener's descriptor for its onward connections
 * (msglat's flows must follow the socket, not the descriptor number).
 *
 *   relay IN_PORT OUT_PORT MESSAGES ROUNDS
 *
 * The relay listens on 0.0.0.0:IN_PORT and prints
 *   "listening fd=L addr=0.0.0.0:IN_PORT"
 * then waits for a line on stdin (the tracer is attached). A client child
 * connects to 127.0.0.1:IN_PORT; the relay accepts it, closes its listener
 * and connects onward to a server child on 127.0.0.1:OUT_PORT: the kernel
 * gives the new socket the lowest free descriptor, the listener's old one
 * (checked: exit 1 if not). It prints
 *   "inbound fd=I local=A:P remote=A:P"
 *   "onward round=R fd=L local=A:P remote=A:P"
 * and relays MESSAGES messages: each 16 bytes, a u64 id at offset 0 (unique
 * over the run), from the client through the relay to the server, which
 * sends it back through the relay to the client (flows I -> L and L -> I).
 * ROUNDS times: each round but the first closes the onward connection and
 * opens another on the same descriptor. Then it prints "done" and holds its
 * sockets open until stdin ends (the tracer reads their ends first).
 * Processes: the relay (traced) and its two children (not traced).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <signal.h>
#include <unistd.h>

#define MSG 16

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct sockaddr_in addr(uint32_t host, int port)
{
	struct sockaddr_in a = {
	        .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(host)};
	return a;
}

static int listen_on(uint32_t host, int port)
{
	struct sockaddr_in a = addr(host, port);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (l < 0 || bind(l, (void *)&a, sizeof(a)) || listen(l, 4))
		die("listen");
	return l;
}

/* Connects to 127.0.0.1:port, retrying while nothing listens yet. */
static int connect_to(int port)
{
	struct sockaddr_in a = addr(INADDR_LOOPBACK, port);
	for (int i = 0; i < 500; i++) {
		int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		if (s < 0)
			die("socket");
		if (!connect(s, (void *)&a, sizeof(a))) {
			setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			return s;
		}
		close(s);
		usleep(10000);
	}
	die("connect");
	return -1;
}

static void full(int fd, void *buf, int write_it)
{
	char *p = buf;
	for (int n = 0; n < MSG;) {
		int r = write_it ? write(fd, p + n, MSG - n) : read(fd, p + n, MSG - n);
		if (r <= 0)
			die(write_it ? "write" : "read");
		n += r;
	}
}

/* "A:P" of a socket's local (peer = 0) or remote end. */
static const char *ends(int fd, int peer, char *out)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	if ((peer ? getpeername(fd, (void *)&a, &len) : getsockname(fd, (void *)&a, &len)))
		die("getsockname");
	char ip[INET_ADDRSTRLEN];
	inet_ntop(AF_INET, &a.sin_addr, ip, sizeof(ip));
	sprintf(out, "%s:%d", ip, ntohs(a.sin_port));
	return out;
}

/* The server child: ROUNDS connections in turn, each message sent back. */
static void server(int port, int rounds)
{
	int l = listen_on(INADDR_LOOPBACK, port);
	for (int r = 0; r < rounds; r++) {
		int c = accept(l, NULL, NULL), one = 1;
		if (c < 0)
			die("accept");
		setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		char buf[MSG];
		for (;;) {
			int n = read(c, buf, MSG);
			if (n == 0)
				break;
			if (n < 0)
				die("server read");
			if (write(c, buf, n) != n)
				die("server write");
		}
		close(c);
	}
	exit(0);
}

/* The client child: messages one at a time, each waiting for its return. */
static void client(int port, long total)
{
	int s = connect_to(port);
	char buf[MSG] = {0};
	for (uint64_t id = 1; id <= (uint64_t)total; id++) {
		memcpy(buf, &id, 8);
		full(s, buf, 1);
		full(s, buf, 0);
		uint64_t got;
		memcpy(&got, buf, 8);
		if (got != id)
			die("client: wrong id back");
	}
	/* Hold the connection until the relay exits. */
	while (read(s, buf, MSG) > 0)
		;
	exit(0);
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: relay IN_PORT OUT_PORT MESSAGES ROUNDS\n");
		return 2;
	}
	int in_port = atoi(argv[1]), out_port = atoi(argv[2]);
	long msgs = atol(argv[3]);
	int rounds = atoi(argv[4]);
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* The children: not traced, and gone with the relay. */
	pid_t srv = fork();
	if (srv == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		server(out_port, rounds);
	}
	int l = listen_on(INADDR_ANY, in_port);
	printf("listening fd=%d addr=0.0.0.0:%d\n", l, in_port);
	char line[64];
	if (!fgets(line, sizeof(line), stdin))
		die("stdin");
	pid_t cli = fork();
	if (cli == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		close(l);
		client(in_port, msgs * rounds);
	}
	int in = accept(l, NULL, NULL), one = 1;
	if (in < 0)
		die("accept");
	setsockopt(in, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	close(l);
	char a[64], b[64];
	printf("inbound fd=%d local=%s remote=%s\n", in, ends(in, 0, a), ends(in, 1, b));
	char buf[MSG];
	for (int r = 1; r <= rounds; r++) {
		int out = connect_to(out_port);
		if (out != l) {
			fprintf(stderr, "onward fd %d, not the listener's old fd %d\n", out, l);
			return 1;
		}
		printf("onward round=%d fd=%d local=%s remote=%s\n", r, out, ends(out, 0, a),
		       ends(out, 1, b));
		for (long i = 0; i < msgs; i++) {
			full(in, buf, 0);
			full(out, buf, 1);
			full(out, buf, 0);
			full(in, buf, 1);
		}
		if (r < rounds)
			close(out);
	}
	printf("done\n");
	while (fgets(line, sizeof(line), stdin))
		;
	kill(cli, SIGKILL);
	kill(srv, SIGKILL);
	waitpid(cli, NULL, 0);
	waitpid(srv, NULL, 0);
	return 0;
}
