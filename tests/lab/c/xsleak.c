// SPDX-License-Identifier: GPL-2.0
/*
 * xsleak: connect/close cycles between two domains in the close sequences
 * that once left the connecting side's receive rings granted (and its
 * memory and grant entries used) long after both ends had closed. The lab
 * scenarios around it (tests/lab/kmod-leak) count what the kernel and Xen
 * count before and after: free memory, the module's grants, and Xen's
 * grant frames and active entries of each domain.
 *
 *   xsleak server PORT
 *       domu1: listens on PORT (backlog 64) and on PORT+1 with backlog 1,
 *       accepting from that one slowly (one every 20 ms), so that it is
 *       full most of the time. Every accepted connection is read until EOF
 *       or an error, then closed. A connection that sends "STOP" ends the
 *       server once its open connections ended, which prints its counts
 *       (an error other than ECONNRESET fails it).
 *   xsleak client PEER PORT PATTERN CYCLES PROCS
 *       domu2: CYCLES connect/close cycles split over PROCS processes run
 *       at once; each process binds explicit local ports (two, in turn)
 *       before connecting. PATTERN:
 *         close    connect, close at once without sending
 *         shutwr   connect, shutdown(SHUT_WR), close
 *         shutrd   connect, shutdown(SHUT_RD), close
 *         linger   connect, SO_LINGER {1, 5 s}, close
 *         linger0  connect, SO_LINGER {1, 0} (abortive), close
 *         data     connect, send 4 KiB, close
 *         eintr    connect to PORT+1 (full backlog) while SIGALRM arrives
 *                  every 300 us (no SA_RESTART), close whatever happened
 *       Every connect must succeed, except in eintr, where EINTR,
 *       ECONNREFUSED, ETIMEDOUT and EALREADY are what a full backlog and
 *       signals give; ENOMEM or anything else fails the pattern.
 *   xsleak stop PEER PORT
 *       ends the server.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include "xensock.h"

#include "xstest_common.h"

#define MAX_CONNS 4096

static int listen_on(uint32_t port, int backlog)
{
	struct sockaddr_xen a = xaddr(XEN_DOMID_ANY, port);
	int s = socket(fam, SOCK_STREAM | SOCK_NONBLOCK, 0);

	if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, backlog)) {
		fprintf(stderr, "xsleak: listen on %u: %s\n", port, strerror(errno));
		exit(2);
	}
	return s;
}

static int server(uint32_t port)
{
	struct pollfd p[MAX_CONNS + 2];
	int n = 2, stop = 0;
	unsigned long accepted = 0, eofs = 0, resets = 0, errors = 0;
	int last_errno = 0;
	double next_slow = 0;
	struct rlimit rl = { MAX_CONNS + 64, MAX_CONNS + 64 };

	setrlimit(RLIMIT_NOFILE, &rl);
	p[0] = (struct pollfd){ .fd = listen_on(port, 64), .events = POLLIN };
	p[1] = (struct pollfd){ .fd = listen_on(port + 1, 1), .events = POLLIN };
	printf("xsleak server: listening on %u and %u (backlog 1)\n", port, port + 1);
	fflush(stdout);
	while (!stop || n > 2) {
		int i, r = poll(p, n, 20);

		if (r < 0 && errno != EINTR)
			break;
		for (i = 0; i < 2 && !stop; i++) {
			/* the slow listener: one accept per 20 ms keeps its backlog full */
			if (i == 1 && now() < next_slow)
				continue;
			while (n < MAX_CONNS + 2) {
				int c = accept4(p[i].fd, NULL, NULL, SOCK_NONBLOCK);

				if (c < 0)
					break;
				accepted++;
				p[n++] = (struct pollfd){ .fd = c, .events = POLLIN };
				if (i == 1) {
					next_slow = now() + 0.02;
					break;
				}
			}
		}
		for (i = 2; i < n; i++) {
			char buf[4096];
			ssize_t got;

			if (!p[i].revents)
				continue;
			got = recv(p[i].fd, buf, sizeof(buf), 0);
			if (got > 0) {
				if (got >= 4 && !memcmp(buf, "STOP", 4))
					stop = 1;
				continue;
			}
			if (got < 0 && errno == EAGAIN)
				continue;
			if (got == 0) {
				eofs++;
			} else if (errno == ECONNRESET) {
				/* linger0 and connects abandoned in eintr */
				resets++;
			} else {
				errors++;
				last_errno = errno;
			}
			close(p[i].fd);
			p[i--] = p[--n];
		}
	}
	printf("xsleak server: %lu accepted, %lu EOF, %lu ECONNRESET, %lu other errors (last %s)\n",
	       accepted, eofs, resets, errors, last_errno ? strerrorname_np(last_errno) : "-");
	/* every connection ends in EOF or a reset, nothing else */
	result("leak-server", errors == 0 && accepted == eofs + resets, "accepted=%lu eof=%lu resets=%lu errors=%lu",
	       accepted, eofs, resets, errors);
	return errors != 0;
}

static void on_alarm(int sig) { (void)sig; }

/* counts of one process's cycles, by what connect() said */
struct tally {
	unsigned long ok, eintr, refused, timedout, already, other;
	int other_errno;
};

static void cycle(uint32_t peer, uint32_t port, const char *pattern, uint32_t lport, struct tally *t)
{
	struct sockaddr_xen a = xaddr(peer, port), me = xaddr(XEN_DOMID_ANY, lport);
	int s = socket(fam, SOCK_STREAM, 0), r;

	if (s < 0) {
		t->other++;
		t->other_errno = errno;
		return;
	}
	if (bind(s, (struct sockaddr *)&me, sizeof(me))) {
		t->other++;
		t->other_errno = errno;
		close(s);
		return;
	}
	r = connect(s, (struct sockaddr *)&a, sizeof(a));
	if (r) {
		switch (errno) {
		case EINTR: t->eintr++; break;
		case ECONNREFUSED: t->refused++; break;
		case ETIMEDOUT: t->timedout++; break;
		case EALREADY: t->already++; break;
		default: t->other++; t->other_errno = errno;
		}
		close(s);
		return;
	}
	t->ok++;
	if (!strcmp(pattern, "shutwr")) {
		shutdown(s, SHUT_WR);
	} else if (!strcmp(pattern, "shutrd")) {
		shutdown(s, SHUT_RD);
	} else if (!strcmp(pattern, "linger") || !strcmp(pattern, "linger0")) {
		struct linger l = { 1, pattern[6] == '0' ? 0 : 5 };

		setsockopt(s, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	} else if (!strcmp(pattern, "data")) {
		char b[4096];

		memset(b, 'x', sizeof(b));
		if (write_full(s, b, sizeof(b))) {
			t->ok--;
			t->other++;
			t->other_errno = errno;
		}
	}
	close(s);
}

static int client_proc(uint32_t peer, uint32_t port, const char *pattern, unsigned long cycles, int idx)
{
	struct tally t = { 0 };
	int eintr = !strcmp(pattern, "eintr");
	unsigned long i;

	if (eintr) {
		struct sigaction sa = { .sa_handler = on_alarm };	/* no SA_RESTART */
		struct itimerval it = { { 0, 300 }, { 0, 300 } };

		sigaction(SIGALRM, &sa, NULL);
		setitimer(ITIMER_REAL, &it, NULL);
		port++;
	}
	for (i = 0; i < cycles; i++)
		cycle(peer, port, pattern, 30000 + idx * 2 + (i & 1), &t);
	if (eintr) {
		struct itimerval off = { 0 };

		setitimer(ITIMER_REAL, &off, NULL);
	}
	printf("xsleak %s[%d]: %lu cycles: ok %lu eintr %lu refused %lu timedout %lu already %lu other %lu (last %s)\n",
	       pattern, idx, cycles, t.ok, t.eintr, t.refused, t.timedout, t.already, t.other,
	       t.other ? strerrorname_np(t.other_errno) : "-");
	fflush(stdout);
	if (t.other)
		return 1;
	if (!eintr && t.ok != cycles)
		return 1;
	return 0;
}

static int client(uint32_t peer, uint32_t port, const char *pattern, unsigned long cycles, int procs)
{
	double t0 = now();
	int i, bad = 0, st;

	if (procs < 1 || procs > 64)
		procs = 1;
	for (i = 0; i < procs; i++) {
		pid_t pid = fork();

		if (pid == 0)
			_exit(client_proc(peer, port, pattern, cycles / procs + (i < (int)(cycles % procs)), i));
		if (pid < 0)
			bad++;
	}
	while (wait(&st) > 0)
		if (!WIFEXITED(st) || WEXITSTATUS(st))
			bad++;
	char name[64];

	snprintf(name, sizeof(name), "leak-%s", pattern);
	result(name, !bad, "cycles=%lu procs=%d secs=%.1f failed_procs=%d", cycles, procs, now() - t0, bad);
	return bad ? 1 : 0;
}

static int stop(uint32_t peer, uint32_t port)
{
	struct sockaddr_xen a = xaddr(peer, port);
	int s = socket(fam, SOCK_STREAM, 0);

	if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) || write_full(s, "STOP", 4)) {
		fprintf(stderr, "xsleak stop: %s\n", strerror(errno));
		return 1;
	}
	close(s);
	return 0;
}

int main(int argc, char **argv)
{
	signal(SIGPIPE, SIG_IGN);
	fam = xensock_family();
	if (fam < 0) {
		fprintf(stderr, "xsleak: cannot read %s: %s\n", XENSOCK_FAMILY_SYSFS, strerror(errno));
		return 2;
	}
	if (argc == 3 && !strcmp(argv[1], "server"))
		return server(strtoul(argv[2], NULL, 0));
	if (argc == 7 && !strcmp(argv[1], "client"))
		return client(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0), argv[4],
			      strtoul(argv[5], NULL, 0), atoi(argv[6]));
	if (argc == 4 && !strcmp(argv[1], "stop"))
		return stop(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
	fprintf(stderr, "usage: xsleak server PORT | client PEER PORT PATTERN CYCLES PROCS | stop PEER PORT\n");
	return 2;
}
