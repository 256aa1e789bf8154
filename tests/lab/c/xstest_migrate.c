// SPDX-License-Identifier: GPL-2.0
/*
 * xstest_migrate: lab tests of af_xen.ko's TCP carrier (kernel
 * half), run by tests/lab/kmod-migrate. Every check prints
 *   @@RESULT c-<name> PASS|FAIL [detail]
 * and the exit status is the number of failures.
 *
 *   xstest_migrate server PORT MiB
 *       domu1: accept one AF_XEN connection on PORT, stream MiB each way
 *       at once (position-keyed pattern: a byte lost, duplicated or
 *       reordered fails the check), open this connection's TCP leg to the
 *       peer mid-stream (XENSOCK_TEST_OPEN_LEG, right cookie), then check
 *       the TCP counters: the client's good leg authenticated, its
 *       wrong-cookie leg, the raw malformed and unknown-connection hellos
 *       refused and counted, the silent one closed at its hello deadline
 *   xstest_migrate client PEER PORT MiB LEGIP LEGPORT
 *       domu2: first raw TCP connections to LEGIP:LEGPORT (silent,
 *       garbage, an unknown connection id: all closed by the peer), then connect to
 *       PEER:PORT and stream as above; mid-stream open our TCP leg with the
 *       right cookie and one with a wrong cookie
 *   xstest_migrate eperm
 *       module loaded without hostile_test: XENSOCK_TEST_OPEN_LEG is EPERM
 *   xstest_migrate move-server PORT
 *   xstest_migrate move-client PEER PORT
 *       the carrier switch: one connection streams both ways at
 *       once, without end, checked against the position-keyed pattern; the
 *       client drives the phases from its /proc/net/af_xen line and prints
 *       "m-phase ring-ok" (dom0 then removes the pair's link directories,
 *       as the agent does when the pair stops being co-resident) and
 *       "m-phase tcp-ok" (dom0 makes them again): the connection must go to
 *       TCP, keep streaming there, come back to the ring, and finish with
 *       FIN each way (client first), every byte intact; the server checks
 *       its own line's switch counts before it closes
 *   xstest_migrate dead-server PORT
 *   xstest_migrate dead-client PEER PORT
 *       the peer dies with the connection on TCP: see cmd_dead_server
 *   xstest_migrate closefirst-server PORT
 *   xstest_migrate closefirst-client PEER PORT
 *       the server closes first with the connection on TCP: see
 *       cmd_closefirst_client
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/time.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include "xensock-lab.h"

#include "xstest_common.h"

/* stream byte at offset i of direction seed: a hash of the offset */
static uint8_t pattern(uint64_t i, uint32_t seed)
{
	uint64_t x = (i >> 2) * 0x9E3779B97F4A7C15ull ^ seed;

	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 32;
	return (uint8_t)(x >> (8 * (i & 3)));
}

/* buf[0..n) = the stream bytes of direction seed from offset `from` */
static void fill_pattern(uint8_t *buf, size_t n, uint64_t from, uint32_t seed)
{
	for (size_t k = 0; k < n; k++)
		buf[k] = pattern(from + k, seed);
}

/* checks n received bytes at stream offset `at`: the first bad offset goes
 * to *bad_at (left alone once set) */
static void check_pattern(const uint8_t *buf, size_t n, uint64_t at, uint32_t seed, uint64_t *bad_at)
{
	for (size_t k = 0; k < n && *bad_at == UINT64_MAX; k++)
		if (buf[k] != pattern(at + k, seed))
			*bad_at = at + k;
}

/* waits up to `secs` for counter NAME to reach `want`; its last value */
static long wait_stat(const char *name, long want, int secs)
{
	double end = now() + secs;
	long v;

	while ((v = afx_stat(name)) != want && now() < end)
		usleep(100000);
	return v;
}

/* copies a /proc file (its first 4 KiB) into the test's log */
static void print_file(const char *path)
{
	char buf[4096];
	FILE *f = fopen(path, "r");
	size_t n;

	if (!f)
		return;
	n = fread(buf, 1, sizeof(buf) - 1, f);
	buf[n] = 0;
	fclose(f);
	printf("%s", buf);
	fflush(stdout);
}

static void print_stats(void)
{
	print_file("/proc/net/af_xen_stats");
}

/*
 * Both directions at once, non-blocking, through poll: send `total`
 * pattern bytes (seed tx) and receive `total` checked against seed rx.
 * At half of what we send, call midway(fd) once.
 */
static int stream(const char *name, int fd, uint64_t total, uint32_t txseed, uint32_t rxseed, void (*midway)(int))
{
	static uint8_t buf[65536];
	uint64_t sent = 0, got = 0, bad_at = UINT64_MAX;
	int mid_done = 0;
	double t0 = now();

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	while (sent < total || got < total) {
		struct pollfd p = { .fd = fd, .events = (sent < total ? POLLOUT : 0) | (got < total ? POLLIN : 0) };

		if (poll(&p, 1, 60000) <= 0) {
			result(name, 0, "stalled: sent %llu got %llu of %llu", (unsigned long long)sent, (unsigned long long)got, (unsigned long long)total);
			return -1;
		}
		if ((p.revents & POLLOUT) && sent < total) {
			size_t n = total - sent < sizeof(buf) ? total - sent : sizeof(buf);
			ssize_t w;

			fill_pattern(buf, n, sent, txseed);
			w = send(fd, buf, n, MSG_NOSIGNAL);
			if (w < 0 && errno != EAGAIN) {
				result(name, 0, "send: %s at %llu", strerror(errno), (unsigned long long)sent);
				return -1;
			}
			if (w > 0)
				sent += w;
			if (!mid_done && sent >= total / 2 && midway) {
				mid_done = 1;
				fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
				midway(fd);
				fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
			}
		}
		if ((p.revents & (POLLIN | POLLHUP | POLLERR)) && got < total) {
			uint8_t rb[65536];
			ssize_t r = recv(fd, rb, sizeof(rb), 0);

			if (r == 0) {
				result(name, 0, "EOF at %llu of %llu", (unsigned long long)got, (unsigned long long)total);
				return -1;
			}
			if (r < 0 && errno != EAGAIN) {
				result(name, 0, "recv: %s at %llu", strerror(errno), (unsigned long long)got);
				return -1;
			}
			if (r > 0) {
				check_pattern(rb, r, got, rxseed, &bad_at);
				got += r;
			}
		}
	}
	if (bad_at != UINT64_MAX) {
		result(name, 0, "byte %llu differs from the pattern", (unsigned long long)bad_at);
		return -1;
	}
	result(name, 1, "%llu bytes each way intact, %.1f s", (unsigned long long)total, now() - t0);
	return 0;
}

static void open_leg(const char *name, int fd, int mode)
{
	int r = setsockopt(fd, fam, XENSOCK_TEST_OPEN_LEG, &mode, sizeof(mode));

	result(name, r == 0, "setsockopt(XENSOCK_TEST_OPEN_LEG, %d): %s", mode, r == 0 ? "0" : strerror(errno));
}

static void server_midway(int fd)
{
	open_leg("m-server-open-leg", fd, 1);
}

static void client_midway(int fd)
{
	open_leg("m-client-open-leg", fd, 1);
	open_leg("m-client-open-leg-wrong-cookie", fd, 2);
}

static int cmd_server(uint32_t port, uint64_t mib)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = XEN_DOMID_ANY };
	int l = socket(fam, SOCK_STREAM, 0), c;
	long v;

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 4)) {
		result("m-server-listen", 0, "%s", strerror(errno));
		return 1;
	}
	c = accept(l, NULL, NULL);
	result("m-server-accept", c >= 0, c < 0 ? "%s" : NULL, strerror(errno));
	if (c < 0)
		return 1;
	stream("m-server-stream", c, mib << 20, 0x5eed0001, 0x5eed0002, server_midway);
	/* the client's legs reach our listener: one good, one wrong cookie,
	 * plus its raw hellos (garbage, unknown connection) */
	v = wait_stat("tcp_legs_in", 1, 20);
	result("m-server-leg-authenticated", v == 1, "tcp_legs_in %ld (want 1)", v);
	v = wait_stat("tcp_bad_cookie", 1, 20);
	result("m-server-wrong-cookie-refused", v == 1, "tcp_bad_cookie %ld (want 1)", v);
	v = wait_stat("tcp_malformed", 1, 20);
	result("m-server-garbage-refused", v == 1, "tcp_malformed %ld (want 1)", v);
	v = wait_stat("tcp_unknown_conn", 1, 20);
	result("m-server-unknown-conn-refused", v == 1, "tcp_unknown_conn %ld (want 1)", v);
	v = wait_stat("tcp_timed_out", 1, 20);
	result("m-server-silent-timed-out", v == 1, "tcp_timed_out %ld (want 1)", v);
	v = afx_stat("tcp_legs_out");
	result("m-server-leg-out", v == 1, "tcp_legs_out %ld (want 1)", v);
	v = afx_stat("tcp_legs_held");
	result("m-server-legs-held", v == 2, "tcp_legs_held %ld (want 2: ours and the client's)", v);
	print_stats();
	/* the client closes after its checks: EOF, then the legs go with the connection */
	{
		char b;
		struct pollfd p = { .fd = c, .events = POLLIN };

		fcntl(c, F_SETFL, fcntl(c, F_GETFL) & ~O_NONBLOCK);
		poll(&p, 1, 120000);
		result("m-server-eof", recv(c, &b, 1, 0) == 0, NULL);
	}
	close(c);
	close(l);
	v = wait_stat("tcp_legs_held", 0, 20);
	result("m-server-legs-released", v == 0, "tcp_legs_held %ld after close (want 0)", v);
	return failures > 100 ? 100 : failures;
}

/* a raw TCP connection to the peer's leg listener sending `n` bytes:
 * the peer must close it (EOF or reset) within 20 s */
static void raw_hello(const char *name, const char *ip, int port, const uint8_t *msg, size_t n)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	int s = socket(AF_INET, SOCK_STREAM, 0);
	double end = now() + 120;
	char b;
	ssize_t r;

	inet_pton(AF_INET, ip, &a.sin_addr);
	/* the peer's module may not be loaded yet: retry */
	while (connect(s, (struct sockaddr *)&a, sizeof(a)) != 0) {
		if (now() > end) {
			result(name, 0, "connect %s:%d: %s", ip, port, strerror(errno));
			close(s);
			return;
		}
		close(s);
		sleep(1);
		s = socket(AF_INET, SOCK_STREAM, 0);
	}
	if (n && send(s, msg, n, MSG_NOSIGNAL) != (ssize_t)n) {
		result(name, 0, "send: %s", strerror(errno));
		close(s);
		return;
	}
	struct timeval tv = { .tv_sec = 20 };
	setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	r = recv(s, &b, 1, 0);
	result(name, r == 0 || (r < 0 && errno == ECONNRESET), "peer %s", r == 0 ? "closed" : r < 0 ? strerror(errno) : "sent data");
	close(s);
}

static int cmd_client(uint32_t peer, uint32_t port, uint64_t mib, const char *legip, int legport)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = peer };
	uint8_t garbage[16];
	/* TcpHello{conn_id 0xdeadbeef, cookie 1}: version 1, kind 16, body 8, LE */
	uint8_t unknown[16] = { 1, 16, 8, 0, 0xef, 0xbe, 0xad, 0xde, 1, 0, 0, 0, 0, 0, 0, 0 };
	double end = now() + 120;
	int c = -1;

	memset(garbage, 0x5a, sizeof(garbage));
	/* a leg that never says hello: closed at the peer's 5 s hello deadline */
	{
		double t0 = now();

		raw_hello("m-client-silent-closed", legip, legport, garbage, 0);
		printf("silent leg closed after %.1f s\n", now() - t0);
	}
	raw_hello("m-client-garbage-closed", legip, legport, garbage, sizeof(garbage));
	raw_hello("m-client-unknown-conn-closed", legip, legport, unknown, sizeof(unknown));
	while (now() < end) {
		c = socket(fam, SOCK_STREAM, 0);
		if (connect(c, (struct sockaddr *)&a, sizeof(a)) == 0)
			break;
		close(c);
		c = -1;
		sleep(1);
	}
	result("m-client-connect", c >= 0, c < 0 ? "%s" : NULL, strerror(errno));
	if (c < 0)
		return 1;
	stream("m-client-stream", c, mib << 20, 0x5eed0002, 0x5eed0001, client_midway);
	long v = wait_stat("tcp_legs_in", 1, 20);
	result("m-client-leg-authenticated", v == 1, "tcp_legs_in %ld (want 1: the server's)", v);
	v = afx_stat("tcp_legs_out");
	result("m-client-legs-out", v == 2, "tcp_legs_out %ld (want 2)", v);
	v = afx_stat("tcp_bad_cookie");
	result("m-client-no-refusal", v == 0, "tcp_bad_cookie %ld (want 0)", v);
	print_stats();
	/* give the server time for its counter checks before our close */
	sleep(3);
	close(c);
	v = wait_stat("tcp_legs_held", 0, 20);
	result("m-client-legs-released", v == 0, "tcp_legs_held %ld after close (want 0)", v);
	return failures > 100 ? 100 : failures;
}

/* this domain's one ESTABLISHED AF_XEN connection in /proc/net/af_xen:
 * its carrier column and switch counts; 0 when found */
static int proc_carrier(char *carrier, size_t n, long *to_tcp, long *to_ring)
{
	FILE *f = fopen("/proc/net/af_xen", "r");
	char line[512];
	int found = -1;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char st[32], c[32];
		long t, r;

		/* state local peer rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier to_tcp to_ring */
		if (sscanf(line, "%31s %*s %*s %*s %*s %*s %*s %*s %*s %31s %ld %ld", st, c, &t, &r) == 4 && !strcmp(st, "ESTABLISHED")) {
			snprintf(carrier, n, "%s", c);
			*to_tcp = t;
			*to_ring = r;
			found = 0;
		}
	}
	fclose(f);
	return found;
}

static void show_proc(void)
{
	print_file("/proc/net/af_xen");
}

#define MIB (1ull << 20)

/* the client's phases (see the comment at the top) */
struct phases {
	int phase;
	double since;
	uint64_t sent0, got0;
	/* "mv": dom0 ends and remakes the link directories; "sv": dom0 saves
	 * and restores the server's domain (and makes the new pair's links) */
	const char *pfx;
	/* mv, phase 2 (on TCP): reads poll called readable, and how many of
	 * them FIONREAD said 0 for (it must count the bytes taken off TCP) */
	long fionread_polls, fionread_zero;
	/* mv, phase 2: a recv and a send with an unmapped buffer must say
	 * EFAULT and move no byte (the stream's own check sees any loss):
	 * 0 not tried yet, 1 EFAULT, -1 anything else; sends that found the
	 * leg full (EAGAIN) are tried again, at most efault_send_tries times */
	int efault_recv, efault_send, efault_send_tries;
	char efault_detail[96];
	/* mv, phase 2: one blocking send of 4 MiB with SO_SNDTIMEO 20 ms on
	 * the leg (a writer whose wait for room times out hands what it left
	 * queued back to the work item): 0 not yet, 1 it returned a count or
	 * EAGAIN within 5 s, -1 anything else; the stream's check sees loss */
	int timed_send;
	char timed_detail[96];
	/* the same with a signal (SIGALRM after 20 ms, no SA_RESTART) ending
	 * the wait instead of the timeout: a count or EINTR */
	int signalled_send;
	char signalled_detail[96];
	/* mv, phase 2, after the EFAULT send: a non-blocking 64 KiB send (a
	 * 9-byte frame in front of a full one on the leg) whose buffer is
	 * mapped for its first 9 bytes only must take those 9, as TCP's
	 * send takes what it copied before a fault; 0 not yet, 1 it did,
	 * -1 anything else; tries as efault_send's */
	int edge_send, edge_send_tries;
	char edge_detail[96];
	/* mv, phase 2, after the signalled send: the client reads nothing for
	 * peer_lost_ms + 4 s while the server keeps sending, so the server's
	 * leg sits on a zero window past the carrier's bound (its peer alive,
	 * answering probes): 0 not yet, 1 pausing until pause_until, 2 done;
	 * a reset or lost byte fails the stream's own check */
	int pause;
	double pause_until, pause_s;
};

/* the module's peer_lost_ms, or -1 */
static long peer_lost_ms(void)
{
	FILE *f = fopen("/sys/module/af_xen/parameters/peer_lost_ms", "r");
	long v = -1;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static void presult(const struct phases *ph, const char *what, int ok, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void presult(const struct phases *ph, const char *what, int ok, const char *fmt, ...)
{
	char name[64], detail[200];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	snprintf(name, sizeof(name), "%s-client-%s", ph->pfx, what);
	result(name, ok, "%s", detail);
}

static void phase_to(struct phases *ph, int next, uint64_t sent, uint64_t got)
{
	ph->phase = next;
	ph->since = now();
	ph->sent0 = sent;
	ph->got0 = got;
}

/* one step of the client's phase machine; 1 when it is time to finish */
static int client_tick(struct phases *ph, uint64_t sent, uint64_t got)
{
	char c[32] = "?";
	long t = -1, r = -1;
	int ok = proc_carrier(c, sizeof(c), &t, &r) == 0;
	double waited = now() - ph->since;
	int save = !strcmp(ph->pfx, "sv");

	switch (ph->phase) {
	case 0: /* on the ring: stream 8 MiB each way, then ask for the move */
		if (sent - ph->sent0 >= 8 * MIB && got - ph->got0 >= 8 * MIB) {
			presult(ph, "ring-before", ok && !strcmp(c, "ring-xen"), "carrier %s to_tcp %ld", c, t);
			printf("m-phase %s\n", save ? "save-now" : "ring-ok");
			fflush(stdout);
			phase_to(ph, 1, sent, got);
		}
		return 0;
	case 1: /* the peer's link goes away: both directions go to TCP */
		if (ok && (save ? t >= 2 : !strcmp(c, "tcp"))) {
			presult(ph, "switched-to-tcp", t >= 2, "carrier %s after %.1f s, to_tcp %ld", c, waited, t);
			show_proc();
			phase_to(ph, 2, sent, got);
		} else if (waited > (save ? 180 : 60)) {
			presult(ph, "switched-to-tcp", 0, "carrier still %s after %.0f s (to_tcp %ld)", c, waited, t);
			show_proc();
			return 1;
		}
		return 0;
	case 2: /* keep streaming: 16 MiB each way (on TCP while the link is away) */
		if (sent - ph->sent0 >= 16 * MIB && got - ph->got0 >= 16 * MIB) {
			if (save)
				presult(ph, "streamed-after-move", 1, "16 MiB each way in %.1f s, carrier %s", waited, c);
			else {
				presult(ph, "streamed-on-tcp", ok && !strcmp(c, "tcp"), "16 MiB each way in %.1f s, carrier %s", waited, c);
				presult(ph, "fionread-on-tcp", ph->fionread_polls > 0 && ph->fionread_zero == 0,
					"FIONREAD 0 in %ld of %ld readable polls on TCP", ph->fionread_zero, ph->fionread_polls);
				presult(ph, "sndtimeo-on-tcp", ph->timed_send == 1, "%s",
					ph->timed_send ? ph->timed_detail : "not tried");
				presult(ph, "signal-send-on-tcp", ph->signalled_send == 1, "%s",
					ph->signalled_send ? ph->signalled_detail : "not tried");
				presult(ph, "fault-part-way-on-tcp", ph->edge_send == 1, "64 KiB send, 9 bytes mapped: %s",
					ph->edge_send ? ph->edge_detail : "not tried");
				presult(ph, "reader-pause-on-tcp", ph->pause == 2,
					"%s", ph->pause == 2 ? "read nothing for peer_lost_ms + 4 s, then the stream went on" :
					ph->pause ? "still pausing" : "not tried (peer_lost_ms above 20 s?)");
				presult(ph, "efault-on-tcp", ph->efault_recv == 1 && ph->efault_send == 1,
					"recv %s, send %s%s", ph->efault_recv == 1 ? "EFAULT" : ph->efault_recv ? "wrong" : "not tried",
					ph->efault_send == 1 ? "EFAULT" : ph->efault_send ? "wrong" : "not tried", ph->efault_detail);
			}
			printf("m-phase %s\n", save ? "moved-ok" : "tcp-ok");
			fflush(stdout);
			phase_to(ph, 3, sent, got);
		} else if (waited > 180) {
			presult(ph, save ? "streamed-after-move" : "streamed-on-tcp", 0, "only %llu/%llu bytes in 180 s",
				(unsigned long long)(sent - ph->sent0), (unsigned long long)(got - ph->got0));
			return 1;
		}
		return 0;
	case 3: /* co-resident again: back to (new) rings */
		if (ok && !strcmp(c, "ring-xen") && r >= 2) {
			presult(ph, "back-on-ring", 1, "after %.1f s, to_tcp %ld to_ring %ld", waited, t, r);
			show_proc();
			phase_to(ph, 4, sent, got);
		} else if (waited > 90) {
			presult(ph, "back-on-ring", 0, "carrier %s to_ring %ld after 90 s", c, r);
			show_proc();
			return 1;
		}
		return 0;
	case 4: /* 8 MiB more each way on the new rings, then finish */
		if (sent - ph->sent0 >= 8 * MIB && got - ph->got0 >= 8 * MIB) {
			presult(ph, "streamed-on-new-ring", ok && !strcmp(c, "ring-xen"), "carrier %s", c);
			return 1;
		}
		if (waited > 120) {
			presult(ph, "streamed-on-new-ring", 0, "stalled on the new ring");
			return 1;
		}
		return 0;
	}
	return 1;
}

/*
 * Both directions at once without a set length: send the pattern until
 * told to finish (client: its phases; server: the client's EOF), then
 * shutdown(SHUT_WR); read and check until EOF.
 */
/* SIGALRM ends a blocking send (signal-send-on-tcp) */
static void on_alarm(int sig)
{
	(void)sig;
}

static int stream_open(const char *name, int fd, uint32_t txseed, uint32_t rxseed, int client, const char *pfx)
{
	static uint8_t buf[65536];
	uint64_t sent = 0, got = 0, bad_at = UINT64_MAX;
	int wr_done = 0, rd_done = 0;
	double t0 = now(), last = now();
	struct phases ph = { 0, now(), 0, 0, pfx, 0, 0, 0, 0, 0, "", 0, "", 0, "", 0, 0, "", 0, 0, 0 };
	/* an address no process maps (the first page) */
	void *const unmapped = (void *)8;

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	while (!rd_done || !wr_done) {
		int pausing = 0;

		if (client && ph.phase == 2 && !strcmp(pfx, "mv") && ph.signalled_send != 0 && ph.pause < 2) {
			long b = peer_lost_ms();

			if (ph.pause == 0 && b > 0 && b <= 20000) {
				ph.pause = 1;
				ph.pause_s = b / 1000.0 + 4;
				ph.pause_until = now() + ph.pause_s;
				printf("%s: reading nothing for %.1f s (peer_lost_ms %ld)\n", name, ph.pause_s, b);
				fflush(stdout);
			}
			if (ph.pause == 1 && now() >= ph.pause_until)
				ph.pause = 2;
			pausing = ph.pause == 1;
		}
		struct pollfd p = { .fd = fd, .events = (wr_done ? 0 : POLLOUT) | (rd_done || pausing ? 0 : POLLIN) };
		int progress = 0;

		if (poll(&p, 1, 200) < 0) {
			result(name, 0, "poll: %s", strerror(errno));
			return -1;
		}
		if (!wr_done && (p.revents & (POLLOUT | POLLERR | POLLHUP))) {
			ssize_t w;

			if (client && ph.phase == 2 && !strcmp(pfx, "mv") && ph.efault_send == 0 &&
			    (p.revents & POLLOUT) && ph.efault_send_tries++ < 50) {
				w = send(fd, unmapped, 4096, MSG_NOSIGNAL);
				if (w < 0 && errno == EFAULT)
					ph.efault_send = 1;
				else if (!(w < 0 && errno == EAGAIN)) {
					ph.efault_send = -1;
					snprintf(ph.efault_detail, sizeof(ph.efault_detail), " (send: %zd, %s)", w,
						 w < 0 ? strerror(errno) : "bytes taken");
				}
			}

			if (client && ph.phase == 2 && !strcmp(pfx, "mv") && ph.efault_send != 0 && ph.edge_send == 0 &&
			    (p.revents & POLLOUT)) {
				static uint8_t *page;

				if (!page) {
					page = mmap(NULL, 8192, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
					if (page == MAP_FAILED || munmap(page + 4096, 4096)) {
						page = NULL;
						ph.edge_send = -1;
						snprintf(ph.edge_detail, sizeof(ph.edge_detail), "mmap: %s", strerror(errno));
					}
				}
				if (page) {
					uint8_t *edge = page + 4096 - 9;

					fill_pattern(edge, 9, sent, txseed);
					w = send(fd, edge, 65536, MSG_NOSIGNAL);
					if (w == 9) {
						sent += 9;
						ph.edge_send = 1;
						snprintf(ph.edge_detail, sizeof(ph.edge_detail), "took the 9 mapped bytes");
					} else if (!(w < 0 && errno == EAGAIN) || ++ph.edge_send_tries >= 50) {
						ph.edge_send = -1;
						snprintf(ph.edge_detail, sizeof(ph.edge_detail), "send: %zd%s%s", w,
							 w < 0 ? ", " : "", w < 0 ? strerror(errno) : "");
					}
				}
			}

			if (client && ph.phase == 2 && !strcmp(pfx, "mv") && ph.edge_send != 0 && ph.timed_send == 0 &&
			    (p.revents & POLLOUT)) {
				static uint8_t big[4 << 20];
				struct timeval tv = { .tv_usec = 20000 };
				double t = now();

				fill_pattern(big, sizeof(big), sent, txseed);
				setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
				fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
				w = send(fd, big, sizeof(big), MSG_NOSIGNAL);
				int e = errno;
				double took = now() - t;

				fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
				tv.tv_usec = 0;
				setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
				if (w > 0)
					sent += w;
				ph.timed_send = ((w > 0) || (w < 0 && e == EAGAIN)) && took < 5 ? 1 : -1;
				snprintf(ph.timed_detail, sizeof(ph.timed_detail), "send of 4 MiB: %zd (%s) in %.3f s", w,
					 w < 0 ? strerror(e) : w < (ssize_t)sizeof(big) ? "timed out part way" : "all",
					 took);
			} else if (client && ph.phase == 2 && !strcmp(pfx, "mv") && ph.timed_send != 0 &&
				   ph.signalled_send == 0 && (p.revents & POLLOUT)) {
				static uint8_t big[4 << 20];
				struct sigaction sa = { .sa_handler = on_alarm }; /* no SA_RESTART */
				struct itimerval it = { .it_value = { .tv_usec = 20000 } };
				double t = now();

				fill_pattern(big, sizeof(big), sent, txseed);
				sigaction(SIGALRM, &sa, NULL);
				fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
				setitimer(ITIMER_REAL, &it, NULL);
				w = send(fd, big, sizeof(big), MSG_NOSIGNAL);
				int e = errno;
				double took = now() - t;

				it.it_value.tv_usec = 0;
				setitimer(ITIMER_REAL, &it, NULL);
				fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
				if (w > 0)
					sent += w;
				ph.signalled_send = ((w > 0) || (w < 0 && e == EINTR)) && took < 5 ? 1 : -1;
				snprintf(ph.signalled_detail, sizeof(ph.signalled_detail), "send of 4 MiB: %zd (%s) in %.3f s",
					 w, w < 0 ? strerror(e) : w < (ssize_t)sizeof(big) ? "interrupted part way" : "all",
					 took);
			}

			fill_pattern(buf, sizeof(buf), sent, txseed);
			w = send(fd, buf, sizeof(buf), MSG_NOSIGNAL);
			if (w < 0 && errno != EAGAIN) {
				result(name, 0, "send: %s at %llu", strerror(errno), (unsigned long long)sent);
				return -1;
			}
			if (w > 0) {
				sent += w;
				progress = 1;
			}
		}
		if (!rd_done && !pausing && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
			uint8_t rb[65536];
			ssize_t r;
			int inq = -1;

			/* poll said readable: FIONREAD must say how much (not 0),
			 * whichever carrier the bytes came on */
			if (client && ph.phase == 2 && !strcmp(pfx, "mv") && (p.revents & POLLIN) &&
			    !(p.revents & (POLLHUP | POLLERR)) && ioctl(fd, FIONREAD, &inq) == 0) {
				ph.fionread_polls++;
				if (inq == 0)
					ph.fionread_zero++;
				if (inq > 0 && ph.efault_recv == 0) {
					r = recv(fd, unmapped, sizeof(rb), 0);
					ph.efault_recv = r < 0 && errno == EFAULT ? 1 : -1;
					if (ph.efault_recv < 0)
						snprintf(ph.efault_detail, sizeof(ph.efault_detail), " (recv: %zd, %s)", r,
							 r < 0 ? strerror(errno) : "bytes taken");
				}
			}
			r = recv(fd, rb, sizeof(rb), 0);

			if (r == 0) {
				rd_done = 1;
				progress = 1;
				if (!client && !wr_done) {
					shutdown(fd, SHUT_WR);
					wr_done = 1;
				}
			} else if (r < 0 && errno != EAGAIN) {
				result(name, 0, "recv: %s at %llu", strerror(errno), (unsigned long long)got);
				show_proc();
				return -1;
			} else if (r > 0) {
				check_pattern(rb, r, got, rxseed, &bad_at);
				got += r;
				progress = 1;
			}
		}
		if (progress)
			last = now();
		else if (now() - last > 120) {
			result(name, 0, "stalled: sent %llu got %llu", (unsigned long long)sent, (unsigned long long)got);
			show_proc();
			return -1;
		}
		if (client && !wr_done && client_tick(&ph, sent, got)) {
			shutdown(fd, SHUT_WR);
			wr_done = 1;
		}
	}
	if (bad_at != UINT64_MAX) {
		result(name, 0, "byte %llu differs from the pattern", (unsigned long long)bad_at);
		return -1;
	}
	result(name, 1, "%llu bytes sent, %llu received, intact, %.1f s", (unsigned long long)sent, (unsigned long long)got, now() - t0);
	return 0;
}

static int cmd_move_server(uint32_t port, const char *pfx)
{
	char nm[64];
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = XEN_DOMID_ANY };
	int l = socket(fam, SOCK_STREAM, 0), c;
	char car[32] = "?";
	long t = -1, r = -1;

	snprintf(nm, sizeof(nm), "%s-server-listen", pfx);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 4)) {
		result(nm, 0, "%s", strerror(errno));
		return 1;
	}
	c = accept(l, NULL, NULL);
	snprintf(nm, sizeof(nm), "%s-server-accept", pfx);
	result(nm, c >= 0, c < 0 ? "%s" : NULL, strerror(errno));
	if (c < 0)
		return 1;
	snprintf(nm, sizeof(nm), "%s-server-stream", pfx);
	stream_open(nm, c, 0x5eed0011, 0x5eed0012, 0, pfx);
	proc_carrier(car, sizeof(car), &t, &r);
	/* each direction left the ring once and came back once */
	snprintf(nm, sizeof(nm), "%s-server-switch-counts", pfx);
	result(nm, t >= 2 && r >= 2, "carrier %s to_tcp %ld to_ring %ld", car, t, r);
	show_proc();
	print_stats();
	close(c);
	close(l);
	return failures > 100 ? 100 : failures;
}

/* connects to peer:port, trying again each second for 120 s; -1 if never */
static int connect_retry(uint32_t peer, uint32_t port)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = peer };
	double end = now() + 120;

	while (now() < end) {
		int c = socket(fam, SOCK_STREAM, 0);

		if (connect(c, (struct sockaddr *)&a, sizeof(a)) == 0)
			return c;
		close(c);
		sleep(1);
	}
	return -1;
}

/* one send of the next 64 KiB of the pattern (less where the stream ends
 * at `end`; UINT64_MAX: endless): send's result */
static ssize_t send_pattern(int c, uint64_t *sent, uint32_t seed, uint64_t end)
{
	static uint8_t buf[65536];
	size_t len = end - *sent < sizeof(buf) ? end - *sent : sizeof(buf);
	ssize_t n;

	fill_pattern(buf, len, *sent, seed);
	n = send(c, buf, len, MSG_NOSIGNAL);
	if (n > 0)
		*sent += n;
	return n;
}

static int cmd_move_client(uint32_t peer, uint32_t port, const char *pfx)
{
	char nm[64];
	int c = connect_retry(peer, port);

	snprintf(nm, sizeof(nm), "%s-client-connect", pfx);
	result(nm, c >= 0, c < 0 ? "%s" : NULL, strerror(errno));
	if (c < 0)
		return 1;
	snprintf(nm, sizeof(nm), "%s-client-stream", pfx);
	stream_open(nm, c, 0x5eed0012, 0x5eed0011, 1, pfx);
	show_proc();
	print_stats();
	close(c);
	return failures > 100 ? 100 : failures;
}

/*
 * dead-server: the peer dies with the connection on TCP. Accept one
 * connection (dead-client's), stream both ways; on the ring after 4 MiB
 * each way print "m-phase dead-ring-ok" (dom0 ends the pair's link
 * directories), on TCP "m-phase dead-tcp-ok" (dom0 destroys the client's
 * domain). From then the server keeps sending into legs nobody answers:
 * the connection must end in ECONNRESET once a leg stayed unanswered for
 * peer_lost_ms (the module's parameter), within that plus 30 s of
 * dead-tcp-ok, and everything received before must be intact.
 */
static int cmd_dead_server(uint32_t port)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = XEN_DOMID_ANY };
	int l = socket(fam, SOCK_STREAM, 0), c, phase = 0;
	static uint8_t rb[65536];
	uint64_t sent = 0, got = 0, bad_at = UINT64_MAX;
	double t_tcp = 0, end = now() + 600;
	long bound = peer_lost_ms();
	char why[160] = "";

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 4)) {
		result("dd-server-listen", 0, "%s", strerror(errno));
		return 1;
	}
	/* the victim connects within its 120 s of retries, or never */
	struct pollfd pl = { .fd = l, .events = POLLIN };

	errno = 0;
	c = poll(&pl, 1, 300 * 1000) == 1 ? accept(l, NULL, NULL) : -1;
	result("dd-server-accept", c >= 0, c < 0 ? "%s" : NULL, errno ? strerror(errno) : "no connection in 300 s");
	if (c < 0)
		return 1;
	fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
	while (!why[0] && now() < end) {
		struct pollfd p = { .fd = c, .events = POLLIN | POLLOUT };
		char car[32] = "?";
		long t = -1, r = -1;
		ssize_t n;

		poll(&p, 1, 200);
		if ((p.revents & POLLOUT) && send_pattern(c, &sent, 0x5eed0021, UINT64_MAX) < 0 && errno != EAGAIN)
			snprintf(why, sizeof(why), "send: %s", strerror(errno));
		if (!why[0] && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
			n = recv(c, rb, sizeof(rb), 0);
			if (n > 0) {
				check_pattern(rb, n, got, 0x5eed0022, &bad_at);
				got += n;
			} else if (n == 0)
				snprintf(why, sizeof(why), "EOF");
			else if (errno != EAGAIN)
				snprintf(why, sizeof(why), "recv: %s", strerror(errno));
		}
		proc_carrier(car, sizeof(car), &t, &r);
		if (phase == 0 && sent >= 4 * MIB && got >= 4 * MIB && !strcmp(car, "ring-xen")) {
			printf("m-phase dead-ring-ok\n");
			phase = 1;
		} else if (phase == 1 && !strcmp(car, "tcp")) {
			printf("m-phase dead-tcp-ok\n");
			t_tcp = now();
			phase = 2;
		}
	}
	double after = t_tcp ? now() - t_tcp : -1;
	int reset = strstr(why, strerror(ECONNRESET)) != NULL;

	result("dd-server-reset", phase == 2 && reset && bound > 0 && after <= bound / 1000.0 + 30,
	       "%s %.1f s after the connection went to TCP (peer_lost_ms %ld, phase %d)",
	       why[0] ? why : "no end", after, bound, phase);
	result("dd-server-intact", bad_at == UINT64_MAX && got > 0, "%llu bytes received%s",
	       (unsigned long long)got, bad_at == UINT64_MAX ? ", intact" : ", corrupted");
	show_proc();
	close(c);
	close(l);
	return failures > 100 ? 100 : failures;
}

/* dead-client: the victim, streams both ways until its domain is destroyed */
static int cmd_dead_client(uint32_t peer, uint32_t port)
{
	static uint8_t rb[65536];
	uint64_t sent = 0;
	int c = connect_retry(peer, port);

	if (c < 0)
		return 1;
	fcntl(c, F_SETFL, fcntl(c, F_GETFL) | O_NONBLOCK);
	for (;;) {
		struct pollfd p = { .fd = c, .events = POLLIN | POLLOUT };
		ssize_t n;

		poll(&p, 1, 200);
		if (p.revents & POLLOUT)
			send_pattern(c, &sent, 0x5eed0022, UINT64_MAX);
		if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
			n = recv(c, rb, sizeof(rb), 0);
			if (n == 0 || (n < 0 && errno != EAGAIN))
				return 1;
		}
	}
}

/* waits up to `secs` until the counter NAME is at most `most`; its last value */
static long wait_stat_at_most(const char *name, long most, int secs)
{
	double end = now() + secs;
	long v;

	while ((v = afx_stat(name)) > most && now() < end)
		usleep(100000);
	return v;
}

/* waits up to `secs` until this domain's connection is on carrier `want` */
static int wait_carrier(const char *want, int secs)
{
	double end = now() + secs;
	char c[32] = "?";
	long t, r;

	do {
		if (proc_carrier(c, sizeof(c), &t, &r) == 0 && !strcmp(c, want))
			return 1;
		usleep(100000);
	} while (now() < end);
	return 0;
}

#define CF_BYTES (4 * MIB)
#define CF_SEED 0x5eed0031

/*
 * closefirst-server: once the connection is on TCP, send CF_BYTES of the
 * pattern and close at once (what is still queued must arrive); the
 * socket must then be gone within 10 s.
 */
static int cmd_closefirst_server(uint32_t port)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = XEN_DOMID_ANY };
	long base = afx_stat("sockets");
	int l = socket(fam, SOCK_STREAM, 0), c;
	uint64_t sent = 0;
	char why[96] = "";

	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 4)) {
		result("cf-server-listen", 0, "%s", strerror(errno));
		return 1;
	}
	c = accept(l, NULL, NULL);
	result("cf-server-accept", c >= 0, c < 0 ? "%s" : NULL, strerror(errno));
	close(l);
	if (c < 0)
		return 1;
	result("cf-server-on-tcp", wait_carrier("tcp", 180), "the client has dom0 end the pair's link");
	while (sent < CF_BYTES && !why[0])
		if (send_pattern(c, &sent, CF_SEED, CF_BYTES) < 0 && errno != EINTR)
			snprintf(why, sizeof(why), "send: %s", strerror(errno));
	result("cf-server-sent", sent == CF_BYTES, "%llu bytes%s%s", (unsigned long long)sent, why[0] ? ", " : "", why);
	close(c);
	long v = wait_stat_at_most("sockets", base, 10);

	result("cf-server-socket-freed", v >= 0 && v <= base, "sockets %ld, %ld before the test", v, base);
	return failures > 100 ? 100 : failures;
}

/*
 * closefirst-client: connect, print "m-phase cf-ring-ok" on the ring (dom0
 * ends the pair's link directories: the connection goes to TCP), then read
 * the server's CF_BYTES up to its EOF, checked. The server closed first:
 * its legs are gone, so a send must fail with EPIPE (or ECONNRESET, as
 * TCP's after the peer's RST) within 10 s, and after our close the socket
 * must be gone within 10 s (not held on for peer_lost_ms, 90 s here).
 * Then "m-phase cf-done" (dom0 links the pair again).
 */
static int cmd_closefirst_client(uint32_t peer, uint32_t port)
{
	long base = afx_stat("sockets");
	int c = connect_retry(peer, port);
	static uint8_t buf[65536];
	uint64_t got = 0, bad_at = UINT64_MAX;
	double end;
	char why[96] = "";
	int err = 0;

	result("cf-client-connect", c >= 0, c < 0 ? "%s" : NULL, strerror(errno));
	if (c < 0)
		return 1;
	result("cf-client-ring-before", wait_carrier("ring-xen", 60), NULL);
	printf("m-phase cf-ring-ok\n");
	fflush(stdout);
	result("cf-client-on-tcp", wait_carrier("tcp", 120), NULL);
	end = now() + 180;
	while (!why[0]) {
		struct pollfd p = { .fd = c, .events = POLLIN };
		ssize_t n;

		if (now() > end) {
			snprintf(why, sizeof(why), "no EOF within 180 s");
			break;
		}
		if (poll(&p, 1, 1000) != 1)
			continue;
		n = recv(c, buf, sizeof(buf), MSG_DONTWAIT);
		if (n > 0) {
			check_pattern(buf, n, got, CF_SEED, &bad_at);
			got += n;
		} else if (n == 0)
			snprintf(why, sizeof(why), "EOF");
		else if (errno != EAGAIN && errno != EINTR)
			snprintf(why, sizeof(why), "recv: %s", strerror(errno));
	}
	result("cf-client-eof-intact", !strcmp(why, "EOF") && got == CF_BYTES && bad_at == UINT64_MAX,
	       "%s after %llu bytes%s", why, (unsigned long long)got, bad_at == UINT64_MAX ? "" : ", corrupted");
	for (end = now() + 10; !err && now() < end;) {
		if (send(c, buf, sizeof(buf), MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN && errno != EINTR)
			err = errno;
		else
			usleep(100000);
	}
	result("cf-client-epipe", err == EPIPE || err == ECONNRESET, "send after the peer closed: %s",
	       err ? strerror(err) : "no error within 10 s");
	close(c);
	long v = wait_stat_at_most("sockets", base, 10);

	result("cf-client-socket-freed", v >= 0 && v <= base, "sockets %ld, %ld before the test", v, base);
	printf("m-phase cf-done\n");
	fflush(stdout);
	return failures > 100 ? 100 : failures;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	fam = xensock_family();
	if (fam < 0) {
		result("m-family", 0, "%s", strerror(errno));
		return 1;
	}
	if (argc == 2 && !strcmp(argv[1], "eperm")) {
		int s = socket(fam, SOCK_STREAM, 0), mode = 1;
		int r = setsockopt(s, fam, XENSOCK_TEST_OPEN_LEG, &mode, sizeof(mode));

		result("m-open-leg-eperm", r < 0 && errno == EPERM, "setsockopt: %s", r < 0 ? strerror(errno) : "0");
		close(s);
		return failures;
	}
	if (argc == 4 && !strcmp(argv[1], "server"))
		return cmd_server(strtoul(argv[2], NULL, 0), strtoull(argv[3], NULL, 0));
	if ((argc == 3 || argc == 4) && !strcmp(argv[1], "move-server"))
		return cmd_move_server(strtoul(argv[2], NULL, 0), argc == 4 ? argv[3] : "mv");
	if ((argc == 4 || argc == 5) && !strcmp(argv[1], "move-client"))
		return cmd_move_client(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0), argc == 5 ? argv[4] : "mv");
	if (argc == 3 && !strcmp(argv[1], "dead-server"))
		return cmd_dead_server(strtoul(argv[2], NULL, 0));
	if (argc == 3 && !strcmp(argv[1], "closefirst-server"))
		return cmd_closefirst_server(strtoul(argv[2], NULL, 0));
	if (argc == 4 && !strcmp(argv[1], "closefirst-client"))
		return cmd_closefirst_client(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
	if (argc == 4 && !strcmp(argv[1], "dead-client"))
		return cmd_dead_client(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
	if (argc == 7 && !strcmp(argv[1], "client"))
		return cmd_client(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0), strtoull(argv[4], NULL, 0), argv[5], atoi(argv[6]));
	fprintf(stderr, "usage: see the comment at the top of xstest_migrate.c\n");
	return 2;
}
