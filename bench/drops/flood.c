/*
 * A flood of drops for bench/drops/run: UDP datagrams to a loopback port
 * no socket is bound to, in batches of 64 (sendmmsg), for SECONDS seconds.
 *
 *   flood PORT SECONDS
 *
 * Each datagram is dropped by the receiving path (NO_SOCKET, UdpNoPorts);
 * the ICMP errors back are rate-limited by the kernel.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define BATCH 64

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: flood PORT SECONDS\n");
		return 2;
	}
	struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1]))};
	to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	if (fd < 0) {
		perror("socket");
		return 1;
	}
	char payload[16] = "sonde-bench";
	struct iovec iov = {.iov_base = payload, .iov_len = sizeof(payload)};
	struct mmsghdr m[BATCH];
	memset(m, 0, sizeof(m));
	for (int i = 0; i < BATCH; i++) {
		m[i].msg_hdr.msg_name = &to;
		m[i].msg_hdr.msg_namelen = sizeof(to);
		m[i].msg_hdr.msg_iov = &iov;
		m[i].msg_hdr.msg_iovlen = 1;
	}
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	double end = atof(argv[2]);
	for (unsigned long n = 0;; n++) {
		sendmmsg(fd, m, BATCH, 0);
		if (n % 64 == 0) {
			clock_gettime(CLOCK_MONOTONIC, &t);
			if (t.tv_sec - t0.tv_sec + (t.tv_nsec - t0.tv_nsec) / 1e9 > end)
				break;
		}
	}
	return 0;
}
