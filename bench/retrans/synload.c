/* Keeps N sockets in SYN_SENT toward DST (whose SYNs are dropped), reopening
 * each after LIFE ms so the SYN retransmit rate stays steady. Bounded by
 * SECONDS. Usage: synload DST_IP PORT_BASE NPORTS N LIFE_MS SECONDS */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int open_one(struct sockaddr_in *dst)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	connect(fd, (struct sockaddr *)dst, sizeof(*dst));
	return fd;
}

int main(int argc, char **argv)
{
	if (argc != 7) {
		fprintf(stderr, "usage: synload DST PORT_BASE NPORTS N LIFE_MS SECONDS\n");
		return 2;
	}
	int base = atoi(argv[2]), nports = atoi(argv[3]), n = atoi(argv[4]);
	double life = atoi(argv[5]) / 1000.0, secs = atof(argv[6]);
	int *fds = calloc(n, sizeof(int));
	double *born = calloc(n, sizeof(double));
	struct sockaddr_in dst = {.sin_family = AF_INET};
	inet_pton(AF_INET, argv[1], &dst.sin_addr);
	double start = now();
	/* Stagger births over one lifetime so expiries spread evenly. */
	for (int i = 0; i < n; i++) {
		dst.sin_port = htons(base + i % nports);
		fds[i] = open_one(&dst);
		born[i] = start - life * i / n;
	}
	while (now() - start < secs) {
		double t = now();
		for (int i = 0; i < n; i++) {
			if (t - born[i] >= life) {
				close(fds[i]);
				dst.sin_port = htons(base + i % nports);
				fds[i] = open_one(&dst);
				born[i] = t;
			}
		}
		usleep(20000);
	}
	return 0;
}
