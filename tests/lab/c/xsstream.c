// SPDX-License-Identifier: GPL-2.0
/*
 * xsstream: one checksummed bidirectional stream, for the lab's migration
 * scenarios (tests/lab/migration-*, twohost). A plain
 * socket program: nothing in it knows about migration; whatever keeps the
 * connection alive while a domain moves is below the socket API.
 *
 *   xsstream server xen|tcp PORT NAME [options]
 *   xsstream client xen|tcp PEER PORT NAME [options]
 *       xen: AF_XEN (family from /sys/module/af_xen/parameters/family),
 *            PEER a domid; tcp: IPv4, PEER an address (the baseline)
 *   options:
 *     --rate KIB       send at most KIB KiB/s (default 1024; 0: unlimited)
 *     --stop FILE      stop sending once FILE exists (default /tmp/NAME.stop)
 *     --status FILE    rewrite FILE each second: "sent S got G gap MAXGAP t T"
 *                      (default /tmp/NAME.status)
 *     --stall S        no byte received for S seconds while data is due
 *                      fails the stream (default 180)
 *     --max S          give up after S seconds in all (default 1500)
 *
 * Each side sends a pattern keyed by the byte's offset (seed 1 client ->
 * server, 2 server -> client), so a byte lost, duplicated, reordered or
 * corrupted shows as a mismatch at a known offset. When the stop file
 * appears it sends an 8-byte end marker (its total, xored with a constant)
 * and shuts its sending side down; the receiver holds back the last 8
 * bytes it read, checks everything before them, and at EOF compares the
 * marker with what it got. Results:
 *   @@RESULT c-NAME-connect PASS|FAIL
 *   @@RESULT c-NAME PASS|FAIL sent=S got=G max_gap=X  (or why it failed:
 *       "mismatch at offset N", "EOF at offset N without the end marker",
 *       "lost N bytes: peer sent T, got G", "stalled ...", "recv: errno")
 *   @@METRIC NAME.max_gap_s / NAME.sent_mib / NAME.got_mib
 *   @@METRIC NAME.silence_s / NAME.suspended_s
 * max_gap_s is the longest time without a received byte on CLOCK_MONOTONIC,
 * which stands still while this guest is suspended (saved, migrating), so
 * on the guest that moved it is the pause beyond its own suspended time;
 * silence_s is the same on CLOCK_BOOTTIME (which counts the suspension),
 * and suspended_s this guest's own suspended time during the stream (how
 * much further CLOCK_BOOTTIME went than CLOCK_MONOTONIC).
 * plus a progress line every 5 s. Exit status: number of failures.
 *
 *   xsstream echo PORT
 *       one AF_XEN listener for the whole scenario: accepts connections one
 *       after another and echoes each until its EOF. Made before any move,
 *       it shows whether a listener survives its guest's moves.
 *   xsstream ping DOMID PORT MESSAGE
 *       connects to DOMID:PORT (retrying for 30 s), sends MESSAGE, half-closes
 *       and checks the echo up to EOF. Exit status 0 if it came back intact.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include "xensock.h"

#include "xstest_common.h"

#define END_MAGIC 0x58534e4450454e44ull /* "XSNDPEND" */
#define CONNECT_S 150 /* a client retries its connect this long */
#define HOLD 8

/* CLOCK_BOOTTIME: counts the time this guest was suspended */
static double boot_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_BOOTTIME, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* a byte arrived: the longest silence so far, on CLOCK_BOOTTIME */
static void note_silence(double *last, double *max)
{
	double tb = boot_now();

	if (tb - *last > *max)
		*max = tb - *last;
	*last = tb;
}

static uint8_t pattern(uint64_t i, uint32_t seed)
{
	uint64_t x = (i >> 2) * 0x9E3779B97F4A7C15ull ^ seed;

	x ^= x >> 29;
	x *= 0xBF58476D1CE4E5B9ull;
	x ^= x >> 32;
	return (uint8_t)(x >> (8 * (i & 3)));
}

static void fill(uint8_t *b, uint64_t off, size_t n, uint32_t seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		b[i] = pattern(off + i, seed);
}

static int read_family(void)
{
	FILE *f = fopen(XENSOCK_FAMILY_SYSFS, "r");
	int v = XENSOCK_FAMILY_DEFAULT;

	if (f) {
		if (fscanf(f, "%d", &v) != 1)
			v = XENSOCK_FAMILY_DEFAULT;
		fclose(f);
	}
	return v;
}

static void usage(void)
{
	fprintf(stderr, "usage: xsstream server xen|tcp PORT NAME [--rate KIB] [--stop FILE] [--status FILE] [--stall S] [--max S]\n"
			"       xsstream client xen|tcp PEER PORT NAME [options]\n"
			"       xsstream echo PORT\n"
			"       xsstream ping DOMID PORT MESSAGE\n");
	exit(100);
}

/* a stuck peer must not hold the serial echo loop or the ping forever */
static void set_timeouts(int fd, int seconds)
{
	struct timeval tv = { .tv_sec = seconds };

	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

static int echo_server(unsigned port)
{
	struct sockaddr_xen a;
	unsigned long n = 0;
	int fd;

	fam = read_family();
	a = xaddr(XEN_DOMID_ANY, port);
	fd = socket(fam, SOCK_STREAM, 0);
	if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 8)) {
		printf("xsstream echo: listen on xen port %u: %s\n", port, strerror(errno));
		return 1;
	}
	printf("xsstream echo: listening on xen port %u\n", port);
	for (;;) {
		struct sockaddr_xen from = { 0 };
		socklen_t flen = sizeof(from);
		char buf[4096];
		unsigned long long echoed = 0;
		ssize_t r = 0;
		int c = accept(fd, (struct sockaddr *)&from, &flen);

		if (c < 0) {
			printf("xsstream echo: accept: %s\n", strerror(errno));
			if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN)
				continue;
			sleep(1);
			continue;
		}
		n++;
		set_timeouts(c, 20);
		while ((r = read(c, buf, sizeof(buf))) > 0 && !write_full(c, buf, (size_t)r))
			echoed += (unsigned long long)r;
		printf("xsstream echo: connection %lu from dom%u (own dom%u): %llu bytes echoed, %s\n", n, from.sxen_domid,
		       own_domid(), echoed, r == 0 ? "EOF" : strerror(errno));
		close(c);
	}
}

static int ping(uint32_t domid, unsigned port, const char *msg)
{
	struct sockaddr_xen a;
	size_t len = strlen(msg), got = 0;
	char buf[4096];
	int fd = -1, err = 0;

	fam = read_family();
	a = xaddr(domid, port);
	for (double end = now() + 30; now() < end; sleep(1)) {
		fd = socket(fam, SOCK_STREAM, 0);
		if (fd < 0) {
			printf("xsstream ping: socket: %s\n", strerror(errno));
			return 1;
		}
		set_timeouts(fd, 20);
		if (!connect(fd, (struct sockaddr *)&a, sizeof(a)))
			break;
		err = errno;
		printf("xsstream ping: connect dom%u:%u: %s\n", domid, port, strerror(err));
		close(fd);
		fd = -1;
	}
	if (fd < 0)
		return 1;
	if (write_full(fd, msg, len) || shutdown(fd, SHUT_WR)) {
		printf("xsstream ping: send to dom%u:%u: %s\n", domid, port, strerror(errno));
		close(fd);
		return 1;
	}
	for (;;) {
		ssize_t r = read(fd, buf + got, sizeof(buf) - got);

		if (r < 0) {
			printf("xsstream ping: recv after %zu bytes: %s\n", got, strerror(errno));
			close(fd);
			return 1;
		}
		if (r == 0 || got + (size_t)r >= sizeof(buf)) {
			got += (size_t)r;
			break;
		}
		got += (size_t)r;
	}
	close(fd);
	if (got != len || memcmp(buf, msg, len)) {
		printf("xsstream ping: dom%u:%u echoed %zu bytes \"%.*s\", sent %zu \"%s\"\n", domid, port, got, (int)got, buf, len,
		       msg);
		return 1;
	}
	printf("xsstream ping: dom%u:%u echoed \"%s\"\n", domid, port, msg);
	return 0;
}

struct opts {
	double rate; /* bytes/s, 0 unlimited */
	char stop[256], status[256];
	double stall, max;
};

static int connect_or_accept(int server, int tcp, const char *peer, unsigned port, const char *name)
{
	char cname[128];
	int fd;

	snprintf(cname, sizeof(cname), "%s-connect", name);
	if (tcp) {
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };

		fd = socket(AF_INET, SOCK_STREAM, 0);
		if (fd < 0) {
			result(cname, 0, "socket: %s", strerror(errno));
			return -1;
		}
		if (server) {
			int one = 1, c;

			setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
			if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1)) {
				result(cname, 0, "bind/listen tcp %u: %s", port, strerror(errno));
				return -1;
			}
			c = accept(fd, NULL, NULL);
			close(fd);
			if (c < 0)
				result(cname, 0, "accept: %s", strerror(errno));
			else
				result(cname, 1, "tcp port %u", port);
			return c;
		}
		if (inet_pton(AF_INET, peer, &a.sin_addr) != 1) {
			result(cname, 0, "bad address %s", peer);
			return -1;
		}
		for (double end = now() + CONNECT_S; now() < end;) {
			if (!connect(fd, (struct sockaddr *)&a, sizeof(a))) {
				result(cname, 1, "tcp %s:%u", peer, port);
				return fd;
			}
			if (errno != ECONNREFUSED && errno != ENETUNREACH && errno != EHOSTUNREACH)
				break;
			sleep(1);
		}
		result(cname, 0, "connect tcp %s:%u: %s", peer, port, strerror(errno));
		close(fd);
		return -1;
	}
	fam = read_family();
	fd = socket(fam, SOCK_STREAM, 0);
	if (fd < 0) {
		result(cname, 0, "socket(%d): %s", fam, strerror(errno));
		return -1;
	}
	if (server) {
		struct sockaddr_xen a = xaddr(XEN_DOMID_ANY, port);
		int c;

		if (bind(fd, (struct sockaddr *)&a, sizeof(a)) || listen(fd, 1)) {
			result(cname, 0, "bind/listen xen %u: %s", port, strerror(errno));
			return -1;
		}
		c = accept(fd, NULL, NULL);
		close(fd);
		if (c < 0)
			result(cname, 0, "accept: %s", strerror(errno));
		else
			result(cname, 1, "af_xen port %u", port);
		return c;
	}
	{
		struct sockaddr_xen a = xaddr((uint32_t)strtoul(peer, NULL, 0), port);

		/* the server may not listen yet, or the link may not be up:
		 * retry for CONNECT_S seconds in all */
		double end = now() + CONNECT_S;

		while (now() < end) {
			if (!connect(fd, (struct sockaddr *)&a, sizeof(a))) {
				result(cname, 1, "af_xen dom%s:%u", peer, port);
				return fd;
			}
			if (errno != ECONNREFUSED && errno != EHOSTUNREACH && errno != ETIMEDOUT && errno != EAGAIN)
				break;
			close(fd);
			sleep(1);
			fd = socket(fam, SOCK_STREAM, 0);
			if (fd < 0)
				break;
		}
		result(cname, 0, "connect af_xen dom%s:%u for %d s: %s", peer, port, CONNECT_S, strerror(errno));
		if (fd >= 0)
			close(fd);
		return -1;
	}
}

static void write_status(const struct opts *o, uint64_t sent, uint64_t got, double gap, double t)
{
	char tmp[300];
	FILE *f;

	snprintf(tmp, sizeof(tmp), "%s.tmp", o->status);
	f = fopen(tmp, "w");
	if (!f)
		return;
	fprintf(f, "sent %llu got %llu gap %.2f t %.1f\n", (unsigned long long)sent, (unsigned long long)got, gap, t);
	fclose(f);
	rename(tmp, o->status);
}

static int stream(int fd, const char *name, const struct opts *o, uint32_t txseed, uint32_t rxseed)
{
	static uint8_t out[65536], in[65536 + HOLD];
	uint64_t sent = 0, got = 0; /* got: bytes received, checked or held */
	uint64_t checked = 0;       /* bytes verified against the pattern */
	size_t held = 0;            /* in[0..held): the last bytes read, unverified */
	ssize_t recv_sizes[8] = { 0 }; /* the last reads' sizes, for a mismatch's report */
	unsigned nrecv = 0;
	uint8_t marker[HOLD];
	size_t marker_off = 0;      /* bytes of the end marker written */
	int stopping = 0, tx_done = 0, rx_done = 0;
	double t0 = now(), last_rx = t0, max_gap = 0, next_progress = t0 + 5, next_status = t0;
	double suspended0 = boot_now() - t0, last_rx_boot = boot_now(), max_silence = 0;
	char why[512] = "";

	/*
	 * XSSTREAM_ET=1: edge-triggered epoll, as tokio and mio use it: read
	 * (write) only after an EPOLLIN (EPOLLOUT) edge, until EAGAIN. The
	 * default poll() looks at the socket again at every call (every 20 ms
	 * while ahead of the rate), which hides a wakeup the socket never sent.
	 */
	const char *et_env = getenv("XSSTREAM_ET");
	int et = et_env && !strcmp(et_env, "1"), ep = -1, can_read = 0, can_write = 0;

	fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	if (et) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET };

		ep = epoll_create1(0);
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev)) {
			snprintf(why, sizeof(why), "epoll: %s", strerror(errno));
			goto out;
		}
		printf("xsstream %s: edge-triggered epoll\n", name);
	}
	while (!tx_done || !rx_done) {
		double t = now();
		int want_out = 0, timeout_ms = 200;
		struct pollfd p = { .fd = fd };
		int n;

		if (t - t0 > o->max) {
			snprintf(why, sizeof(why), "gave up after %.0f s (sent %llu, got %llu, %s)", o->max,
				 (unsigned long long)sent, (unsigned long long)got, tx_done ? "waiting for the peer's end" : "still sending");
			break;
		}
		if (!stopping && !access(o->stop, F_OK)) {
			uint64_t m = sent ^ END_MAGIC;

			stopping = 1;
			memcpy(marker, &m, HOLD);
			printf("xsstream %s: stop at %.1f s: sent %llu, ending\n", name, t - t0, (unsigned long long)sent);
			fflush(stdout);
		}
		if (!tx_done) {
			if (stopping)
				want_out = 1;
			else if (o->rate <= 0 || sent < (t - t0) * o->rate)
				want_out = 1;
			else
				timeout_ms = 20;
		}
		p.events = (want_out ? POLLOUT : 0) | (rx_done ? 0 : POLLIN);
		if (et) {
			struct epoll_event ev;
			int busy = (can_read && !rx_done) || (want_out && can_write);

			n = epoll_wait(ep, &ev, 1, busy ? 0 : timeout_ms);
			if (n > 0) {
				if (ev.events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR))
					can_read = 1;
				if (ev.events & (EPOLLOUT | EPOLLHUP | EPOLLERR))
					can_write = 1;
			}
			p.revents = (can_read ? POLLIN : 0) | (can_write ? POLLOUT : 0);
			if (n >= 0)
				n = p.revents ? 1 : 0;
		} else {
			n = poll(&p, 1, timeout_ms);
		}
		if (n < 0 && errno != EINTR) {
			snprintf(why, sizeof(why), "poll: %s", strerror(errno));
			break;
		}
		t = now();
		if (n > 0 && (p.revents & (POLLIN | POLLHUP | POLLERR)) && !rx_done) {
			ssize_t r = recv(fd, in + held, sizeof(in) - held, 0);

			if (r > 0) {
				size_t total = held + (size_t)r, check = total > HOLD ? total - HOLD : 0, i;

				recv_sizes[nrecv++ % 8] = r;
				for (i = 0; i < check; i++)
					if (in[i] != pattern(checked + i, rxseed)) {
						size_t j, zeros = 0, shift = 0;

						/* what kind of wrong: a run of zeros (a read that
						 * counted bytes it never copied), or the stream
						 * resumed elsewhere (lost or repeated bytes) */
						for (j = i; j < total && in[j] == 0; j++)
							zeros++;
						for (shift = 1; shift < 1 << 20; shift++)
							if (in[i] == pattern(checked + i + shift, rxseed) &&
							    (i + 1 >= total || in[i + 1] == pattern(checked + i + 1 + shift, rxseed)))
								break;
						snprintf(why, sizeof(why),
							 "mismatch at offset %llu: got 0x%02x, expected 0x%02x (bytes lost, duplicated or reordered;"
							 " %zu zero bytes from there, byte %zd of a %zd-byte read, last reads %zd %zd %zd %zd,"
							 " matches the stream %zu bytes on)",
							 (unsigned long long)(checked + i), in[i], pattern(checked + i, rxseed), zeros, (ssize_t)i - (ssize_t)held, r,
							 recv_sizes[(nrecv + 7) % 8], recv_sizes[(nrecv + 6) % 8], recv_sizes[(nrecv + 5) % 8],
							 recv_sizes[(nrecv + 4) % 8], shift);
						goto out;
					}
				checked += check;
				memmove(in, in + check, total - check);
				held = total - check;
				got += (uint64_t)r;
				if (t - last_rx > max_gap)
					max_gap = t - last_rx;
				last_rx = t;
				note_silence(&last_rx_boot, &max_silence);
			} else if (r == 0) {
				uint64_t m, peer_sent;
				size_t i;

				for (i = 0; held == HOLD && i < HOLD; i++)
					if (in[i] != pattern(checked + i, rxseed))
						break;
				if (held < HOLD || i == HOLD) {
					/* fewer than 8 bytes, or 8 that are stream data: no marker */
					snprintf(why, sizeof(why), "EOF at offset %llu without the end marker (peer closed or the connection was dropped)",
						 (unsigned long long)got);
					break;
				}
				memcpy(&m, in, HOLD);
				peer_sent = m ^ END_MAGIC;
				if (peer_sent != checked) {
					if (peer_sent > checked)
						snprintf(why, sizeof(why), "lost %llu bytes: peer sent %llu, got %llu before its end marker",
							 (unsigned long long)(peer_sent - checked), (unsigned long long)peer_sent, (unsigned long long)checked);
					else
						snprintf(why, sizeof(why), "end marker says %llu bytes, got %llu (garbled end)",
							 (unsigned long long)peer_sent, (unsigned long long)checked);
					break;
				}
				rx_done = 1;
				if (t - last_rx > max_gap)
					max_gap = t - last_rx;
				note_silence(&last_rx_boot, &max_silence);
				printf("xsstream %s: peer's end after %llu bytes, all checked\n", name, (unsigned long long)checked);
				fflush(stdout);
			} else if (errno == EAGAIN || errno == EWOULDBLOCK) {
				can_read = 0;
			} else if (errno != EINTR) {
				snprintf(why, sizeof(why), "recv at offset %llu: %s", (unsigned long long)got, strerror(errno));
				break;
			}
		}
		if (want_out && n > 0 && (p.revents & POLLOUT)) {
			ssize_t w;

			if (stopping) {
				w = send(fd, marker + marker_off, HOLD - marker_off, MSG_NOSIGNAL);
				if (w > 0) {
					marker_off += (size_t)w;
					if (marker_off == HOLD) {
						if (shutdown(fd, SHUT_WR)) {
							snprintf(why, sizeof(why), "shutdown(SHUT_WR): %s", strerror(errno));
							break;
						}
						tx_done = 1;
					}
				}
			} else {
				size_t len = sizeof(out);

				if (o->rate > 0) {
					double allowed = (t - t0) * o->rate - (double)sent;

					if (allowed < (double)len)
						len = allowed < 1 ? 1 : (size_t)allowed;
				}
				fill(out, sent, len, txseed);
				w = send(fd, out, len, MSG_NOSIGNAL);
				if (w > 0)
					sent += (uint64_t)w;
			}
			if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
				can_write = 0;
			if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				snprintf(why, sizeof(why), "send at offset %llu: %s", (unsigned long long)sent, strerror(errno));
				break;
			}
		}
		if (!rx_done && t - last_rx > o->stall) {
			snprintf(why, sizeof(why), "stalled: nothing received for %.0f s at offset %llu (sent %llu%s)", t - last_rx,
				 (unsigned long long)got, (unsigned long long)sent, tx_done ? ", our end sent" : "");
			break;
		}
		if (t >= next_status) {
			write_status(o, sent, got, max_gap, t - t0);
			next_status = t + 1;
		}
		if (t >= next_progress) {
			printf("xsstream %s: t=%.0fs sent %.1f MiB got %.1f MiB, longest gap %.2f s\n", name, t - t0, sent / 1048576.0,
			       got / 1048576.0, max_gap);
			fflush(stdout);
			next_progress = t + 5;
		}
	}
out:
	write_status(o, sent, got, max_gap, now() - t0);
	printf("@@METRIC %s.max_gap_s %.2f s\n@@METRIC %s.sent_mib %.1f MiB\n@@METRIC %s.got_mib %.1f MiB\n", name, max_gap, name,
	       sent / 1048576.0, name, got / 1048576.0);
	suspended0 = boot_now() - now() - suspended0;
	printf("@@METRIC %s.silence_s %.2f s\n@@METRIC %s.suspended_s %.2f s\n", name, max_silence, name,
	       suspended0 > 0 ? suspended0 : 0);
	if (why[0])
		result(name, 0, "%s", why);
	else
		result(name, 1, "sent=%llu got=%llu max_gap=%.2fs", (unsigned long long)sent, (unsigned long long)checked, max_gap);
	return why[0] ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct opts o = { .rate = 1024 * 1024, .stall = 180, .max = 1500 };
	int server, tcp, fd, i;
	const char *peer = NULL, *name;
	unsigned port;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 3 && !strcmp(argv[1], "echo"))
		return echo_server((unsigned)strtoul(argv[2], NULL, 0));
	if (argc == 3 && !strcmp(argv[1], "resolve")) {
		/* which co-resident guest has an IPv4 address (XENSOCK_IOC_RESOLVE) */
		struct xensock_resolve r = { .family = AF_INET };
		int s = socket(xensock_family(), SOCK_STREAM, 0);

		if (s < 0 || inet_pton(AF_INET, argv[2], r.addr) != 1 || ioctl(s, XENSOCK_IOC_RESOLVE, &r) != 0) {
			printf("%s\n", strerrorname_np(errno) ?: "?");
			return 1;
		}
		printf("%u\n", r.domid);
		return 0;
	}
	if (argc == 5 && !strcmp(argv[1], "ping"))
		return ping((uint32_t)strtoul(argv[2], NULL, 0), (unsigned)strtoul(argv[3], NULL, 0), argv[4]);
	if (argc < 5)
		usage();
	server = !strcmp(argv[1], "server");
	if (!server && strcmp(argv[1], "client"))
		usage();
	tcp = !strcmp(argv[2], "tcp");
	if (!tcp && strcmp(argv[2], "xen"))
		usage();
	i = 3;
	if (!server) {
		if (argc < 6)
			usage();
		peer = argv[i++];
	}
	port = (unsigned)strtoul(argv[i++], NULL, 0);
	name = argv[i++];
	snprintf(o.stop, sizeof(o.stop), "/tmp/%s.stop", name);
	snprintf(o.status, sizeof(o.status), "/tmp/%s.status", name);
	for (; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "--rate"))
			o.rate = atof(argv[i + 1]) * 1024;
		else if (!strcmp(argv[i], "--stop"))
			snprintf(o.stop, sizeof(o.stop), "%s", argv[i + 1]);
		else if (!strcmp(argv[i], "--status"))
			snprintf(o.status, sizeof(o.status), "%s", argv[i + 1]);
		else if (!strcmp(argv[i], "--stall"))
			o.stall = atof(argv[i + 1]);
		else if (!strcmp(argv[i], "--max"))
			o.max = atof(argv[i + 1]);
		else
			usage();
	}
	if (i != argc)
		usage();
	fd = connect_or_accept(server, tcp, peer, port, name);
	if (fd < 0)
		return 1;
	stream(fd, name, &o, server ? 2 : 1, server ? 1 : 2);
	close(fd);
	return failures;
}
