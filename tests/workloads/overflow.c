/*
 * Retransmissions on loopback without a packet filter, from a listener that
 * never accepts (for kernels or machines without nftables, e.g. the VM test):
 *
 *   listener: backlog 0 (its accept queue holds one connection) and
 *             TCP_DEFER_ACCEPT (it keeps a handshake that sent no data as a
 *             request socket, and retransmits its SYN-ACK on the timer);
 *   B connects and stays silent      -> SYN-ACK retransmits to B;
 *   A connects and sends             -> A's child fills the accept queue;
 *   B sends                          -> dropped (queue full): B's data goes
 *                                       out again on every RTO;
 *   C connects                       -> its SYN is dropped: SYN retransmits.
 *
 * At the end every socket is closed with an RST (SO_LINGER 0) and the
 * listener is closed, so nothing retransmits afterwards.
 *
 *   overflow PORT SECONDS
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct sockaddr_in addr(int port)
{
	struct sockaddr_in a;
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons(port);
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	return a;
}

static void nap_ms(long ms)
{
	struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&t, NULL);
}

/* A client socket; connect() returns once the handshake is done from its side,
 * or (nonblocking) at once when the SYN is dropped. */
static int client(int port, int block)
{
	int s = socket(AF_INET, SOCK_STREAM | (block ? 0 : SOCK_NONBLOCK), 0);
	if (s < 0)
		die("socket");
	struct sockaddr_in a = addr(port);
	if (connect(s, (struct sockaddr *)&a, sizeof(a)) && errno != EINPROGRESS)
		die("connect");
	return s;
}

/* Waits up to `ms` for a nonblocking connect to finish; whether it did.
 * Kernels before 5.11 (or so) count the deferred request of B against a
 * backlog of 0 and drop A's SYN: A then never connects, and a blocking
 * connect would wait out every SYN retry (about two minutes). */
static int connected_within(int s, int ms)
{
	struct pollfd p = {.fd = s, .events = POLLOUT};
	int err = 0;
	socklen_t len = sizeof(err);
	if (poll(&p, 1, ms) != 1 || getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &len) || err)
		return 0;
	return 1;
}

static void reset_close(int s)
{
	struct linger l = {1, 0};
	setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	close(s);
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: overflow PORT SECONDS\n");
		return 2;
	}
	int port = atoi(argv[1]);
	int secs = atoi(argv[2]);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1, defer = 1; /* seconds: SYN-ACKs resent from the first timeout */
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (setsockopt(l, IPPROTO_TCP, TCP_DEFER_ACCEPT, &defer, sizeof(defer)))
		die("TCP_DEFER_ACCEPT");
	struct sockaddr_in a = addr(port);
	if (bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 0))
		die("listen");

	char buf[1000];
	memset(buf, 'x', sizeof(buf));
	int b = client(port, 1);
	nap_ms(50);
	int c_a = client(port, 0);
	if (connected_within(c_a, 3000) && write(c_a, buf, 100) != 100)
		die("write A");
	nap_ms(50);
	if (write(b, buf, sizeof(buf)) != sizeof(buf))
		die("write B");
	nap_ms(50);
	int c = client(port, 0);
	printf("overflow: listener on %d, clients A B C connected; holding %d s\n", port, secs);
	fflush(stdout);
	sleep(secs);
	reset_close(b);
	reset_close(c_a);
	reset_close(c);
	close(l);
	return 0;
}
