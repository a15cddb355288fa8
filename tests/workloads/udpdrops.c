/*
 * UDP drops whose count the kernel keeps, on loopback, for `sonde drops`
 * where there is neither python nor nft (the VM guests):
 *
 *   udpdrops N
 *
 * For IPv4 and, where the kernel has it, IPv6: N datagrams to a port no
 * socket is bound to (UdpNoPorts), then N to a socket with the smallest
 * receive buffer that never reads (UdpRcvbufErrors for all but the few the
 * buffer holds). Prints what it sent per family.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* A UDP socket bound to the loopback address of `fam` on an ephemeral
 * port; its address in *ss. -1 if the family is missing. */
static int bound(int fam, struct sockaddr_storage *ss, socklen_t *len)
{
	int fd = socket(fam, SOCK_DGRAM, 0);
	if (fd < 0)
		return -1;
	memset(ss, 0, sizeof(*ss));
	if (fam == AF_INET) {
		struct sockaddr_in *a = (struct sockaddr_in *)ss;
		a->sin_family = AF_INET;
		a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		*len = sizeof(*a);
	} else {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_loopback;
		*len = sizeof(*a);
	}
	if (bind(fd, (struct sockaddr *)ss, *len) || getsockname(fd, (struct sockaddr *)ss, len)) {
		close(fd);
		return -1;
	}
	return fd;
}

static void blast(int fd, const struct sockaddr_storage *to, socklen_t len, int n)
{
	char buf[1000];
	memset(buf, 'x', sizeof(buf));
	for (int i = 0; i < n; i++)
		sendto(fd, buf, sizeof(buf), 0, (const struct sockaddr *)to, len);
}

int main(int argc, char **argv)
{
	if (argc != 2 || atoi(argv[1]) <= 0) {
		fprintf(stderr, "usage: udpdrops N\n");
		return 2;
	}
	int n = atoi(argv[1]);
	int fams[] = {AF_INET, AF_INET6};
	for (int f = 0; f < 2; f++) {
		struct sockaddr_storage from, closed, full;
		socklen_t fl, cl, ul;
		int tx = bound(fams[f], &from, &fl);
		if (tx < 0) {
			printf("IPv%d: no loopback\n", fams[f] == AF_INET ? 4 : 6);
			continue;
		}
		/* A port that was just free: bound, then closed. */
		int c = bound(fams[f], &closed, &cl);
		close(c);
		blast(tx, &closed, cl, n);
		int rx = bound(fams[f], &full, &ul);
		int one = 1;
		setsockopt(rx, SOL_SOCKET, SO_RCVBUF, &one, sizeof(one));
		blast(tx, &full, ul, n);
		printf("IPv%d: %d to a closed port, %d to a full socket\n",
		       fams[f] == AF_INET ? 4 : 6, n, n);
		close(rx);
		close(tx);
	}
	return 0;
}
