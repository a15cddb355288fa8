/*
 * Seed 004's harness: a sender, a message broker that relays every message,
 * and a receiver, on loopback. The end-to-end time T of each message comes
 * from the sender's and receiver's clocks (they are one process, `pair`), so
 * it includes whatever the broker's tracing costs.
 *
 *   msgbench broker IN_PORT OUT_PORT SIZE [LOG [EVERY DELAY_US [DROP_AT [LOGFILE]]]]
 *       accepts the sender on IN_PORT, connects to the receiver on OUT_PORT
 *       and forwards each SIZE-byte message as it comes. LOG: none, mem
 *       (each receive and send time into an array, as the paper's
 *       "memory" case) or file (a line per receive and send to LOGFILE,
 *       buffered stdio, the paper's "file" case). Every EVERY-th message
 *       (0: none) is held DELAY_US microseconds before it is sent; message
 *       DROP_AT (-1: none) is not forwarded.
 *
 *   msgbench pair BROKER_PORT LISTEN_PORT COUNT SPACING_US SIZE
 *       listens on LISTEN_PORT for the broker, sends COUNT messages to
 *       BROKER_PORT SPACING_US apart (id: u64 at offset 0; send time: u64
 *       at offset 8; the sender sleeps between slots), receives them back
 *       on a thread blocked in read() and prints
 *       "sent N received M mean_ns X p50_ns Y p99_ns Z".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

/* This process's CPU time (all threads, exact: the scheduler's runtime). */
static uint64_t cpu_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return (uint64_t)t.tv_sec * 1000000000ull + t.tv_nsec;
}

static void die(const char *what)
{
	perror(what);
	exit(1);
}

static struct sockaddr_in loopback(int port)
{
	struct sockaddr_in a = {.sin_family = AF_INET,
	                        .sin_port = htons(port),
	                        .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	return a;
}

static int listen_on(int port)
{
	struct sockaddr_in a = loopback(port);
	int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l, (void *)&a, sizeof(a)) || listen(l, 4))
		die("listen");
	return l;
}

static int connect_to(int port)
{
	struct sockaddr_in a = loopback(port);
	for (int i = 0; i < 500; i++) {
		int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
		if (connect(s, (void *)&a, sizeof(a)) == 0) {
			setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
			return s;
		}
		close(s);
		usleep(10000);
	}
	die("connect");
	return -1;
}

static int accept_one(int l)
{
	int s = accept(l, NULL, NULL), one = 1;
	if (s < 0)
		die("accept");
	setsockopt(s, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	return s;
}

/* One message: a single read() as a broker does; a short one is completed. */
static int read_msg(int fd, char *buf, size_t size)
{
	size_t got = 0;
	while (got < size) {
		ssize_t n = read(fd, buf + got, size - got);
		if (n <= 0)
			return 0;
		got += n;
	}
	return 1;
}

static void write_all(int fd, const char *buf, size_t size)
{
	while (size) {
		ssize_t n = write(fd, buf, size);
		if (n <= 0)
			die("write");
		buf += n;
		size -= n;
	}
}

static int broker(int argc, char **argv)
{
	int in_port = atoi(argv[2]), out_port = atoi(argv[3]);
	size_t size = strtoul(argv[4], NULL, 10);
	const char *log = argc > 5 ? argv[5] : "none";
	long every = argc > 6 ? atol(argv[6]) : 0, delay_us = argc > 7 ? atol(argv[7]) : 0;
	long drop_at = argc > 8 ? atol(argv[8]) : -1;
	const char *logfile = argc > 9 ? argv[9] : "/tmp/msgbench-broker.log";
	int mem = !strcmp(log, "mem"), file = !strcmp(log, "file");
	FILE *f = NULL;
	if (file && !(f = fopen(logfile, "w")))
		die("log file");
	size_t cap = 1 << 22;
	uint64_t *times = mem ? calloc(2 * cap, sizeof(uint64_t)) : NULL;
	int l = listen_on(in_port);
	printf("listening\n");
	fflush(stdout);
	int in = accept_one(l);
	int out = connect_to(out_port);
	char *buf = malloc(size);
	uint64_t cpu0 = cpu_ns();
	long n = 0;
	for (long i = 0; read_msg(in, buf, size); i++, n++) {
		if (mem)
			times[2 * (i % cap)] = now_ns();
		else if (file)
			fprintf(f, "%ld r %llu\n", i, (unsigned long long)now_ns());
		if (every && (i + 1) % every == 0) {
			uint64_t until = now_ns() + delay_us * 1000;
			while (now_ns() < until)
				;
		}
		if (i == drop_at)
			continue;
		write_all(out, buf, size);
		if (mem)
			times[2 * (i % cap) + 1] = now_ns();
		else if (file)
			fprintf(f, "%ld s %llu\n", i, (unsigned long long)now_ns());
	}
	if (mem) {
		uint64_t sum = 0;
		for (size_t i = 0; i < cap; i++)
			sum += times[2 * i + 1] - times[2 * i];
		fprintf(stderr, "broker: logged %llu ns in memory\n", (unsigned long long)sum);
	}
	if (f)
		fclose(f);
	uint64_t cpu = cpu_ns() - cpu0;
	close(out);
	printf("messages %ld cpu_ns %llu\n", n, (unsigned long long)cpu);
	fflush(stdout);
	return 0;
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

struct rx {
	int l;
	long count;
	size_t size;
	uint64_t *t;
	long got;
};

/* The receiver: a thread blocked in read(), as a real consumer would be. */
static void *receiver(void *p)
{
	struct rx *r = p;
	int s = accept_one(r->l);
	char *buf = malloc(r->size);
	while (r->got < r->count && read_msg(s, buf, r->size)) {
		uint64_t sent;
		memcpy(&sent, buf + 8, 8);
		r->t[r->got++] = now_ns() - sent;
	}
	return NULL;
}

/* The sender sleeps until each slot (absolute, 1 ns timer slack): neither
 * side spins, so the broker's CPU is its own and the only syscalls are the
 * messages' own. */
static int pair(char **argv)
{
	int broker_port = atoi(argv[2]), listen_port = atoi(argv[3]);
	long count = atol(argv[4]), spacing_us = atol(argv[5]);
	size_t size = strtoul(argv[6], NULL, 10);
	if (size < 16)
		size = 16;
	prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
	struct rx r = {.l = listen_on(listen_port),
	               .count = count,
	               .size = size,
	               .t = calloc(count, sizeof(uint64_t))};
	pthread_t th;
	pthread_create(&th, NULL, receiver, &r);
	int s = connect_to(broker_port);
	char *buf = calloc(1, size);
	uint64_t cpu0 = cpu_ns();
	uint64_t t0 = now_ns() + 1000000;
	for (long i = 0; i < count; i++) {
		uint64_t slot = t0 + (uint64_t)i * spacing_us * 1000;
		struct timespec ts = {.tv_sec = slot / 1000000000ull,
		                      .tv_nsec = slot % 1000000000ull};
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL))
			;
		uint64_t id = i, sent = now_ns();
		memcpy(buf, &id, 8);
		memcpy(buf + 8, &sent, 8);
		write_all(s, buf, size);
	}
	shutdown(s, SHUT_WR);
	pthread_join(th, NULL);
	uint64_t cpu = cpu_ns() - cpu0;
	long n = r.got;
	double sum = 0;
	for (long i = 0; i < n; i++)
		sum += r.t[i];
	qsort(r.t, n, sizeof(uint64_t), cmp);
	printf("sent %ld received %ld mean_ns %.0f p50_ns %llu p99_ns %llu cpu_ns %llu\n", count, n,
	       n ? sum / n : 0, n ? (unsigned long long)r.t[n / 2] : 0ull,
	       n ? (unsigned long long)r.t[n * 99 / 100] : 0ull, (unsigned long long)cpu);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && !strcmp(argv[1], "broker"))
		return broker(argc, argv);
	if (argc == 7 && !strcmp(argv[1], "pair"))
		return pair(argv);
	fprintf(stderr, "usage: msgbench broker IN_PORT OUT_PORT SIZE [LOG [EVERY DELAY_US "
	                "[DROP_AT [LOGFILE]]]]\n"
	                "       msgbench pair BROKER_PORT LISTEN_PORT COUNT SPACING_US SIZE\n");
	return 2;
}
