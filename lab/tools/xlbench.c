// SPDX-License-Identifier: GPL-2.0
/*
 * xlbench: the lab's baseline benchmark between two Xen domains.
 *
 * One connection per run; on it, first a bulk stream (client -> server,
 * <MiB> MiB in 64 KiB writes, acknowledged by one byte at the end) and then
 * <N> one-byte ping-pong round trips, each timed, and <N> more timed as
 * one batch. The client prints the results as lab
 * markers:
 *
 *   @@METRIC <transport>.stream_mib_s <value> MiB/s
 *   @@METRIC <transport>.rtt_us_avg|p50|p99 <value> us   (each round trip timed)
 *   @@METRIC <transport>.rtt_us_batch <value> us         (N more, timed as one batch)
 *
 * Transports:
 *   tcp    plain TCP (TCP_NODELAY), i.e. the Xen virtual network (netfront)
 *   vchan  libxenvchan: grant-mapped ring + event channel, the closest
 *          existing thing to what xensock does; statically linked against
 *          libxen-dev.
 *   unix   AF_UNIX stream socket (both ends in one domain: the ceiling a
 *          socket between two domains is compared with)
 *   xen    AF_XEN, the af_xen.ko kernel family; only when built with
 *          -I af-xen-kmod/include (xensock.h), as tests/lab/bench does
 *
 *   xlbench tcp server <port> <MiB> <N>
 *   xlbench tcp client <ip> <port> <MiB> <N> [connect-timeout-s]
 *   xlbench vchan server <peer-domid> <xs-path> <MiB> <N> [ring-bytes]
 *   xlbench vchan client <server-domid> <xs-path> <MiB> <N> [connect-timeout-s]
 *   xlbench unix server <path> <MiB> <N>
 *   xlbench unix client <path> <MiB> <N> [connect-timeout-s]
 *   xlbench xen server <port> <MiB> <N>
 *   xlbench xen client <server-domid> <port> <MiB> <N> [connect-timeout-s]
 *   xlbench paired client <ip> <tcp-port> <server-domid> <xen-port> <MiB> <N> <round> [timeout-s]
 *          (xen; with XLBENCH_SWITCH_NOTE: below)
 *   xlbench domid                  (own domid from xenstore)
 *
 * XLBENCH_LABEL=<name> in the client's environment renames the metric row
 * (e.g. to tell two vchan ring sizes apart).
 * XLBENCH_BUF=<bytes> (xen, unix): SO_RCVBUF and SO_SNDBUF of the socket
 * (SO_*BUFFORCE when allowed, i.e. as root, past net.core.rmem_max), set
 * before listen/connect; af_xen.ko sizes a connection's receive ring from
 * SO_RCVBUF. Both sides print what the kernel reports back.
 * XLBENCH_BUSY_POLL=<us> (xen): SO_BUSY_POLL on the connected socket: a
 * blocking recv/send spins up to that long on the ring before it sleeps.
 * For xen, both sides also print the module's data-path counters
 * (/proc/net/af_xen_stats: interrupts, direct wakeups, work item runs,
 * data kicks, sleeps, spin hits) spent on the stream and on the pings.
 * XLBENCH_COPY=<n> (xen): XENSOCK_COPY_ROUTINE on the connected socket
 * (the module's ring copy routine for it; xensock.h).
 * XLBENCH_NOCHECK=1 (both sides, any transport): the stream the way
 * iperf/netperf measure it: the server reads into its 64 KiB buffer (the
 * same read size as the checked stream, for every transport) and counts
 * the bytes without comparing them, and acks 'U' instead of 'K'; the
 * client insists on 'U' and appends "-unchecked" to its metric row unless
 * the label ends so already, so an unchecked number never goes out
 * unlabelled. Integrity is the checked rows' job (and the tests').
 * XLBENCH_SWITCH_NOTE=<note> (xen client): measure af_xen.ko's TCP
 * carrier. Once connected (on the ring: /proc/net/af_xen must
 * say ring-xen), print "switch-note <note> ring-ok" (dom0 then removes the
 * pair's link directories), wait up to XLBENCH_SWITCH_WAIT s (default 120)
 * until the connection's carrier is tcp with both directions switched
 * (to_tcp >= 2), then run the workload; the stream's metric is printed only
 * if the carrier is still tcp after it and the server found every byte
 * intact. Any failure there exits non-zero without a metric.
 * xlbench paired client: the same carrier connection and a plain
 * TCP one to <ip>:<tcp-port>, both open, their streams sent in turns of
 * one segment in A-B-B-A order (the first row by the round's parity), so
 * that the host's drift from one second to the next falls on both rows
 * alike; each row's throughput is its MiB over the sum of its segments'
 * times. Rows afxen-tcp-carrier and tcp-same-phase; both servers need the
 * same XLBENCH_SEGMENTS (default 4 for paired; the client sets it).
 * XLBENCH_SEGMENTS=<k> (both ends, any transport): the server acknowledges
 * the stream in k segments of whole 64 KiB writes (the last one the rest),
 * the client waits for each verdict before it sends the next segment.
 * Every transport also prints its process's user/system time and context
 * switches for the stream, and the xen transport where the kernel time
 * went (copies, ring waits, notifications, interrupt handler).
 *   xlbench xsread <path> [timeout-s]  (wait for a xenstore node, print it)
 *   xlbench domcpu <path>          (dom0: each domain's CPU time, from Xen,
 *          summed per value of the xenstore node <path> while it holds it,
 *          until it reads "done"; see domcpu())
 *   xlbench calib                  (memcpy, memcmp, system call and pipe
 *                                   costs in this domain)
 * XLBENCH_ROW_NODE=<path> (paired client): write each segment's row label
 * to that xenstore node before the segment (and "gap" after the round's
 * streams), for `xlbench domcpu` in dom0.
 *
 * Exit status 0 only if every byte arrived intact (the stream carries a
 * position-dependent pattern that the receiver checks), or with
 * XLBENCH_NOCHECK only if every byte arrived (counted, not compared).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
/* xenctrl.h's domctl interface is the toolstack's (before any Xen header) */
#define __XEN_TOOLS__ 1
#include <libxenvchan.h>
#include <xenctrl.h>
#include <xenstore.h>
#if __has_include("xensock.h")
#include "xensock-lab.h"
#define XLBENCH_AF_XEN 1
#endif

#define CHUNK (64 * 1024)
/* The stream carries pat[pos % PATLEN]: a prime period, so a lost, repeated
 * or reordered chunk shows up, and both sides work with memcmp/plain sends
 * from a precomputed buffer (per-byte arithmetic would make TCG measure
 * xlbench instead of the transport). */
#define PATLEN 65521
static unsigned char pat[PATLEN + CHUNK];

struct conn {
	int fd;                       /* tcp */
	struct libxenvchan *vc;       /* vchan */
	int afxen;                    /* fd is AF_XEN: report its counters */
	const char *switch_note;      /* XLBENCH_SWITCH_NOTE: must stay on tcp */
};

static const char *transport;
/* XLBENCH_NOCHECK: the receiver reads and discards (see the top) */
static int nocheck;

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void die(const char *what)
{
	fprintf(stderr, "xlbench %s: %s: %s\n", transport ? transport : "", what, strerror(errno));
	exit(1);
}

static int xwrite(struct conn *c, const void *buf, size_t n)
{
	size_t put = 0;
	while (put < n) {
		ssize_t r;
		if (c->vc)
			r = libxenvchan_send(c->vc, (const char *)buf + put, n - put);
		else
			r = send(c->fd, (const char *)buf + put, n - put, MSG_NOSIGNAL);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		put += r;
	}
	return 0;
}

/* Read up to n bytes (at least 1); returns bytes read, 0 on EOF, -1 error. */
static ssize_t xread_some(struct conn *c, void *buf, size_t n)
{
	for (;;) {
		ssize_t r;
		if (c->vc)
			r = libxenvchan_recv(c->vc, buf, n);
		else
			r = recv(c->fd, buf, n, 0);
		if (r < 0 && errno == EINTR)
			continue;
		return r;
	}
}

static int xread(struct conn *c, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t r = xread_some(c, (char *)buf + got, n - got);
		if (r <= 0)
			return -1;
		got += r;
	}
	return 0;
}

static void init_pattern(void)
{
	for (size_t i = 0; i < sizeof(pat); i++) {
		uint64_t p = i % PATLEN;
		pat[i] = (unsigned char)((p * 131) ^ (p >> 7));
	}
}

/* /proc/net/af_xen_stats counters of the data path (af-xen-kmod/src/sys/mod.rs);
 * the first NEVENTS are events, printed per unit; the rest feed the cost line */
static const char *const afx_ctr[] = { "irqs", "irq_wakes", "irq_work", "data_kicks", "sleeps", "spin_hits",
				       "send_calls", "send_ns", "recv_calls", "recv_ns", "tx_copy_ns",
				       "tx_copy_bytes", "rx_copy_ns", "rx_copy_bytes", "step_ns", "wait_ns", "kick_ns",
				       "irq_ns" };
#define NCTR (sizeof(afx_ctr) / sizeof(afx_ctr[0]))
#define NEVENTS 6
enum { C_IRQS, C_SEND_CALLS = 6, C_SEND_NS, C_RECV_CALLS, C_RECV_NS, C_TX_COPY_NS, C_TX_COPY_BYTES,
       C_RX_COPY_NS, C_RX_COPY_BYTES, C_STEP_NS, C_WAIT_NS, C_KICK_NS, C_IRQ_NS };

static void afx_stats(long long v[NCTR])
{
	char name[64];
	long long x;
	FILE *f = fopen("/proc/net/af_xen_stats", "r");

	for (size_t i = 0; i < NCTR; i++)
		v[i] = 0;
	if (!f)
		return;
	while (fscanf(f, "%63s %lld", name, &x) == 2)
		for (size_t i = 0; i < NCTR; i++)
			if (!strcmp(name, afx_ctr[i]))
				v[i] = x;
	fclose(f);
}

/* counters spent since `before` (and refreshes it), per `per` units; then
 * where the kernel time of the phase went (per 64 KiB: the calls, their
 * ring copies, ring waits, notify hypercalls, the interrupt handler) and
 * the process's user/system time and context switches */
static void afx_report(struct conn *c, const char *side, const char *phase, long long before[NCTR], double per,
		       const char *unit)
{
	long long now_[NCTR], d[NCTR];

	if (!c->afxen)
		return;
	afx_stats(now_);
	printf("xlbench %s %s %s:", transport, side, phase);
	for (size_t i = 0; i < NCTR; i++) {
		d[i] = now_[i] - before[i];
		if (i < NEVENTS)
			printf(" %s=%lld (%.2f/%s)", afx_ctr[i], d[i], per > 0 ? d[i] / per : 0, unit);
		before[i] = now_[i];
	}
	printf("\n");
	long long calls = d[C_SEND_CALLS] + d[C_RECV_CALLS], ns = d[C_SEND_NS] + d[C_RECV_NS];
	long long cb = d[C_TX_COPY_BYTES] + d[C_RX_COPY_BYTES], cns = d[C_TX_COPY_NS] + d[C_RX_COPY_NS];
	/* the stream per 64 KiB copied, the pings per round trip */
	int stream = !strcmp(unit, "MiB");
	double units = stream ? cb / 65536.0 : per;
	/* the time sums stay 0 unless af_xen.ko's time_data_path is on */
	if (calls > 0 && units > 0 && ns > 0)
		printf("xlbench %s %s %s cost: %lld calls (%.2f per %s), in the kernel %.1f us per %s: "
		       "ring steps %.1f (copy %.1f at %.1f MiB/s, notify %.1f for %lld kicks, the rest %.1f), "
		       "ring wait %.1f, outside steps and waits %.1f; irq handler %.1f (%lld irqs)\n",
		       transport, side, phase, calls, calls / units, stream ? "64 KiB" : unit, ns / units / 1e3,
		       stream ? "64 KiB" : unit, d[C_STEP_NS] / units / 1e3, cns / units / 1e3,
		       cns > 0 ? cb / 1048576.0 / (cns / 1e9) : 0, d[C_KICK_NS] / units / 1e3, d[3],
		       (d[C_STEP_NS] - cns - d[C_KICK_NS]) / units / 1e3, d[C_WAIT_NS] / units / 1e3,
		       (ns - d[C_STEP_NS] - d[C_WAIT_NS]) / units / 1e3, d[C_IRQ_NS] / units / 1e3, d[C_IRQS]);
}

/* getrusage deltas of a phase, for every transport: where the process's
 * time went (user: our memcmp, vchan's memcpy; system: syscalls, kernel
 * copies) and how often it slept (voluntary context switches) */
struct usage {
	double t, user, sys;
	long nvcsw, nivcsw;
	/* the whole domain's /proc/stat ticks: idle, softirq, steal (its
	 * vCPU runnable while Xen ran another: the QEMU machine's CPUs are
	 * shared by dom0 and the domUs) */
	long long idle, softirq, steal;
	/* the domain's busy ticks: user, nice, system, irq, softirq (every
	 * process and kernel thread, e.g. a carrier's work items) */
	long long busy;
};

static void domain_ticks(struct usage *u)
{
	long long v[8] = { 0 };
	FILE *f = fopen("/proc/stat", "r");

	u->idle = u->softirq = u->steal = u->busy = 0;
	if (!f)
		return;
	if (fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
		   &v[6], &v[7]) == 8) {
		u->idle = v[3];
		u->busy = v[0] + v[1] + v[2] + v[5] + v[6];
		u->softirq = v[6];
		u->steal = v[7];
	}
	fclose(f);
}

static void usage_now(struct usage *u)
{
	struct rusage r;

	getrusage(RUSAGE_SELF, &r);
	u->t = now();
	u->user = r.ru_utime.tv_sec + r.ru_utime.tv_usec / 1e6;
	u->sys = r.ru_stime.tv_sec + r.ru_stime.tv_usec / 1e6;
	u->nvcsw = r.ru_nvcsw;
	u->nivcsw = r.ru_nivcsw;
	domain_ticks(u);
}

/* acc += b - a (every field; t is the wall time) */
static void usage_add(struct usage *acc, const struct usage *a, const struct usage *b)
{
	acc->t += b->t - a->t;
	acc->user += b->user - a->user;
	acc->sys += b->sys - a->sys;
	acc->nvcsw += b->nvcsw - a->nvcsw;
	acc->nivcsw += b->nivcsw - a->nivcsw;
	acc->idle += b->idle - a->idle;
	acc->softirq += b->softirq - a->softirq;
	acc->steal += b->steal - a->steal;
	acc->busy += b->busy - a->busy;
}

/* /proc/stat ticks in milliseconds */
static long long ticks_ms(long long ticks)
{
	long hz = sysconf(_SC_CLK_TCK) > 0 ? sysconf(_SC_CLK_TCK) : 100;

	return ticks * 1000 / hz;
}

/* One segment of a paired stream: its time, this process's CPU in it and
 * the whole domain's busy time (how much of it was someone else's) */
static void segment_print(const char *side, int seg, const struct usage *a, const struct usage *b, double t0,
			  double t1)
{
	printf("xlbench %s %s segment %d: %.0f ms, process cpu %.0f ms, domain busy %lld ms, steal %lld ms\n",
	       transport, side, seg, (t1 - t0) * 1e3, (b->user - a->user + b->sys - a->sys) * 1e3,
	       ticks_ms(b->busy - a->busy), ticks_ms(b->steal - a->steal));
}

/* the usage lines of a phase from its summed deltas d */
static void usage_print(const char *side, const char *phase, const struct usage *d, double mib)
{
	printf("xlbench %s %s %s usage: wall %.1f ms, user %.1f ms, sys %.1f ms (%.1f / %.1f us per 64 KiB), "
	       "%ld voluntary / %ld involuntary context switches (%.2f / %.2f per MiB)\n",
	       transport, side, phase, d->t * 1e3, d->user * 1e3, d->sys * 1e3, d->user * 1e6 / (mib * 16),
	       d->sys * 1e6 / (mib * 16), d->nvcsw, d->nivcsw, d->nvcsw / mib, d->nivcsw / mib);
	printf("xlbench %s %s %s domain: idle %lld ms, softirq %lld ms, steal %lld ms (of %.0f ms)\n", transport, side,
	       phase, ticks_ms(d->idle), ticks_ms(d->softirq), ticks_ms(d->steal), d->t * 1e3);
}

/* a phase's span, for a profile of just it (tests/lab/bench, LAB_PERF) */
static void window_print(const char *side, const char *phase, double t0, double t1)
{
	printf("xlbench %s %s %s window: monotonic %.6f,%.6f\n", transport, side, phase, t0, t1);
}

static void usage_report(const char *side, const char *phase, const struct usage *a, double mib)
{
	struct usage b, d = { 0 };

	usage_now(&b);
	usage_add(&d, a, &b);
	usage_print(side, phase, &d, mib);
	window_print(side, phase, a->t, b.t);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* XLBENCH_SEGMENTS=<k> (both ends): the stream goes in k segments, each
 * acknowledged by the server; each but the last is this long (whole
 * 64 KiB writes), the last the rest. Unset or 1: one segment. */
static uint64_t segment_len(uint64_t total)
{
	const char *e = getenv("XLBENCH_SEGMENTS");
	long k = e && *e ? atol(e) : 1;
	uint64_t chunks = (total + CHUNK - 1) / CHUNK;

	if (k < 1) {
		fprintf(stderr, "xlbench: XLBENCH_SEGMENTS=%s: want a count of at least 1\n", e);
		exit(2);
	}
	return chunks ? (chunks + k - 1) / k * CHUNK : total;
}

/* Server: receive the stream and check it (acknowledging each segment),
 * then echo N single bytes. */
static int serve(struct conn *c, long mib, long n)
{
	static unsigned char buf[CHUNK];
	uint64_t total = (uint64_t)mib << 20, pos = 0, bad = 0, seg = segment_len(total), seg_start = 0, seg_end = seg;
	unsigned char b;
	long long ctr[NCTR];
	struct usage u;

	long reads = 0;

	/* segmented: each segment's usage from its first bytes to its verdict */
	struct usage sa = { 0 }, sb;
	double st = 0;
	int nseg = 0;

	afx_stats(ctr);
	usage_now(&u);
	while (pos < total) {
		size_t want;

		if (seg_end > total)
			seg_end = total;
		want = seg_end - pos < CHUNK ? seg_end - pos : CHUNK;
		ssize_t r = xread_some(c, buf, want);

		/* the server's usage counts from the stream's first bytes: a
		 * client may wait before it writes (the TCP carrier's switch) */
		if (reads++ == 0)
			usage_now(&u);
		if (seg < total && pos == seg_start) {
			usage_now(&sa);
			st = now();
		}
		if (r <= 0) {
			fprintf(stderr, "xlbench %s server: stream ended at %llu of %llu bytes\n",
				transport, (unsigned long long)pos, (unsigned long long)total);
			return 1;
		}
		if (!nocheck && memcmp(buf, pat + pos % PATLEN, r))
			bad++;
		pos += r;
		/* each segment's verdict covers the stream so far */
		if (pos == seg_end) {
			b = nocheck ? 'U' : bad ? 'X' : 'K';
			if (xwrite(c, &b, 1))
				die("ack");
			if (seg < total) {
				double t1 = now();

				usage_now(&sb);
				segment_print("server", ++nseg, &sa, &sb, st, t1);
				window_print("server", "segment", st, t1);
			}
			seg_start = seg_end;
			seg_end += seg;
		}
	}
	/* an empty stream still gets its verdict */
	if (total == 0) {
		b = nocheck ? 'U' : 'K';
		if (xwrite(c, &b, 1))
			die("ack");
	}
	afx_report(c, "server", "stream", ctr, mib, "MiB");
	usage_report("server", "stream", &u, mib);
	/* how finely the reads cut the stream: a reader that keeps finding a
	 * little (woken per arrival) makes many short reads */
	printf("xlbench %s server stream reads: %ld of %d bytes asked, %.1f KiB each\n", transport, reads, CHUNK,
	       reads ? (double)total / reads / 1024 : 0);
	/* twice n: the client's timed round trips, then its batch (see drive) */
	for (long i = 0; i < 2 * n; i++) {
		if (xread(c, &b, 1) || xwrite(c, &b, 1))
			die("ping-pong echo");
	}
	afx_report(c, "server", "pings", ctr, n, "round trip");
	if (nocheck)
		printf("xlbench %s server: received %ld MiB (unchecked: not compared), echoed %ld pings\n", transport,
		       mib, n);
	else
		printf("xlbench %s server: received %ld MiB (%llu bad reads), echoed %ld pings\n", transport, mib,
		       (unsigned long long)bad, n);
	return bad ? 1 : 0;
}

/* This connection's line of /proc/net/af_xen (af-xen-kmod/src/socket/proc.rs,
 * proc_show), found by its local port: its carrier column and how many of
 * its directions went to TCP. 0 when found. */
static int afx_carrier(int fd, char *carrier, size_t cn, long *to_tcp)
{
#ifdef XLBENCH_AF_XEN
	struct sockaddr_xen me;
	socklen_t ml = sizeof(me);
	char line[512], want[32];
	int found = -1;
	FILE *f;

	if (getsockname(fd, (struct sockaddr *)&me, &ml))
		return -1;
	snprintf(want, sizeof(want), "%u:%u", me.sxen_domid, me.sxen_port);
	f = fopen("/proc/net/af_xen", "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f)) {
		char st[32], local[48], car[32];
		long t;

		/* state local peer rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier to_tcp to_ring */
		if (sscanf(line, "%31s %47s %*s %*s %*s %*s %*s %*s %*s %31s %ld", st, local, car, &t) == 4 &&
		    !strcmp(st, "ESTABLISHED") && !strcmp(local, want)) {
			snprintf(carrier, cn, "%s", car);
			*to_tcp = t;
			found = 0;
		}
	}
	fclose(f);
	return found;
#else
	(void)fd, (void)carrier, (void)cn, (void)to_tcp;
	return -1;
#endif
}

/* The connection's ring sizes from its /proc/net/af_xen line (printed:
 * the module sizes a ring without SO_RCVBUF by its grant use). */
static void afx_print_rings(int fd, const char *side)
{
#ifdef XLBENCH_AF_XEN
	struct sockaddr_xen me;
	socklen_t ml = sizeof(me);
	char line[512], want[32];
	FILE *f;

	if (getsockname(fd, (struct sockaddr *)&me, &ml))
		return;
	snprintf(want, sizeof(want), "%u:%u", me.sxen_domid, me.sxen_port);
	f = fopen("/proc/net/af_xen", "r");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		char st[32], local[48];
		long rx, tx;

		/* state local peer rx_size rx_fill tx_size tx_fill ... */
		if (sscanf(line, "%31s %47s %*s %ld %*s %ld", st, local, &rx, &tx) == 4 && !strcmp(st, "ESTABLISHED") &&
		    !strcmp(local, want))
			printf("xlbench %s %s: rings rx %ld tx %ld bytes\n", transport, side, rx, tx);
	}
	fclose(f);
#else
	(void)fd, (void)side;
#endif
}

/* XLBENCH_SWITCH_NOTE: 0 if the connection is on tcp, both ways */
static int carrier_check(struct conn *c, const char *when)
{
	char car[32] = "?";
	long t = -1;

	if (afx_carrier(c->fd, car, sizeof(car), &t) || strcmp(car, "tcp") || t < 2) {
		printf("xlbench %s client: carrier %s, to_tcp %ld %s (want tcp, 2)\n", transport, car, t, when);
		printf("switch-note %s fail\n", c->switch_note);
		return 1;
	}
	return 0;
}

/* XLBENCH_SWITCH_NOTE: on the ring now; ask dom0 for the switch (the note)
 * and wait until the connection is on tcp both ways */
static int switch_to_tcp(struct conn *c)
{
	const char *w = getenv("XLBENCH_SWITCH_WAIT");
	double limit = w && *w ? atof(w) : 120, t0 = now(), waited;
	char car[32] = "?";
	long t = -1;

	if (afx_carrier(c->fd, car, sizeof(car), &t) || strcmp(car, "ring-xen")) {
		printf("xlbench %s client: carrier %s before the switch (want ring-xen)\n", transport, car);
		printf("switch-note %s fail\n", c->switch_note);
		return 1;
	}
	printf("switch-note %s ring-ok\n", c->switch_note);
	fflush(stdout);
	for (;;) {
		waited = now() - t0;
		if (!afx_carrier(c->fd, car, sizeof(car), &t) && !strcmp(car, "tcp") && t >= 2)
			break;
		if (waited > limit)
			return carrier_check(c, "at the end of the wait");
		usleep(100000);
	}
	printf("xlbench %s client: carrier tcp (to_tcp %ld) %.1f s after the note\n", transport, t, waited);
	fflush(stdout);
	return 0;
}

/* n one-byte round trips, each timed, then n more timed as one batch;
 * prints their metrics. ctr: af_xen counters, refreshed. */
static int drive_pings(struct conn *c, long n, long long ctr[NCTR])
{
	double *rtt = calloc(n ? n : 1, sizeof(double));
	double sum = 0;
	unsigned char b;

	if (!rtt)
		die("calloc");
	for (long i = 0; i < n; i++) {
		double s = now();
		b = (unsigned char)i;
		if (xwrite(c, &b, 1) || xread(c, &b, 1))
			die("ping-pong");
		rtt[i] = (now() - s) * 1e6;
		sum += rtt[i];
		if (b != (unsigned char)i) {
			printf("xlbench %s: ping-pong byte mismatch\n", transport);
			free(rtt);
			return 1;
		}
	}
	afx_report(c, "client", "pings", ctr, n, "round trip");
	/* the same n round trips again, timed as one batch: under the lab's
	 * emulation a clock read costs tens of microseconds or more (Xen
	 * emulates rdtsc for these PV guests; `xlbench calib`), and the two
	 * per round trip above add that to every transport's RTT alike */
	double tb = now();
	for (long i = 0; i < n; i++) {
		b = (unsigned char)i;
		if (xwrite(c, &b, 1) || xread(c, &b, 1) || b != (unsigned char)i)
			die("ping-pong (batch)");
	}
	tb = now() - tb;
	if (n) {
		printf("@@METRIC %s.rtt_us_batch %.1f us\n", transport, tb * 1e6 / n);
		qsort(rtt, n, sizeof(double), cmp_double);
		printf("@@METRIC %s.rtt_us_avg %.1f us\n", transport, sum / n);
		printf("@@METRIC %s.rtt_us_p50 %.1f us\n", transport, rtt[n / 2]);
		printf("@@METRIC %s.rtt_us_p99 %.1f us\n", transport, rtt[(n * 99) / 100]);
	}
	fflush(stdout);
	free(rtt);
	return 0;
}

/* Writes the stream's bytes [*pos, *pos + len) in 64 KiB writes and reads
 * the server's verdict on them; 0 if it is the one an intact stream gets. */
static int drive_segment(struct conn *c, uint64_t *pos, uint64_t len)
{
	uint64_t end = *pos + len;
	unsigned char b;

	while (*pos < end) {
		size_t n = end - *pos < CHUNK ? end - *pos : CHUNK;
		if (xwrite(c, pat + *pos % PATLEN, n))
			die("stream write");
		*pos += n;
	}
	if (xread(c, &b, 1))
		die("stream ack");
	if (b == (nocheck ? 'U' : 'K'))
		return 0;
	if (b == 'X')
		printf("xlbench %s: server saw corrupted stream data\n", transport);
	else
		printf("xlbench %s: server acked '%c', want '%c' (XLBENCH_NOCHECK or XLBENCH_SEGMENTS differ between "
		       "the ends?)\n",
		       transport, b, nocheck ? 'U' : 'K');
	return 1;
}

static int drive(struct conn *c, long mib, long n)
{
	uint64_t total = (uint64_t)mib << 20, pos = 0, seg = segment_len(total);
	double t0, t1;
	long long ctr[NCTR];
	struct usage u;

	afx_stats(ctr);
	usage_now(&u);
	t0 = now();
	/* a number only for a stream that arrived intact (and, measuring the
	 * TCP carrier, went over it) */
	do {
		if (drive_segment(c, &pos, total - pos < seg ? total - pos : seg))
			return 1;
	} while (pos < total);
	t1 = now();
	if (c->switch_note && carrier_check(c, "after the stream"))
		return 1;
	printf("@@METRIC %s.stream_mib_s %.1f MiB/s\n", transport, mib / (t1 - t0));
	afx_report(c, "client", "stream", ctr, mib, "MiB");
	usage_report("client", "stream", &u, mib);
	return drive_pings(c, n, ctr);
}

static int own_domid(void)
{
	struct xs_handle *xs = xs_open(0);
	unsigned int len;
	char *s;
	int id;

	if (!xs)
		die("xs_open");
	s = xs_read(xs, XBT_NULL, "domid", &len);
	id = s ? atoi(s) : -1;
	free(s);
	xs_close(xs);
	return id;
}

static int xsread(const char *path, int timeout)
{
	struct xs_handle *xs = xs_open(0);
	unsigned int len;
	char *v = NULL;
	double end = now() + timeout;

	if (!xs)
		die("xs_open");
	while (!(v = xs_read(xs, XBT_NULL, path, &len)) && now() < end)
		usleep(200000);
	if (!v)
		return 1;
	printf("%s\n", v);
	return 0;
}

/* Per-domain CPU time as Xen counts it (ns, every vCPU, no steal): what
 * dom0's netback spends on a row as well as what the two domUs spend,
 * which neither domU can see. Watches the xenstore node <path>; each new
 * value starts a span that ends at the next one; the CPU time and wall
 * time of each domain over all spans of one value are summed. At "done"
 * prints one line per value: spans, wall ms, and each domain's CPU ms
 * (total and per span). */
#define DOMCPU_LABELS 16
#define DOMCPU_DOMS 8
struct domcpu_label {
	char name[64];
	int spans;
	double wall;
	double cpu[DOMCPU_DOMS];
};

static int domcpu_sample(xc_interface *xc, double *cpu_ns, int *domids)
{
	xc_domaininfo_t info[DOMCPU_DOMS];
	int n = xc_domain_getinfolist(xc, 0, DOMCPU_DOMS, info);

	for (int i = 0; i < n; i++) {
		domids[i] = info[i].domain;
		cpu_ns[i] = (double)info[i].cpu_time;
	}
	return n;
}

static int domcpu(const char *path)
{
	struct xs_handle *xs = xs_open(0);
	xc_interface *xc = xc_interface_open(NULL, NULL, 0);
	struct domcpu_label labels[DOMCPU_LABELS];
	int nlabels = 0, cur = -1, ndom = 0, domids[DOMCPU_DOMS];
	double prev_cpu[DOMCPU_DOMS], prev_t = 0;

	if (!xs || !xc)
		die("xs_open / xc_interface_open");
	if (!xs_watch(xs, path, "domcpu"))
		die("xs_watch");
	printf("xlbench domcpu: watching %s\n", path);
	for (;;) {
		unsigned int n, len;
		char **ev = xs_read_watch(xs, &n);
		char *v;
		double cpu[DOMCPU_DOMS], t;
		int ids[DOMCPU_DOMS], nd;

		if (!ev)
			die("xs_read_watch");
		free(ev);
		v = xs_read(xs, XBT_NULL, path, &len);
		if (!v)
			continue;
		if (cur >= 0 && !strcmp(v, labels[cur].name)) {
			free(v);
			continue;
		}
		t = now();
		nd = domcpu_sample(xc, cpu, ids);
		if (nd < 0)
			die("xc_domain_getinfolist");
		/* the span that ends here, if the same domains were there at its start */
		if (cur >= 0 && nd == ndom && !memcmp(ids, domids, sizeof(int) * nd)) {
			labels[cur].spans++;
			labels[cur].wall += t - prev_t;
			for (int i = 0; i < nd; i++)
				labels[cur].cpu[i] += cpu[i] - prev_cpu[i];
		}
		ndom = nd;
		memcpy(domids, ids, sizeof(int) * nd);
		memcpy(prev_cpu, cpu, sizeof(double) * nd);
		prev_t = t;
		if (!strcmp(v, "done")) {
			free(v);
			break;
		}
		cur = -1;
		for (int i = 0; i < nlabels; i++)
			if (!strncmp(labels[i].name, v, sizeof(labels[i].name) - 1))
				cur = i;
		if (cur < 0 && nlabels < DOMCPU_LABELS) {
			cur = nlabels++;
			memset(&labels[cur], 0, sizeof(labels[cur]));
			snprintf(labels[cur].name, sizeof(labels[cur].name), "%s", v);
		}
		free(v);
	}
	for (int l = 0; l < nlabels; l++) {
		struct domcpu_label *b = &labels[l];

		if (!b->spans)
			continue;
		printf("xlbench domcpu %s: %d spans, wall %.0f ms", b->name, b->spans, b->wall * 1e3);
		for (int i = 0; i < ndom; i++)
			printf(", dom%d %.0f ms (%.1f per span)", domids[i], b->cpu[i] / 1e6, b->cpu[i] / 1e6 / b->spans);
		printf("\n");
	}
	xc_interface_close(xc);
	xs_close(xs);
	return 0;
}

/* XLBENCH_BUF: both buffer sizes, before listen/connect (see the top) */
static void set_bufs(int fd, const char *side)
{
	const char *e = getenv("XLBENCH_BUF");
	int v, got_r = 0, got_s = 0;
	socklen_t len = sizeof(int);

	if (!e || !*e)
		return;
	v = atoi(e);
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &v, sizeof(v)) &&
	    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v)))
		die("SO_RCVBUF");
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &v, sizeof(v)) &&
	    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v)))
		die("SO_SNDBUF");
	getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &got_r, &len);
	len = sizeof(int);
	getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &got_s, &len);
	static int said;	/* once, not per connect retry */
	if (said++)
		return;
	printf("xlbench %s %s: XLBENCH_BUF=%d: SO_RCVBUF reads %d, SO_SNDBUF reads %d (the kernel doubles)\n", transport,
	       side, v, got_r, got_s);
	fflush(stdout);
}

/* XLBENCH_BUSY_POLL: SO_BUSY_POLL of a connected socket (see the top) */
static void set_busy_poll(int fd, const char *side)
{
	const char *e = getenv("XLBENCH_BUSY_POLL");
	int v;

	if (!e || !*e)
		return;
	v = atoi(e);
	if (setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &v, sizeof(v)))
		die("SO_BUSY_POLL");
	printf("xlbench %s %s: SO_BUSY_POLL %d us\n", transport, side, v);
	fflush(stdout);
}

/* XLBENCH_COPY (xen): XENSOCK_COPY_ROUTINE of a connected socket, the
 * module's ring copy routine for this connection (xensock.h) */
static void set_copy_routine(int fd, int fam, const char *side)
{
#ifdef XENSOCK_COPY_ROUTINE
	const char *e = getenv("XLBENCH_COPY");
	int v;

	if (!e || !*e)
		return;
	v = atoi(e);
	if (setsockopt(fd, fam, XENSOCK_COPY_ROUTINE, &v, sizeof(v)))
		die("XENSOCK_COPY_ROUTINE");
	printf("xlbench %s %s: copy routine %d\n", transport, side, v);
	fflush(stdout);
#else
	(void)fd, (void)fam, (void)side;
#endif
}

/* Listen on a, accept one connection, serve it. */
static int sock_server(int fam, const struct sockaddr *a, socklen_t alen, int nodelay, long mib, long n)
{
	struct conn c = { .fd = -1 };
	int one = 1;
	int l = socket(fam, SOCK_STREAM, 0);

	if (l < 0)
		die("socket");
	if (fam == AF_INET)
		setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	else
		set_bufs(l, "server");
	if (bind(l, a, alen) || listen(l, 1))
		die("bind/listen");
	printf("xlbench %s server: listening\n", transport);
	fflush(stdout);
	c.fd = accept(l, NULL, NULL);
	if (c.fd < 0)
		die("accept");
	if (nodelay)
		setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c.afxen = fam != AF_INET && fam != AF_UNIX;
	if (c.afxen) {
		set_busy_poll(c.fd, "server");
		set_copy_routine(c.fd, fam, "server");
		afx_print_rings(c.fd, "server");
	}
	int rc = serve(&c, mib, n);
	close(c.fd);
	close(l);
	return rc;
}

/* Connect c to a, retrying for up to timeout seconds (the server may not be
 * listening yet); an AF_XEN connection with XLBENCH_SWITCH_NOTE is on the
 * TCP carrier when this returns 0. */
static int sock_connect(struct conn *c, int fam, const struct sockaddr *a, socklen_t alen, int nodelay, int timeout)
{
	double end = now() + timeout;
	int one = 1;

	for (;;) {
		c->fd = socket(fam, SOCK_STREAM, 0);
		if (c->fd < 0)
			die("socket");
		if (fam != AF_INET)
			set_bufs(c->fd, "client");
		if (!connect(c->fd, a, alen))
			break;
		if (now() > end)
			die("connect");
		close(c->fd);
		usleep(500000);
	}
	if (nodelay)
		setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	c->afxen = fam != AF_INET && fam != AF_UNIX;
	if (!c->afxen)
		return 0;
	set_busy_poll(c->fd, "client");
	set_copy_routine(c->fd, fam, "client");
	afx_print_rings(c->fd, "client");
	c->switch_note = getenv("XLBENCH_SWITCH_NOTE");
	if (c->switch_note && !*c->switch_note)
		c->switch_note = NULL;
	return c->switch_note && switch_to_tcp(c);
}

/* Connect to a, then drive the workload. */
static int sock_client(int fam, const struct sockaddr *a, socklen_t alen, int nodelay, long mib, long n,
		       int timeout)
{
	struct conn c = { .fd = -1 };

	if (sock_connect(&c, fam, a, alen, nodelay, timeout)) {
		close(c.fd);
		return 1;
	}
	int rc = drive(&c, mib, n);
	if (c.switch_note)
		printf("switch-note %s %s\n", c.switch_note, rc ? "fail" : "done");
	close(c.fd);
	return rc;
}

static int tcp_main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET };

	if (argc >= 6 && !strcmp(argv[2], "server")) {
		a.sin_port = htons(atoi(argv[3]));
		return sock_server(AF_INET, (struct sockaddr *)&a, sizeof(a), 1, atol(argv[4]), atol(argv[5]));
	}
	if (argc >= 7 && !strcmp(argv[2], "client")) {
		a.sin_port = htons(atoi(argv[4]));
		if (inet_pton(AF_INET, argv[3], &a.sin_addr) != 1) {
			fprintf(stderr, "bad address %s\n", argv[3]);
			return 2;
		}
		return sock_client(AF_INET, (struct sockaddr *)&a, sizeof(a), 1, atol(argv[5]), atol(argv[6]),
				   argc > 7 ? atoi(argv[7]) : 120);
	}
	return 2;
}

static int unix_main(int argc, char **argv)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	if (argc < 6 || strlen(argv[3]) >= sizeof(a.sun_path))
		return 2;
	strcpy(a.sun_path, argv[3]);
	if (!strcmp(argv[2], "server")) {
		unlink(argv[3]);
		return sock_server(AF_UNIX, (struct sockaddr *)&a, sizeof(a), 0, atol(argv[4]), atol(argv[5]));
	}
	if (!strcmp(argv[2], "client"))
		return sock_client(AF_UNIX, (struct sockaddr *)&a, sizeof(a), 0, atol(argv[4]), atol(argv[5]),
				   argc > 6 ? atoi(argv[6]) : 120);
	return 2;
}

#ifdef XLBENCH_AF_XEN
static int xen_main(int argc, char **argv)
{
	int fam = xensock_family();
	struct sockaddr_xen a = { .sxen_family = fam };

	if (fam < 0)
		die("xensock_family (is af_xen.ko loaded?)");
	if (argc >= 6 && !strcmp(argv[2], "server")) {
		a.sxen_domid = XEN_DOMID_ANY;
		a.sxen_port = strtoul(argv[3], NULL, 0);
		return sock_server(fam, (struct sockaddr *)&a, sizeof(a), 0, atol(argv[4]), atol(argv[5]));
	}
	if (argc >= 7 && !strcmp(argv[2], "client")) {
		a.sxen_domid = strtoul(argv[3], NULL, 0);
		a.sxen_port = strtoul(argv[4], NULL, 0);
		return sock_client(fam, (struct sockaddr *)&a, sizeof(a), 0, atol(argv[5]), atol(argv[6]),
				   argc > 7 ? atoi(argv[7]) : 120);
	}
	return 2;
}
#endif

#ifdef XLBENCH_AF_XEN
/* One row of a paired round: its connection, where its stream is, and the
 * summed time and usage of its segments. */
struct paired_row {
	const char *label;
	struct conn c;
	uint64_t pos;
	double secs;
	struct usage use;
	int bad;
};

/* xlbench paired client: the kernel TCP carrier against plain TCP
 * with both connections open (see the top). The AF_XEN connection is made
 * and switched first (XLBENCH_SWITCH_NOTE), then the TCP one; their
 * streams go in turns of one segment (XLBENCH_SEGMENTS, default 4), in
 * A-B-B-A order, the first row alternating with the round's parity; each
 * row's throughput is its MiB over the sum of its segments' times, each
 * from the segment's first write to the server's verdict on it. Then each
 * row's round trips, in the round's order. */
static int paired_main(int argc, char **argv)
{
	struct paired_row rows[2] = {
		{ .label = "afxen-tcp-carrier", .c = { .fd = -1 } },
		{ .label = "tcp-same-phase", .c = { .fd = -1 } },
	};
	struct paired_row *carrier = &rows[0];
	struct sockaddr_in ta = { .sin_family = AF_INET };
	struct sockaddr_xen xa = { 0 };
	long long ctr[NCTR];
	int fam = xensock_family(), rc = 0;

	if (argc < 10 || strcmp(argv[2], "client"))
		return 2;
	if (inet_pton(AF_INET, argv[3], &ta.sin_addr) != 1) {
		fprintf(stderr, "bad address %s\n", argv[3]);
		return 2;
	}
	if (fam < 0)
		die("xensock_family (is af_xen.ko loaded?)");
	xa.sxen_family = fam;
	if (!getenv("XLBENCH_SWITCH_NOTE") || !*getenv("XLBENCH_SWITCH_NOTE")) {
		fprintf(stderr, "xlbench paired: XLBENCH_SWITCH_NOTE must name the switch\n");
		return 2;
	}
	if (!getenv("XLBENCH_SEGMENTS"))
		setenv("XLBENCH_SEGMENTS", "4", 1);
	ta.sin_port = htons(atoi(argv[4]));
	xa.sxen_domid = strtoul(argv[5], NULL, 0);
	xa.sxen_port = strtoul(argv[6], NULL, 0);
	long mib = atol(argv[7]), n = atol(argv[8]), round = atol(argv[9]);
	int timeout = argc > 10 ? atoi(argv[10]) : 120;
	uint64_t total = (uint64_t)mib << 20, seg = segment_len(total);

	if (mib < 1) {
		fprintf(stderr, "xlbench paired: the streams need at least 1 MiB\n");
		return 2;
	}

	transport = carrier->label;
	/* (a failed switch has said "switch-note ... fail") */
	if (sock_connect(&carrier->c, fam, (struct sockaddr *)&xa, sizeof(xa), 0, timeout)) {
		close(carrier->c.fd);
		return 1;
	}
	/* XLBENCH_SETTLE_MS: how long the carrier connection sits on TCP
	 * before its first segment (whether the time after the switch costs) */
	const char *settle = getenv("XLBENCH_SETTLE_MS");
	long settle_ms = settle ? atol(settle) : 0;

	if (settle_ms > 0) {
		printf("xlbench paired client: settling %ld ms after the switch\n", settle_ms);
		usleep(settle_ms * 1000);
	}
	transport = rows[1].label;
	sock_connect(&rows[1].c, AF_INET, (struct sockaddr *)&ta, sizeof(ta), 1, timeout);
	printf("xlbench paired client: round %ld, the kernel carrier and TCP in turns of %llu bytes, %s first\n", round,
	       (unsigned long long)seg, rows[round % 2 ? 0 : 1].label);
	afx_stats(ctr);
	/* XLBENCH_ROW_NODE: the row of each segment, for xlbench domcpu in dom0 */
	const char *row_node = getenv("XLBENCH_ROW_NODE");
	struct xs_handle *xs = row_node && *row_node ? xs_open(0) : NULL;

	if (row_node && *row_node && !xs)
		die("xs_open (XLBENCH_ROW_NODE)");
	for (long turn = 0; rows[0].pos < total || rows[1].pos < total; turn++) {
		for (int k = 0; k < 2; k++) {
			struct paired_row *r = &rows[(round + turn) % 2 ? k : 1 - k];
			uint64_t len = total - r->pos < seg ? total - r->pos : seg;
			struct usage a, b;
			double t0, t1;

			if (!len)
				continue;
			transport = r->label;
			if (xs && !xs_write(xs, XBT_NULL, row_node, r->label, strlen(r->label)))
				die("xs_write (XLBENCH_ROW_NODE)");
			usage_now(&a);
			t0 = now();
			r->bad |= drive_segment(&r->c, &r->pos, len);
			t1 = now();
			usage_now(&b);
			r->secs += t1 - t0;
			usage_add(&r->use, &a, &b);
			window_print("client", "stream", t0, t1);
			segment_print("client", (int)turn + 1, &a, &b, t0, t1);
		}
	}
	if (xs) {
		if (!xs_write(xs, XBT_NULL, row_node, "gap", 3))
			die("xs_write (XLBENCH_ROW_NODE)");
		xs_close(xs);
	}
	/* the carrier row counts only if it went over TCP from start to end */
	transport = carrier->label;
	if (!carrier->bad && carrier_check(&carrier->c, "after the stream"))
		carrier->bad = 1;
	for (int k = 0; k < 2; k++) {
		struct paired_row *r = &rows[round % 2 ? k : 1 - k];

		transport = r->label;
		if (r->bad) {
			rc = 1;
			continue;
		}
		printf("@@METRIC %s.stream_mib_s %.1f MiB/s\n", transport, mib / r->secs);
		afx_report(&r->c, "client", "stream", ctr, mib, "MiB");
		usage_print("client", "stream", &r->use, mib);
		rc |= drive_pings(&r->c, n, ctr);
	}
	printf("switch-note %s %s\n", carrier->c.switch_note, rc ? "fail" : "done");
	close(rows[0].c.fd);
	close(rows[1].c.fd);
	return rc;
}
#endif

static int vchan_main(int argc, char **argv)
{
	struct conn c = { .fd = -1 };

	if (argc >= 7 && !strcmp(argv[2], "server")) {
		size_t ring = argc > 7 ? strtoul(argv[7], NULL, 0) : 65536;
		c.vc = libxenvchan_server_init(NULL, atoi(argv[3]), argv[4], ring, ring);
		if (!c.vc)
			die("libxenvchan_server_init");
		c.vc->blocking = 1;
		printf("xlbench vchan server: %s for dom%s, ring %zu bytes\n", argv[4], argv[3], ring);
		fflush(stdout);
		while (libxenvchan_is_open(c.vc) == 2) /* 2 = waiting for the client */
			libxenvchan_wait(c.vc);
		int rc = serve(&c, atol(argv[5]), atol(argv[6]));
		sleep(1); /* let the client read the last echo before the ring goes */
		libxenvchan_close(c.vc);
		return rc;
	}
	if (argc >= 7 && !strcmp(argv[2], "client")) {
		double end = now() + (argc > 7 ? atoi(argv[7]) : 120);
		while (!(c.vc = libxenvchan_client_init(NULL, atoi(argv[3]), argv[4]))) {
			if (now() > end)
				die("libxenvchan_client_init");
			usleep(200000);
		}
		c.vc->blocking = 1;
		int rc = drive(&c, atol(argv[5]), atol(argv[6]));
		libxenvchan_close(c.vc);
		return rc;
	}
	return 2;
}

/* calib: this domain's cost of the pieces a transport is made of, under
 * the same emulation: user-space memcpy and memcmp of 64 KiB (what vchan
 * copies with, what the receiver checks with), one system call (through
 * Xen in a PV guest), and a pipe's 64 KiB write + read (two system calls
 * and two kernel user copies, copy_user_generic). */
static int calib(void)
{
	static unsigned char ring[1 << 20], dst[CHUNK];
	const int reps = 512, calls = 5000;
	volatile unsigned long sink = 0;
	double t;
	int p[2];

	t = now();
	for (int i = 0; i < reps; i++)
		memcpy(ring + (size_t)(i % 16) * CHUNK, pat + (i * 4099) % PATLEN, CHUNK);
	t = now() - t;
	printf("xlbench calib: user memcpy of 64 KiB: %.1f us each (%.1f MiB/s)\n", t * 1e6 / reps, reps / 16.0 / t);
	for (int k = 0; k < 16; k++)	/* equal data: memcmp runs to the end, as the receiver's */
		memcpy(ring + (size_t)k * CHUNK, pat + (size_t)k * CHUNK % PATLEN, CHUNK);
	t = now();
	for (int i = 0; i < reps; i++)
		sink += memcmp(ring + (size_t)(i % 16) * CHUNK, pat + (size_t)(i % 16) * CHUNK % PATLEN, CHUNK) != 0;
	t = now() - t;
	printf("xlbench calib: user memcmp of 64 KiB: %.1f us each (%.1f MiB/s)\n", t * 1e6 / reps, reps / 16.0 / t);
	t = now();
	for (int i = 0; i < calls; i++)
		sink += syscall(SYS_getppid);
	t = now() - t;
	printf("xlbench calib: one system call (getppid): %.2f us\n", t * 1e6 / calls);
	/* a clock read (the module's timed rows read the clock twice per
	 * timed part): clock_gettime through the vDSO, and a bare rdtsc,
	 * which Xen may trap and emulate for a PV guest */
	t = now();
	for (int i = 0; i < calls; i++) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		sink += ts.tv_nsec;
	}
	t = now() - t;
	printf("xlbench calib: clock_gettime: %.2f us\n", t * 1e6 / calls);
	t = now();
	for (int i = 0; i < calls; i++) {
		unsigned int lo, hi;
		__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
		sink += lo ^ hi;
	}
	t = now() - t;
	printf("xlbench calib: rdtsc: %.2f us\n", t * 1e6 / calls);
	/* what a system call costs the code after it: touch 64 pages (one
	 * byte each) with and without a getppid in front. A 64-bit PV guest's
	 * kernel and user space have separate page tables, so each entry and
	 * exit loads CR3, and QEMU flushes its software TLB on every load. */
	{
		const int rounds = 2000, pages = 64;
		double t_touch, t_both;

		t = now();
		for (int i = 0; i < rounds; i++)
			for (int k = 0; k < pages; k++)
				sink += ((volatile unsigned char *)ring)[(size_t)k * 4096 + (i & 63)];
		t_touch = now() - t;
		t = now();
		for (int i = 0; i < rounds; i++) {
			sink += syscall(SYS_getppid);
			for (int k = 0; k < pages; k++)
				sink += ((volatile unsigned char *)ring)[(size_t)k * 4096 + (i & 63)];
		}
		t_both = now() - t;
		printf("xlbench calib: touching 64 pages: %.2f us; after a system call: %.2f us including the call\n",
		       t_touch * 1e6 / rounds, t_both * 1e6 / rounds);
	}
	if (pipe(p) || fcntl(p[1], F_SETPIPE_SZ, 1 << 20) < 0)
		die("pipe");
	t = now();
	for (int i = 0; i < reps; i++) {
		if (write(p[1], pat + (i * 4099) % PATLEN, CHUNK) != CHUNK || read(p[0], dst, CHUNK) != CHUNK)
			die("pipe write/read");
	}
	t = now() - t;
	printf("xlbench calib: pipe write + read of 64 KiB: %.1f us per pair (%.1f MiB/s; two kernel copies)\n",
	       t * 1e6 / reps, reps / 16.0 / t);
	close(p[0]);
	close(p[1]);
	return sink == 0xdead ? 1 : 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	init_pattern();
	if (argc == 2 && !strcmp(argv[1], "domid")) {
		printf("%d\n", own_domid());
		return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "calib"))
		return calib();
	if (argc >= 3 && !strcmp(argv[1], "xsread"))
		return xsread(argv[2], argc > 3 ? atoi(argv[3]) : 0);
	if (argc == 3 && !strcmp(argv[1], "domcpu"))
		return domcpu(argv[2]);
	if (argc >= 3) {
		transport = getenv("XLBENCH_LABEL") ? getenv("XLBENCH_LABEL") : argv[1];
		nocheck = getenv("XLBENCH_NOCHECK") && atoi(getenv("XLBENCH_NOCHECK")) != 0;
		if (nocheck) {
			static char label[128];
			size_t tl = strlen(transport), sl = strlen("-unchecked");

			if (tl < sl || strcmp(transport + tl - sl, "-unchecked")) {
				snprintf(label, sizeof(label), "%s-unchecked", transport);
				transport = label;
			}
		}
		if (!strcmp(argv[1], "tcp"))
			return tcp_main(argc, argv);
		if (!strcmp(argv[1], "vchan"))
			return vchan_main(argc, argv);
		if (!strcmp(argv[1], "unix"))
			return unix_main(argc, argv);
#ifdef XLBENCH_AF_XEN
		if (!strcmp(argv[1], "xen"))
			return xen_main(argc, argv);
		if (!strcmp(argv[1], "paired"))
			return paired_main(argc, argv);
#endif
	}
	fprintf(stderr,
		"usage: xlbench tcp server <port> <MiB> <N>\n"
		"       xlbench tcp client <ip> <port> <MiB> <N> [timeout-s]\n"
		"       xlbench vchan server <peer-domid> <xs-path> <MiB> <N> [ring-bytes]\n"
		"       xlbench vchan client <server-domid> <xs-path> <MiB> <N> [timeout-s]\n"
		"       xlbench unix server|client <path> <MiB> <N> [timeout-s]\n"
		"       xlbench xen server <port> <MiB> <N>   (built with xensock.h)\n"
		"       xlbench xen client <server-domid> <port> <MiB> <N> [timeout-s]\n"
		"       xlbench paired client <ip> <tcp-port> <server-domid> <xen-port> <MiB> <N> <round> [timeout-s]\n"
		"       xlbench domid | xsread <path> [timeout-s] | domcpu <path>\n");
	return 2;
}
