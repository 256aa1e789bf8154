// SPDX-License-Identifier: MIT OR Apache-2.0
/*
 * What a TCP program does with its sockets, run under libxensock_preload.so
 * (preload/tests/run.sh): every case must behave as without the library.
 * An echo server on 127.0.0.1 (its listen goes through the library), then
 * clients: non-blocking connect registered in epoll before connect, fds
 * >= 1024 with poll, dup2/dup3, fork, exec of a program that uses the
 * inherited socket, a socket passed over SCM_RIGHTS, EPOLL_CTL_MOD,
 * splice and sendfile, and threads connecting at once. Prints "ok <case>" or
 * "FAIL <case>: why" per case; exits 1 if any failed.
 *
 *   cases                      run every case against its own echo server
 *                              on 127.0.0.1
 *   cases --serve PORT         only the echo server, on 0.0.0.0:PORT (the
 *                              lab runs it in another guest)
 *   cases --connect ADDR PORT  every client case against the echo server
 *                              at ADDR:PORT
 *   cases --echo FD            (the exec case's child) one round trip on FD
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int failed;
static struct sockaddr_in server;

static void verdict(const char *name, int ok, const char *why)
{
	if (ok) {
		printf("ok %s\n", name);
	} else {
		printf("FAIL %s: %s (errno %s)\n", name, why, strerrorname_np(errno) ?: "0");
		failed = 1;
	}
	fflush(stdout);
}

/* one round trip: send msg, read it back */
static int round_trip(int fd, const char *msg)
{
	char buf[256];
	size_t n = strlen(msg), got = 0;

	if (write(fd, msg, n) != (ssize_t)n)
		return 0;
	while (got < n) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r <= 0)
			return 0;
		got += r;
	}
	return memcmp(buf, msg, n) == 0;
}

static void *echo_conn(void *arg)
{
	int fd = (int)(long)arg;
	char buf[4096];
	ssize_t r;

	while ((r = read(fd, buf, sizeof(buf))) > 0)
		if (write(fd, buf, r) != r)
			break;
	close(fd);
	return NULL;
}

static void *echo_server(void *arg)
{
	int l = (int)(long)arg;

	for (;;) {
		int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
		pthread_t t;

		if (c < 0)
			continue;
		pthread_create(&t, NULL, echo_conn, (void *)(long)c);
		pthread_detach(t);
	}
	return NULL;
}

static int connected(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd >= 0 && connect(fd, (struct sockaddr *)&server, sizeof(server)) != 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void nonblocking_connect_in_epoll_first(void)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0), ep = epoll_create1(0), err = -1, r;
	struct epoll_event ev = { .events = EPOLLOUT | EPOLLIN | EPOLLET, .data.fd = fd }, out;
	socklen_t len = sizeof(err);

	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	r = connect(fd, (struct sockaddr *)&server, sizeof(server));
	if (r != 0 && errno != EINPROGRESS) {
		verdict("nonblocking-connect-epoll-first", 0, "connect");
		return;
	}
	r = epoll_wait(ep, &out, 1, 5000);
	getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
	verdict("nonblocking-connect-epoll-first", r == 1 && (out.events & EPOLLOUT) && err == 0, "no EPOLLOUT or SO_ERROR");
	fcntl(fd, F_SETFL, 0);
	verdict("nonblocking-connect-echo", round_trip(fd, "after the edge"), "echo");
	close(fd);
	close(ep);
}

static void high_fds(void)
{
	struct rlimit rl = { 4096, 4096 };
	int fd, hi;
	struct pollfd p;
	fd_set set;
	struct timeval tv = { 5, 0 };

	setrlimit(RLIMIT_NOFILE, &rl);
	fd = socket(AF_INET, SOCK_STREAM, 0);
	hi = dup2(fd, 1500);
	close(fd);
	verdict("fd-1500-connect", hi == 1500 && connect(hi, (struct sockaddr *)&server, sizeof(server)) == 0, "connect");
	write(hi, "x", 1);
	p = (struct pollfd){ .fd = hi, .events = POLLIN };
	verdict("fd-1500-poll", poll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "poll");
	{
		char c;
		verdict("fd-1500-read", read(hi, &c, 1) == 1 && c == 'x', "read");
	}
	close(hi);
	/* select on a low one */
	fd = connected();
	write(fd, "y", 1);
	FD_ZERO(&set);
	FD_SET(fd, &set);
	verdict("select", select(fd + 1, &set, NULL, NULL, &tv) == 1, "select");
	close(fd);
}

static void dups(void)
{
	int fd = connected(), a, b;

	a = dup(fd);
	b = dup3(fd, 1200, O_CLOEXEC);
	close(fd);
	verdict("dup", a >= 0 && round_trip(a, "through dup"), "dup");
	verdict("dup3-cloexec", b == 1200 && (fcntl(b, F_GETFD) & FD_CLOEXEC) && round_trip(b, "through dup3"), "dup3");
	fd = socket(AF_INET, SOCK_STREAM, 0);
	verdict("dup2-over-connected", dup2(fd, a) == a && connect(a, (struct sockaddr *)&server, sizeof(server)) == 0 &&
		round_trip(a, "a new socket under the old number"), "dup2");
	close(fd);
	close(a);
	close(b);
}

static void forks(char *self)
{
	int fd = connected(), st = 0;
	pid_t pid = fork();
	char buf[16], arg[16];

	if (pid == 0)
		_exit(round_trip(fd, "from the child") ? 0 : 1);
	waitpid(pid, &st, 0);
	verdict("fork-child-uses-socket", WIFEXITED(st) && WEXITSTATUS(st) == 0, "child");
	verdict("fork-parent-still-uses-it", round_trip(fd, "parent after"), "parent");
	close(fd);
	/* exec: a socket without close-on-exec is the new program's */
	fd = socket(AF_INET, SOCK_STREAM, 0);
	connect(fd, (struct sockaddr *)&server, sizeof(server));
	snprintf(arg, sizeof(arg), "%d", fd);
	pid = fork();
	if (pid == 0) {
		execl(self, self, "--echo", arg, (char *)NULL);
		_exit(2);
	}
	waitpid(pid, &st, 0);
	verdict("exec-uses-inherited-socket", WIFEXITED(st) && WEXITSTATUS(st) == 0, "exec'd program");
	close(fd);
	(void)buf;
}

/* a connected socket passed to a child over an AF_UNIX socket (SCM_RIGHTS) */
static void scm_rights(void)
{
	int fd = connected(), sv[2], st = 0;
	char c = 'x';
	pid_t pid;

	socketpair(AF_UNIX, SOCK_STREAM, 0, sv);
	pid = fork();
	if (pid == 0) {
		char cbuf[CMSG_SPACE(sizeof(int))], b;
		struct iovec iov = { .iov_base = &b, .iov_len = 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *cm;
		int got = -1;

		close(sv[0]);
		if (recvmsg(sv[1], &m, 0) == 1 && (cm = CMSG_FIRSTHDR(&m)) && cm->cmsg_type == SCM_RIGHTS)
			memcpy(&got, CMSG_DATA(cm), sizeof(int));
		_exit(got >= 0 && round_trip(got, "passed over SCM_RIGHTS") ? 0 : 1);
	}
	{
		char cbuf[CMSG_SPACE(sizeof(int))];
		struct iovec iov = { .iov_base = &c, .iov_len = 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);

		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(cm), &fd, sizeof(int));
		sendmsg(sv[0], &m, 0);
	}
	close(fd);
	close(sv[0]);
	close(sv[1]);
	waitpid(pid, &st, 0);
	verdict("scm-rights-passed-socket", WIFEXITED(st) && WEXITSTATUS(st) == 0, "the receiving process's round trip");
}

/* EPOLL_CTL_MOD: watched for input, then changed to output */
static void epoll_mod(void)
{
	int fd = connected(), ep = epoll_create1(0), n;
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd }, out;

	epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
	n = epoll_wait(ep, &out, 1, 100);
	ev.events = EPOLLOUT;
	verdict("epoll-ctl-mod", n == 0 && epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev) == 0 && epoll_wait(ep, &out, 1, 5000) == 1 &&
		(out.events & EPOLLOUT), "no EPOLLOUT after EPOLL_CTL_MOD");
	close(fd);
	close(ep);
}

/* splice: socket -> pipe -> socket, and sendfile from a file */
static void splices(void)
{
	int fd = connected(), p[2], f;
	char buf[64], name[] = "/tmp/cases-sendfile-XXXXXX";
	ssize_t n = -1;

	pipe(p);
	if (write(fd, "spliced", 7) == 7) {
		n = splice(fd, NULL, p[1], NULL, 7, SPLICE_F_MOVE);
		if (n == 7)
			n = splice(p[0], NULL, fd, NULL, 7, SPLICE_F_MOVE);
		if (n == 7)
			n = read(fd, buf, 7);
	}
	verdict("splice", n == 7 && !memcmp(buf, "spliced", 7), "socket -> pipe -> socket");
	f = mkstemp(name);
	unlink(name);
	n = -1;
	if (f >= 0 && write(f, "sendfile", 8) == 8) {
		off_t off = 0;

		n = sendfile(fd, f, &off, 8);
		if (n == 8)
			n = read(fd, buf, 8);
	}
	verdict("sendfile", n == 8 && !memcmp(buf, "sendfile", 8), "file -> socket");
	if (f >= 0)
		close(f);
	close(p[0]);
	close(p[1]);
	close(fd);
}

static void *thread_client(void *arg)
{
	long ok = 1;
	int i;

	(void)arg;
	for (i = 0; i < 50 && ok; i++) {
		int fd = connected();
		ok = fd >= 0 && round_trip(fd, "thread");
		if (fd >= 0)
			close(fd);
	}
	return (void *)ok;
}

static void threads(void)
{
	pthread_t t[8];
	long all = 1;
	void *r;
	int i;

	for (i = 0; i < 8; i++)
		pthread_create(&t[i], NULL, thread_client, NULL);
	for (i = 0; i < 8; i++) {
		pthread_join(t[i], &r);
		all &= (long)r;
	}
	verdict("threads-8x50-connects", all, "a thread's connect or echo");
}

static int listen_on(uint32_t addr, unsigned port)
{
	int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
	socklen_t len = sizeof(server);

	setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	server.sin_family = AF_INET;
	server.sin_addr.s_addr = htonl(addr);
	server.sin_port = htons(port);
	if (bind(l, (struct sockaddr *)&server, sizeof(server)) || listen(l, 128) ||
	    getsockname(l, (struct sockaddr *)&server, &len)) {
		perror("listen");
		return -1;
	}
	return l;
}

int main(int argc, char **argv)
{
	pthread_t srv;
	int l;

	if (argc == 3 && !strcmp(argv[1], "--echo"))
		return round_trip(atoi(argv[2]), "from the exec'd program") ? 0 : 1;
	if (argc == 3 && !strcmp(argv[1], "--serve")) {
		l = listen_on(INADDR_ANY, (unsigned)atoi(argv[2]));
		if (l < 0)
			return 1;
		echo_server((void *)(long)l);
		return 0;
	}
	if (argc == 4 && !strcmp(argv[1], "--connect")) {
		server.sin_family = AF_INET;
		server.sin_port = htons((unsigned)atoi(argv[3]));
		if (inet_pton(AF_INET, argv[2], &server.sin_addr) != 1) {
			fprintf(stderr, "cases: bad address %s\n", argv[2]);
			return 2;
		}
	} else {
		l = listen_on(INADDR_LOOPBACK, 0);
		if (l < 0)
			return 1;
		pthread_create(&srv, NULL, echo_server, (void *)(long)l);
	}
	nonblocking_connect_in_epoll_first();
	high_fds();
	dups();
	forks(argv[0]);
	scm_rights();
	epoll_mod();
	splices();
	threads();
	return failed;
}
