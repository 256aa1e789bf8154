/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xsrepro: the minimal reproducer of each bug the system-call fuzzer
 * (xsfuzz.c) found in af_xen.ko, one case each; run by the kmod scenarios.
 * Each case is the shortest sequence of calls that hit the bug, and
 * checks what the module must do instead.
 *
 *   xsrepro                           the one-domain cases
 *   xsrepro mmap | bind-race | graft-race | shutdown-wait   one of them
 *   xsrepro connect-race PEER         cross-domain cases (PEER: a domid)
 *   xsrepro frozen-server PORT        with frozen-client in the peer
 *   xsrepro frozen-client PEER PORT   (module loaded with hostile_test=1)
 *
 * Cases:
 *   mmap          mmap() of an AF_XEN socket called the family's NULL
 *                 ->mmap (the kernel oopsed in the caller: "BUG: kernel
 *                 NULL pointer dereference" at RIP 0 from mmap_region).
 *                 Must fail with ENODEV, as every socket without mappings
 *                 does, for stream and seqpacket sockets, unbound and
 *                 listening.
 *   connect-race  two threads connect() one socket at once: both passed
 *                 the state check, and the second set its ring over the
 *                 first's under the socket's spinlock, whose drop unmapped
 *                 pages there ("BUG: sleeping function called from invalid
 *                 context at mm/vmalloc.c", from connect_remote; the debug
 *                 kernel reports it). Must: one connect goes on, the other
 *                 fails EALREADY (or sees the first's outcome), and no ring
 *                 or port is left behind.
 *   bind-race     two threads bind() one socket at once to two ports: both
 *                 could succeed, leaving the socket in the port table
 *                 twice, the second port held after its close. Must: one
 *                 bind, the other EINVAL; both ports free after the close.
 *   graft-race    XENSOCK_IOC_GRAFT while another thread reads an option
 *                 of the two sockets: the graft set both sockets' sock to
 *                 NULL for a moment (and left the dual listener's AF_XEN
 *                 socket without one), and getsockopt(SOL_SOCKET) read it
 *                 ("BUG: kernel NULL pointer dereference" at
 *                 sk_getsockopt+0x38). Must: every getsockopt answers, the
 *                 graft succeeds, each socket has the other's family after.
 *   frozen-*      a peer froze the ring of a SOCK_SEQPACKET connection (as
 *                 before its save; here the frozen-client's test hook): a
 *                 blocking recv() woke, found nothing, and waited again at
 *                 once, a spin that held the CPU ("watchdog: BUG: soft
 *                 lockup", for good once the peer had gone, and the guest
 *                 refused to be saved). The same on a stream (PORT + 2),
 *                 whose switch leaves the ring only when the sender's
 *                 TxFreeze comes over TCP: the user-space transport sets
 *                 the flag when it freezes, and on a one-vCPU guest the
 *                 spinning reader kept the work item that takes the
 *                 TxFreeze from running ("rcu_sched kthread starved", the
 *                 stream stood still, the peer's suspend hook gave up).
 *                 Must: the reader sleeps until its SO_RCVTIMEO (EAGAIN)
 *                 using little CPU.
 *   proc-tcp      (after frozen-*, on PORT + 1) /proc/net/af_xen_tcp read
 *                 while an inter-domain stream was up: its listing
 *                 allocated under the socket's spinlock ("BUG: sleeping
 *                 function called from invalid context" in tcp_show; the
 *                 debug kernel reports it). Must: the read lists the
 *                 connection, with no report.
 *   shutdown-wait a thread blocked in recv() on a stream while another
 *                 shut the socket down for reading: the shutdown ended the
 *                 wait, but the receive loop looked at shutdown once
 *                 before it began, found the ring empty and waited again
 *                 at once, a spin ("watchdog: BUG: soft lockup" in
 *                 afx_wait from recvmsg). Must: the recv returns 0 at once.
 *                 And a thread blocked in send() on a full ring while
 *                 another shut it down for writing waited on until the
 *                 peer read. Must: the send returns (what it wrote, or
 *                 EPIPE), as TCP's does.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include "xensock-lab.h"
#include "xstest_common.h"

static void case_mmap(void)
{
	static const int types[] = { SOCK_STREAM, SOCK_SEQPACKET };
	struct sockaddr_xen a;
	unsigned i;

	for (i = 0; i < 2; i++) {
		int s = socket(fam, types[i], 0), listening = 0;

		if (s < 0) {
			result("repro-mmap-socket", 0, "errno=%s", strerrorname_np(errno));
			return;
		}
		for (;;) {
			void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, s, 0);
			int e = errno;
			char name[64];

			snprintf(name, sizeof(name), "repro-mmap-%s%s", types[i] == SOCK_STREAM ? "stream" : "seqpacket",
				 listening ? "-listening" : "");
			result(name, m == MAP_FAILED && e == ENODEV, "m=%p errno=%s want=ENODEV", m,
			       m == MAP_FAILED ? strerrorname_np(e) : "0");
			if (m != MAP_FAILED)
				munmap(m, 4096);
			if (listening)
				break;
			a = xaddr(XEN_DOMID_ANY, XEN_PORT_ANY);
			if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 1))
				break;
			listening = 1;
		}
		close(s);
	}
}

/* --- connect-race, bind-race: two threads make one call on one socket */
struct race {
	int fd;
	struct sockaddr_xen a;
	int bind;          /* bind (else connect) */
	pthread_barrier_t *go;
	int rc, err;
};

static void *race_one(void *arg)
{
	struct race *r = arg;

	pthread_barrier_wait(r->go);
	r->rc = r->bind ? bind(r->fd, (struct sockaddr *)&r->a, sizeof(r->a))
			: connect(r->fd, (struct sockaddr *)&r->a, sizeof(r->a));
	r->err = errno;
	return NULL;
}

/* runs the two calls; 1 if both went through (the bug), 0 else */
static int race_pair(int fd, struct sockaddr_xen a1, struct sockaddr_xen a2, int bind_, int *errs)
{
	pthread_barrier_t go;
	pthread_t t[2];
	struct race r[2] = { { fd, a1, bind_, &go, 0, 0 }, { fd, a2, bind_, &go, 0, 0 } };
	int i;

	pthread_barrier_init(&go, NULL, 2);
	for (i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, race_one, &r[i]);
	for (i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	pthread_barrier_destroy(&go);
	for (i = 0; i < 2; i++)
		errs[i] = r[i].rc == 0 ? 0 : r[i].err;
	return r[0].rc == 0 && r[1].rc == 0;
}

static void case_bind_race(void)
{
	int i, both = 0, odd = 0, stuck = 0;
	char detail[96] = "";

	for (i = 0; i < 200; i++) {
		int s = socket(fam, SOCK_STREAM, 0), errs[2], t;
		uint32_t p1 = 9100 + 2 * (i % 50), p2 = p1 + 1;
		struct sockaddr_xen a1 = xaddr(XEN_DOMID_ANY, p1), a2 = xaddr(XEN_DOMID_ANY, p2);

		both += race_pair(s, a1, a2, 1, errs);
		if ((errs[0] && errs[0] != EINVAL) || (errs[1] && errs[1] != EINVAL)) {
			if (!odd++)
				snprintf(detail, sizeof(detail), " first odd: %s/%s", strerrorname_np(errs[0]) ?: "0",
					 strerrorname_np(errs[1]) ?: "0");
		}
		close(s);
		/* both ports are free again */
		for (t = 0; t < 2; t++) {
			int c = socket(fam, SOCK_STREAM, 0);
			struct sockaddr_xen a = t ? a2 : a1;

			if (bind(c, (struct sockaddr *)&a, sizeof(a)))
				stuck++;
			close(c);
		}
	}
	result("repro-bind-race", both == 0 && odd == 0 && stuck == 0,
	       "200 rounds: %d with both binds through, %d with another errno, %d ports held after close%s", both, odd,
	       stuck, detail);
}

static void case_connect_race(uint32_t peer)
{
	int i, both = 0, odd = 0, r = -1;
	long long g0, s0;
	char detail[96] = "";
	/* nobody listens there: each connect that goes on is refused */
	struct sockaddr_xen a = xaddr(peer, 9001);
	double t0 = now();

	/* the link to the peer comes up with the first connect (EHOSTUNREACH
	 * until the peer's module is there): refused means it is up */
	while (now() - t0 < 240) {
		int s = socket(fam, SOCK_STREAM, 0);

		r = connect(s, (struct sockaddr *)&a, sizeof(a));
		close(s);
		if (r && errno == ECONNREFUSED)
			break;
		sleep(1);
	}
	result("repro-connect-race-link", r && errno == ECONNREFUSED, "errno=%s after %.1fs", strerrorname_np(errno) ?: "0",
	       now() - t0);
	usleep(500000);
	g0 = afx_stat("grants");
	s0 = afx_stat("sockets");
	for (i = 0; i < 200; i++) {
		int s = socket(fam, SOCK_STREAM, 0), errs[2], j;

		both += race_pair(s, a, a, 0, errs);
		for (j = 0; j < 2; j++) {
			if (errs[j] != ECONNREFUSED && errs[j] != EALREADY && !odd++)
				snprintf(detail, sizeof(detail), " first odd: %s", strerrorname_np(errs[j]) ?: "0");
		}
		close(s);
	}
	usleep(500000);
	result("repro-connect-race", both == 0 && odd == 0, "200 rounds: %d with both connects through, %d odd errnos%s", both,
	       odd, detail);
	/* what every round made is given back */
	result("repro-connect-race-released", afx_stat("grants") == g0 && afx_stat("sockets") == s0,
	       "grants %lld -> %lld, sockets %lld -> %lld", g0, afx_stat("grants"), s0, afx_stat("sockets"));
}

/* --- graft-race */
struct reader {
	int fds[2];
	volatile int stop;
	long answered, failed;
};

static void *read_options(void *arg)
{
	struct reader *r = arg;

	while (!r->stop) {
		for (int i = 0; i < 2; i++) {
			int v;
			socklen_t l = sizeof(v);

			if (getsockopt(r->fds[i], SOL_SOCKET, SO_DOMAIN, &v, &l) == 0)
				r->answered++;
			else
				r->failed++;
		}
	}
	return NULL;
}

static int domain_of(int fd)
{
	int v = -1;
	socklen_t l = sizeof(v);

	getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &v, &l);
	return v;
}

/* one round: x (AF_XEN) grafted into t (TCP) while a thread reads both */
static int graft_round(int listening, uint32_t me, uint32_t port, int *grafted, int *swapped)
{
	struct sockaddr_xen a = xaddr(XEN_DOMID_ANY, port), c = xaddr(me, port);
	struct sockaddr_in in = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr = { htonl(0x7f000001) } };
	struct xensock_graft g = { .addrlen = sizeof(in) };
	struct reader r = { { -1, -1 }, 0, 0, 0 };
	int l = socket(fam, SOCK_STREAM, 0), x = -1, acc = -1, t = socket(AF_INET, SOCK_STREAM, 0);
	pthread_t th;

	if (l < 0 || t < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 4))
		return -1;
	if (listening) {
		/* the dual listener: the AF_XEN listener into a listening TCP socket */
		struct sockaddr_in any = { .sin_family = AF_INET, .sin_port = 0, .sin_addr = { htonl(0x7f000001) } };

		if (bind(t, (struct sockaddr *)&any, sizeof(any)) || listen(t, 4))
			return -1;
		x = l;
		l = -1;
	} else {
		x = socket(fam, SOCK_STREAM, 0);
		if (connect(x, (struct sockaddr *)&c, sizeof(c)))
			return -1;
		acc = accept(l, NULL, NULL);
	}
	g.fd = t;
	memcpy(g.addr, &in, sizeof(in));
	r.fds[0] = x;
	r.fds[1] = t;
	pthread_create(&th, NULL, read_options, &r);
	usleep(1000);
	*grafted += ioctl(x, XENSOCK_IOC_GRAFT, &g) == 0;
	usleep(1000);
	r.stop = 1;
	pthread_join(th, NULL);
	/* the program's socket is the AF_XEN one now; x holds TCP's sock
	 * (a connection) or a new unbound one of ours (the dual listener) */
	*swapped += domain_of(t) == fam && (listening ? domain_of(x) == fam : domain_of(x) == AF_INET);
	close(x);
	close(t);
	if (acc >= 0)
		close(acc);
	if (l >= 0)
		close(l);
	return r.failed > 0;
}

static void case_graft_race(void)
{
	uint32_t me = 0;
	int s = socket(fam, SOCK_STREAM, 0), i, k, bad = 0, setup = 0;

	ioctl(s, XENSOCK_IOC_LOCAL_DOMID, &me);
	close(s);
	for (k = 0; k < 2; k++) {
		int grafted = 0, swapped = 0;

		for (i = 0; i < 100; i++) {
			int r = graft_round(k, me, 9300 + i % 20, &grafted, &swapped);

			if (r < 0)
				setup++;
			else
				bad += r;
		}
		result(k ? "repro-graft-race-listener" : "repro-graft-race", grafted == 100 && swapped == 100 && !bad && !setup,
		       "100 rounds: %d grafted, %d swapped, %d with a failed getsockopt, %d set-ups failed", grafted, swapped,
		       bad, setup);
	}
}

static double cpu_now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

/* frozen-*: one connection of `type` on `port`, its first record or
 * bytes "frozen", then nothing on a ring the client froze */
static void frozen_server_one(uint32_t port, int type, const char *what)
{
	struct sockaddr_xen a = xaddr(XEN_DOMID_ANY, port);
	struct timeval tv = { 3, 0 };
	int l = socket(fam, type, 0), c;
	char buf[256], name[64];
	double t0, c0;
	ssize_t r;
	int e;

	snprintf(name, sizeof(name), "repro-frozen-%s-listen", what);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1)) {
		result(name, 0, "errno=%s", strerrorname_np(errno));
		return;
	}
	c = accept(l, NULL, NULL);
	if (c < 0) {
		snprintf(name, sizeof(name), "repro-frozen-%s-accept", what);
		result(name, 0, "errno=%s", strerrorname_np(errno));
		close(l);
		return;
	}
	/* the client's first bytes say it froze its ring after them */
	r = recv(c, buf, 6, MSG_WAITALL);
	snprintf(name, sizeof(name), "repro-frozen-%s-first-bytes", what);
	result(name, r == 6 && !memcmp(buf, "frozen", 6), "r=%zd", r);
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	t0 = now();
	c0 = cpu_now();
	r = recv(c, buf, sizeof(buf), 0);
	e = errno;
	snprintf(name, sizeof(name), "repro-frozen-%s-recv-sleeps", what);
	result(name, r == -1 && e == EAGAIN && now() - t0 >= 2.5 && cpu_now() - c0 < 1.0,
	       "r=%zd errno=%s after %.2fs, %.2fs of CPU (a spin takes all of it)", r, r < 0 ? strerrorname_np(e) : "0",
	       now() - t0, cpu_now() - c0);
	close(c);
	close(l);
}

static void case_frozen_server(uint32_t port)
{
	struct sockaddr_xen a;
	char buf[256];
	int l, c;

	frozen_server_one(port, SOCK_SEQPACKET, "seqpacket");
	frozen_server_one(port + 2, SOCK_STREAM, "stream");
	/* proc-tcp: a stream from the peer, read to its end */
	a = xaddr(XEN_DOMID_ANY, port + 1);
	l = socket(fam, SOCK_STREAM, 0);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 1) || (c = accept(l, NULL, NULL)) < 0) {
		result("repro-proc-tcp-accept", 0, "errno=%s", strerrorname_np(errno));
		return;
	}
	while (recv(c, buf, sizeof(buf), 0) > 0)
		;
	close(c);
	close(l);
}

/* a connected socket of `type` to `a`, tried once a second for up to
 * `tries` s (the peer's listener may not be up yet); -1 with errno */
static int connect_retrying(int type, struct sockaddr_xen a, int tries)
{
	int c, i;

	for (i = 0; i < tries; i++) {
		c = socket(fam, type, 0);
		if (connect(c, (struct sockaddr *)&a, sizeof(a)) == 0)
			return c;
		close(c);
		sleep(1);
	}
	return -1;
}

/* proc-tcp's client: lines of /proc/net/af_xen_tcp while its stream is up */
static void proc_tcp_client(uint32_t peer, uint32_t port)
{
	struct sockaddr_xen a = xaddr(peer, port);
	char line[512];
	int c, lines = 0;
	FILE *f;

	c = connect_retrying(SOCK_STREAM, a, 60);
	if (c < 0) {
		result("repro-proc-tcp", 0, "connect: errno=%s", strerrorname_np(errno));
		return;
	}
	send(c, "listed", 6, 0);
	f = fopen("/proc/net/af_xen_tcp", "r");
	while (f && fgets(line, sizeof(line), f))
		lines++;
	if (f)
		fclose(f);
	/* the header, then two lines (tx and rx) per connection with a switch */
	result("repro-proc-tcp", f && lines >= 3, "%d lines read", lines);
	close(c);
}

static void frozen_client_one(uint32_t peer, uint32_t port, int type, const char *what)
{
	struct sockaddr_xen a = xaddr(peer, port);
	int c, mode = XENSOCK_CORRUPT_FREEZE;
	char name[64];

	c = connect_retrying(type, a, 120);
	if (c < 0) {
		snprintf(name, sizeof(name), "repro-frozen-%s-connect", what);
		result(name, 0, "errno=%s", strerrorname_np(errno));
		return;
	}
	send(c, "frozen", 6, 0);
	snprintf(name, sizeof(name), "repro-frozen-%s-freeze", what);
	result(name, setsockopt(c, fam, XENSOCK_TEST_CORRUPT, &mode, sizeof(mode)) == 0, "errno=%s",
	       strerrorname_np(errno));
	/* the server's recv waits 3 s: the connection stays up meanwhile */
	sleep(6);
	close(c);
}

static void case_frozen_client(uint32_t peer, uint32_t port)
{
	frozen_client_one(peer, port, SOCK_SEQPACKET, "seqpacket");
	frozen_client_one(peer, port + 2, SOCK_STREAM, "stream");
	proc_tcp_client(peer, port + 1);
}

struct blocked {
	int fd, write;
	ssize_t r;
	int err;
	volatile int done;
};

static void *blocked_call(void *arg)
{
	struct blocked *b = arg;
	static char buf[65536];

	b->r = b->write ? send(b->fd, buf, sizeof(buf), MSG_NOSIGNAL) : recv(b->fd, buf, sizeof(buf), 0);
	b->err = errno;
	b->done = 1;
	return NULL;
}

/* a loopback connection: *c the client's end, *s the server's */
static int loop_pair(uint32_t port, int *c, int *s)
{
	struct sockaddr_xen a = xaddr(XEN_DOMID_ANY, port);
	uint32_t me = 0;
	int l = socket(fam, SOCK_STREAM, 0);

	*c = socket(fam, SOCK_STREAM, 0);
	if (l < 0 || *c < 0 || ioctl(l, XENSOCK_IOC_LOCAL_DOMID, &me) || bind(l, (struct sockaddr *)&a, sizeof(a)) ||
	    listen(l, 1))
		return -1;
	a = xaddr(me, port);
	if (connect(*c, (struct sockaddr *)&a, sizeof(a)))
		return -1;
	*s = accept(l, NULL, NULL);
	close(l);
	return *s < 0 ? -1 : 0;
}

/* shutdown(how) of `fd` 300 ms into a blocked call; how long it took to end */
static double shut_blocked(int fd, int write, int how, struct blocked *b)
{
	pthread_t t;
	double t0;

	memset(b, 0, sizeof(*b));
	b->fd = fd;
	b->write = write;
	pthread_create(&t, NULL, blocked_call, b);
	usleep(300000);
	t0 = now();
	shutdown(fd, how);
	while (!b->done && now() - t0 < 5)
		usleep(10000);
	if (!b->done) {
		/* still blocked: a close would not end it either; leave it */
		pthread_detach(t);
		return -1;
	}
	pthread_join(t, NULL);
	return now() - t0;
}

static void case_shutdown_wait(void)
{
	struct blocked b;
	int c, s, fill = 0, flags;
	char chunk[4096] = { 0 };
	double took;

	if (loop_pair(9400, &c, &s)) {
		result("repro-shutdown-setup", 0, "errno=%s", strerrorname_np(errno));
		return;
	}
	took = shut_blocked(s, 0, SHUT_RD, &b);
	result("repro-shutdown-rd-ends-recv", took >= 0 && took < 2 && b.r == 0,
	       "recv returned %zd (%s) %.2fs after shutdown(SHUT_RD) (-1.00: still blocked after 5 s)", b.r,
	       b.r < 0 ? strerrorname_np(b.err) : "-", took);
	close(c);
	close(s);
	/* a new pair (a reader shut down for reading makes its writer's
	 * sends fail EPIPE): fill c's ring (s reads nothing), then block in a
	 * send */
	if (loop_pair(9401, &c, &s)) {
		result("repro-shutdown-setup", 0, "errno=%s", strerrorname_np(errno));
		return;
	}
	flags = fcntl(c, F_GETFL);
	fcntl(c, F_SETFL, flags | O_NONBLOCK);
	while (send(c, chunk, sizeof(chunk), MSG_NOSIGNAL) > 0 && fill < 1 << 20)
		fill++;
	fcntl(c, F_SETFL, flags);
	took = shut_blocked(c, 1, SHUT_WR, &b);
	result("repro-shutdown-wr-ends-send", fill > 0 && took >= 0 && took < 2 && (b.r > 0 || (b.r < 0 && b.err == EPIPE)),
	       "send returned %zd (%s) %.2fs after shutdown(SHUT_WR) (-1.00: still blocked after 5 s), ring full after %d KiB",
	       b.r, b.r < 0 ? strerrorname_np(b.err) : "-", took, fill * 4);
	close(c);
	close(s);
}

int main(int argc, char **argv)
{
	const char *which = argc > 1 ? argv[1] : "all";
	int any = 0;

	fam = xensock_family();
	if (fam < 0) {
		result("repro-family", 0, "af_xen not loaded");
		return 1;
	}
	if (!strcmp(which, "all") || !strcmp(which, "mmap")) {
		case_mmap();
		any = 1;
	}
	if (!strcmp(which, "all") || !strcmp(which, "bind-race")) {
		case_bind_race();
		any = 1;
	}
	if (!strcmp(which, "all") || !strcmp(which, "graft-race")) {
		case_graft_race();
		any = 1;
	}
	if (!strcmp(which, "all") || !strcmp(which, "shutdown-wait")) {
		case_shutdown_wait();
		any = 1;
	}
	if (!strcmp(which, "connect-race") && argc > 2) {
		case_connect_race(strtoul(argv[2], NULL, 0));
		any = 1;
	}
	if (!strcmp(which, "frozen-server") && argc > 2) {
		case_frozen_server(strtoul(argv[2], NULL, 0));
		any = 1;
	}
	if (!strcmp(which, "frozen-client") && argc > 3) {
		case_frozen_client(strtoul(argv[2], NULL, 0), strtoul(argv[3], NULL, 0));
		any = 1;
	}
	if (!any) {
		fprintf(stderr, "xsrepro: no case %s (see the comment at the top of xsrepro.c)\n", which);
		return 2;
	}
	return failures ? 1 : 0;
}
