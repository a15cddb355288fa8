// The service of `sonde lab why`: `whylab ADDR PORT FILE SECONDS`. Threads
// each spend their time on one thing, and measure it themselves:
//
//   crunch-1, crunch-2  spin on CPU (the lab puts them in a cgroup with a
//                       CPU quota: on CPU, then throttled)
//   fetch               a 1-byte request to ADDR:PORT, then waits for the
//                       1-byte answer (the lab's peer, behind a lossy link)
//   scan                O_DIRECT 4 KiB reads at random offsets of FILE
//   locker              locks a mutex that holder keeps 30 ms of every 31
//   holder              holds it 30 ms (asleep), lets go for 1 ms
//   main                joins the others
//
// Prints "crunch TID TID" once the threads run, then "ready". A line "go"
// on stdin marks the start of the measured interval, "end" its end: then one
// line per thread, "thread NAME TID WALL_NS CALL_NS CPU_NS DELAY_NS": the
// interval, the time the thread spent in it inside its blocking call (send
// and recv, pread, pthread_mutex_lock, counting a call still in progress at
// either mark; 0 for the spinners and holder), its CPU time (its thread CPU
// clock), and its time runnable but not running (field 2 of its schedstat;
// not compared: on Linux 6.18 it came out above the interval itself for a
// thread throttled by a CPU quota on a busy CPU): the split sonde why is
// checked against. It exits when stdin closes.
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static atomic_int stop;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static const char *addr, *file;
static int port;

struct stat_t {
	const char *name;
	pid_t tid;
	atomic_llong call;  /* time in finished calls */
	atomic_llong since; /* when the call in progress began (0: none) */
	atomic_int up;
};

enum {
	CRUNCH1,
	CRUNCH2,
	FETCH,
	SCAN,
	LOCKER,
	HOLDER,
	N
};
static struct stat_t st[N] = {
        {"crunch-1"}, {"crunch-2"}, {"fetch"}, {"scan"}, {"locker"}, {"holder"},
};

static long long now(clockid_t c)
{
	struct timespec t;
	clock_gettime(c, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void start(struct stat_t *s)
{
	s->tid = (pid_t)syscall(SYS_gettid);
	pthread_setname_np(pthread_self(), s->name);
	atomic_store(&s->up, 1);
}

static void call_begin(struct stat_t *s)
{
	atomic_store(&s->since, now(CLOCK_MONOTONIC));
}

static void call_end(struct stat_t *s)
{
	long long t = now(CLOCK_MONOTONIC);
	atomic_fetch_add(&s->call, t - atomic_load(&s->since));
	atomic_store(&s->since, 0);
}

/* Thread `tid`'s run delay so far (schedstat field 2), ns. */
static long long run_delay(pid_t tid)
{
	char path[64];
	long long on = 0, delay = 0;
	snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	if (fscanf(f, "%lld %lld", &on, &delay) != 2)
		delay = 0;
	fclose(f);
	return delay;
}

/* Time in calls up to `t`, the one in progress included. */
static long long call_at(struct stat_t *s, long long t)
{
	long long since = atomic_load(&s->since), c = atomic_load(&s->call);
	return c + (since && since < t ? t - since : 0);
}

static void *crunch(void *p)
{
	struct stat_t *s = p;
	start(s);
	volatile unsigned long x = 0;
	while (!atomic_load(&stop))
		for (int i = 0; i < 100000; i++)
			x += i;
	return NULL;
}

static void *fetch(void *p)
{
	struct stat_t *s = p;
	start(s);
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
	inet_pton(AF_INET, addr, &sa.sin_addr);
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		perror("whylab: connect");
		exit(1);
	}
	char b = 'q';
	while (!atomic_load(&stop)) {
		call_begin(s);
		int ok = send(fd, &b, 1, 0) == 1 && recv(fd, &b, 1, 0) == 1;
		call_end(s);
		if (!ok)
			break;
	}
	return NULL;
}

static void *scan(void *p)
{
	struct stat_t *s = p;
	start(s);
	int fd = open(file, O_RDONLY | O_DIRECT);
	if (fd < 0) {
		perror("whylab: open O_DIRECT");
		exit(1);
	}
	off_t size = lseek(fd, 0, SEEK_END);
	void *buf;
	if (posix_memalign(&buf, 4096, 4096))
		exit(1);
	unsigned seed = 1;
	while (!atomic_load(&stop)) {
		off_t at = (off_t)(rand_r(&seed) % (size / 4096)) * 4096;
		call_begin(s);
		ssize_t n = pread(fd, buf, 4096, at);
		call_end(s);
		if (n != 4096) {
			perror("whylab: pread");
			exit(1);
		}
	}
	return NULL;
}

static void *locker(void *p)
{
	struct stat_t *s = p;
	start(s);
	while (!atomic_load(&stop)) {
		call_begin(s);
		pthread_mutex_lock(&mu);
		call_end(s);
		pthread_mutex_unlock(&mu);
	}
	return NULL;
}

static void *holder(void *p)
{
	struct stat_t *s = p;
	start(s);
	struct timespec hold = {0, 30000000}, gap = {0, 1000000};
	while (!atomic_load(&stop)) {
		pthread_mutex_lock(&mu);
		nanosleep(&hold, NULL);
		pthread_mutex_unlock(&mu);
		nanosleep(&gap, NULL);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 5) {
		fprintf(stderr, "usage: whylab ADDR PORT FILE SECONDS\n");
		return 2;
	}
	addr = argv[1];
	port = atoi(argv[2]);
	file = argv[3];
	int secs = atoi(argv[4]); /* the longest it runs */
	void *(*fn[N])(void *) = {crunch, crunch, fetch, scan, locker, holder};
	pthread_t t[N];
	for (int i = 0; i < N; i++)
		pthread_create(&t[i], NULL, fn[i], &st[i]);
	for (int i = 0; i < N; i++)
		while (!atomic_load(&st[i].up))
			usleep(1000);
	printf("crunch %d %d\nready\n", st[CRUNCH1].tid, st[CRUNCH2].tid);
	fflush(stdout);
	alarm(secs);
	long long t0 = 0, call0[N], cpu0[N], delay0[N];
	clockid_t clk[N];
	for (int i = 0; i < N; i++)
		pthread_getcpuclockid(t[i], &clk[i]);
	char line[64];
	/* Waiting for the lab's marks is waiting for work (poll). */
	struct pollfd in = {.fd = 0, .events = POLLIN};
	while (poll(&in, 1, -1) >= 0 && fgets(line, sizeof(line), stdin)) {
		long long t1 = now(CLOCK_MONOTONIC);
		if (!strncmp(line, "go", 2)) {
			t0 = t1;
			for (int i = 0; i < N; i++) {
				call0[i] = call_at(&st[i], t1);
				cpu0[i] = now(clk[i]);
				delay0[i] = run_delay(st[i].tid);
			}
		} else if (!strncmp(line, "end", 3) && t0) {
			long long call1[N], cpu1[N], delay1[N];
			for (int i = 0; i < N; i++) {
				call1[i] = call_at(&st[i], t1);
				cpu1[i] = now(clk[i]);
				delay1[i] = run_delay(st[i].tid);
			}
			for (int i = 0; i < N; i++)
				printf("thread %s %d %lld %lld %lld %lld\n", st[i].name, st[i].tid,
				       t1 - t0, call1[i] - call0[i], cpu1[i] - cpu0[i],
				       delay1[i] - delay0[i]);
			fflush(stdout);
			/* Until stdin closes: the lab still reads this
			 * process's files and cgroup. */
		}
	}
	atomic_store(&stop, 1);
	return 0;
}
