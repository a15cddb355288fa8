/*
 * The server of `sonde lab dns` (seed 001): a small HTTP server whose
 * logging middleware writes each client's host name, looked up with
 * getnameinfo() (a reverse DNS query), before the handler answers.
 *
 *   dnsweb PORT WORKERS LOGFILE
 *
 * WORKERS threads each accept a connection, read one request, log it
 * (log_request -> getnameinfo), render a JSON array of items (a little CPU,
 * handle_items) and answer with Connection: close. The resolver used is the
 * one /etc/resolv.conf names; the lab gives this process its own /etc.
 * Built static with frame pointers so its stacks unwind.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int listen_fd;
static FILE *log_file;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* The middleware: one access-log line with the client's host name. */
__attribute__((noinline)) void log_request(const struct sockaddr_storage *peer, socklen_t len,
                                           const char *path)
{
	char host[NI_MAXHOST];
	int r = getnameinfo((const struct sockaddr *)peer, len, host, sizeof(host), NULL, 0, 0);
	if (r)
		snprintf(host, sizeof(host), "? (%s)", gai_strerror(r));
	pthread_mutex_lock(&log_lock);
	fprintf(log_file, "%s GET %s\n", host, path);
	fflush(log_file);
	pthread_mutex_unlock(&log_lock);
}

/* The handler: every item as a JSON array. */
__attribute__((noinline)) int handle_items(char *body, size_t cap)
{
	size_t n = 0;
	n += snprintf(body + n, cap - n, "[");
	for (int i = 0; i < 200 && n < cap - 64; i++)
		n += snprintf(body + n, cap - n,
		              "%s{\"id\":%d,\"title\":\"entry %d\",\"score\":%.3f}", i ? "," : "",
		              i, i, i * 1.5);
	n += snprintf(body + n, cap - n, "]");
	return (int)n;
}

/* Reads one request head; returns its path or NULL. */
static char *read_request(int fd, char *buf, size_t cap)
{
	size_t n = 0;
	while (n < cap - 1) {
		ssize_t r = read(fd, buf + n, cap - 1 - n);
		if (r <= 0)
			return NULL;
		n += (size_t)r;
		buf[n] = 0;
		if (strstr(buf, "\r\n\r\n"))
			break;
	}
	char *sp = strchr(buf, ' ');
	if (!sp)
		return NULL;
	char *end = strchr(sp + 1, ' ');
	if (end)
		*end = 0;
	return sp + 1;
}

__attribute__((noinline)) void serve_connection(int fd, const struct sockaddr_storage *peer,
                                                socklen_t len)
{
	char req[2048], body[16384], head[256];
	char *path = read_request(fd, req, sizeof(req));
	if (!path)
		return;
	log_request(peer, len, path);
	int blen = handle_items(body, sizeof(body));
	int hlen = snprintf(head, sizeof(head),
	                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
	                    "%d\r\nConnection: close\r\n\r\n",
	                    blen);
	if (write(fd, head, hlen) != hlen || write(fd, body, blen) != blen)
		return;
}

static void *worker(void *arg)
{
	(void)arg;
	for (;;) {
		struct sockaddr_storage peer;
		socklen_t len = sizeof(peer);
		int fd = accept(listen_fd, (struct sockaddr *)&peer, &len);
		if (fd < 0)
			continue;
		serve_connection(fd, &peer, len);
		close(fd);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: dnsweb PORT WORKERS LOGFILE\n");
		return 2;
	}
	int port = atoi(argv[1]), workers = atoi(argv[2]);
	log_file = fopen(argv[3], "a");
	if (!log_file) {
		perror(argv[3]);
		return 1;
	}
	listen_fd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
	if (bind(listen_fd, (struct sockaddr *)&a, sizeof(a)) || listen(listen_fd, 1024)) {
		perror("bind/listen");
		return 1;
	}
	printf("listening\n");
	fflush(stdout);
	pthread_t t[64];
	if (workers < 1 || workers > 64)
		workers = 4;
	for (int i = 0; i < workers; i++)
		pthread_create(&t[i], NULL, worker, NULL);
	for (int i = 0; i < workers; i++)
		pthread_join(t[i], NULL);
	return 0;
}
