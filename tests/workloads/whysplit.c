// Threads each waiting on one kind of thing, named by what they do, for
// `sonde why`'s tests: `whysplit FILE SECONDS` (FILE: a scratch file on a
// real disk for O_DIRECT reads). Prints "receiver LOCAL REMOTE" and
// "epoller LOCAL REMOTE" (their sockets' addresses), then "ready" once every
// thread runs; starts
// the short-lived threads when a line comes on stdin, and says "short
// started".
//
//   spinner   on CPU all the time
//   sleeper   nanosleep(10 ms) in a loop
//   reader    read() on a pipe the writer fills a byte every 20 ms
//   writer    sleeps 20 ms, writes a byte
//   waiter    locks a mutex the holder keeps 30 ms of every 31
//   holder    holds it 30 ms (sleeping), lets go for 1 ms
//   receiver  recv() on a loopback TCP connection a byte every 20 ms
//   sender    sleeps 20 ms, sends a byte on each of two connections
//   epoller   epoll_wait on a set of one socket (the second connection),
//             then recv(): waiting on one peer, not for work
//   direct    O_DIRECT 4 KiB reads at random offsets of FILE
//   stuck     read() on a pipe nobody writes: blocked throughout
//   short-N   two threads started on a line from stdin: 200 ms spinning,
//             300 ms asleep, then they exit
//   main      epoll_wait on a set of two pipes nobody writes: waiting for
//             work
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int pipe_rw[2], stuck_rw[2], idle_rw[2], tcp_pair[2], tcp2[2];
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const char *file;
static volatile unsigned long sink;

static void ms_sleep(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts))
		;
}

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static void *spinner(void *a)
{
	for (;;)
		sink++;
	return a;
}

static void *sleeper(void *a)
{
	for (;;)
		ms_sleep(10);
	return a;
}

static void *reader(void *a)
{
	char c;
	while (read(pipe_rw[0], &c, 1) >= 0)
		;
	return a;
}

static void *writer(void *a)
{
	for (;;) {
		ms_sleep(20);
		if (write(pipe_rw[1], "x", 1) < 0)
			break;
	}
	return a;
}

static void *holder(void *a)
{
	for (;;) {
		pthread_mutex_lock(&mu);
		ms_sleep(30);
		pthread_mutex_unlock(&mu);
		ms_sleep(1);
	}
	return a;
}

static void *waiter(void *a)
{
	ms_sleep(5); /* let the holder take it first */
	for (;;) {
		pthread_mutex_lock(&mu);
		pthread_mutex_unlock(&mu);
		ms_sleep(2); /* the holder's turn again */
	}
	return a;
}

static void *receiver(void *a)
{
	char c;
	while (recv(tcp_pair[0], &c, 1, 0) > 0)
		;
	return a;
}

static void *sender(void *a)
{
	for (;;) {
		ms_sleep(20);
		if (send(tcp_pair[1], "x", 1, 0) < 0 || send(tcp2[1], "y", 1, 0) < 0)
			break;
	}
	return a;
}

static void *epoller(void *a)
{
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN}, got;
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, tcp2[0], &ev))
		exit(1);
	char c;
	for (;;)
		if (epoll_wait(ep, &got, 1, -1) == 1 && recv(tcp2[0], &c, 1, 0) <= 0)
			break;
	return a;
}

static void *direct(void *a)
{
	int fd = open(file, O_RDONLY | O_DIRECT);
	if (fd < 0) {
		perror(file);
		exit(1);
	}
	off_t blocks = lseek(fd, 0, SEEK_END) / 4096;
	void *buf;
	if (posix_memalign(&buf, 4096, 4096))
		exit(1);
	unsigned int seed = 1;
	for (;;)
		if (pread(fd, buf, 4096, (off_t)(rand_r(&seed) % blocks) * 4096) < 0) {
			perror("pread");
			exit(1);
		}
	return a;
}

static void *stuck(void *a)
{
	char c;
	while (read(stuck_rw[0], &c, 1) >= 0)
		;
	return a;
}

static void *short_lived(void *a)
{
	double end = now_s() + 0.2;
	while (now_s() < end)
		sink++;
	ms_sleep(300);
	return a;
}

static void start(void *(*f)(void *), const char *name)
{
	pthread_t t;
	if (pthread_create(&t, NULL, f, NULL)) {
		perror("pthread_create");
		exit(1);
	}
	pthread_setname_np(t, name);
}

static void tcp_connect(int *pair)
{
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t n = sizeof(sa);
	if (bind(l, (void *)&sa, sizeof(sa)) || listen(l, 1) || getsockname(l, (void *)&sa, &n))
		exit(1);
	pair[1] = socket(AF_INET, SOCK_STREAM, 0);
	if (connect(pair[1], (void *)&sa, sizeof(sa)))
		exit(1);
	pair[0] = accept(l, NULL, NULL);
	if (pair[0] < 0)
		exit(1);
	close(l);
}

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: whysplit FILE SECONDS\n");
		return 2;
	}
	file = argv[1];
	double end = now_s() + atof(argv[2]);
	if (pipe(pipe_rw) || pipe(stuck_rw) || pipe(idle_rw))
		return 1;
	tcp_connect(tcp_pair);
	tcp_connect(tcp2);
	start(spinner, "spinner");
	start(sleeper, "sleeper");
	start(reader, "reader");
	start(writer, "writer");
	start(holder, "holder");
	start(waiter, "waiter");
	start(receiver, "receiver");
	start(sender, "sender");
	start(epoller, "epoller");
	start(direct, "direct");
	start(stuck, "stuck");
	int ep = epoll_create1(0);
	struct epoll_event ev = {.events = EPOLLIN};
	if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, stuck_rw[0], &ev) ||
	    epoll_ctl(ep, EPOLL_CTL_ADD, idle_rw[0], &ev))
		return 1;
	struct sockaddr_in la, ra;
	socklen_t ln = sizeof(la), rn = sizeof(ra);
	if (getsockname(tcp_pair[0], (void *)&la, &ln) ||
	    getpeername(tcp_pair[0], (void *)&ra, &rn))
		return 1;
	printf("receiver 127.0.0.1:%d 127.0.0.1:%d\n", ntohs(la.sin_port), ntohs(ra.sin_port));
	if (getsockname(tcp2[0], (void *)&la, &ln) || getpeername(tcp2[0], (void *)&ra, &rn))
		return 1;
	printf("epoller 127.0.0.1:%d 127.0.0.1:%d\n", ntohs(la.sin_port), ntohs(ra.sin_port));
	printf("ready\n");
	fflush(stdout);
	/* The main thread waits for work, which comes once: the line that
	 * starts the short threads. */
	struct epoll_event in = {.events = EPOLLIN}, got;
	if (epoll_ctl(ep, EPOLL_CTL_ADD, 0, &in))
		return 1;
	while (epoll_wait(ep, &got, 1, -1) < 1)
		;
	char line[16];
	if (read(0, line, sizeof(line)) < 0 || epoll_ctl(ep, EPOLL_CTL_DEL, 0, NULL))
		return 1;
	start(short_lived, "short-1");
	start(short_lived, "short-2");
	printf("short started\n");
	fflush(stdout);
	while (now_s() < end)
		epoll_wait(ep, &got, 1, (int)((end - now_s()) * 1000) + 1);
	return 0;
}
