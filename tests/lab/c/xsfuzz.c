/* SPDX-License-Identifier: GPL-2.0 */
/*
 * xsfuzz: a system-call fuzzer for the AF_XEN socket family.
 *
 *   xsfuzz -s SEED -t SECONDS -p PEER [-P PROCS] [-T THREADS]
 *          [-b PORT_BASE] [-n NAME]
 *
 * PEER: the peer's domid, or a file that holds it, read again every 5 s
 * (the peer's domid changes when it is restored).
 *
 * PROCS processes of THREADS threads each make random sequences of calls
 * on a descriptor table they share: AF_XEN stream and seqpacket sockets,
 * and sockets of other kinds (TCP, UDP, Unix, pipes, eventfds, closed
 * numbers) for the calls that take a descriptor (GRAFT, RESOLVE, dup2).
 * Every call of the family is covered: socket, bind and connect with
 * valid, invalid and wrongly sized addresses to this guest, the peer and
 * unknown domains, listen, accept4, every send and receive call with
 * random flags and buffers that cross into an unmapped page, poll and
 * epoll (level and edge), setsockopt/getsockopt at several levels with
 * random values and lengths, the family's ioctls, shutdown, close racing
 * other threads' calls, dup, fork, SCM_RIGHTS, signals.
 *
 * Each process keeps a listener of its own (port PORT_BASE + process)
 * with a thread that accepts, reads, writes and closes, so connects to the
 * peer's ports find someone. Blocking calls are bounded by a per-thread
 * timer that interrupts them after 1-3 s (SIGUSR1 without SA_RESTART:
 * EINTR). What the fuzzer checks itself:
 *   - no call stays blocked 30 s after its timer fired (a hung call);
 *   - every failing call on an AF_XEN socket fails with an errno from the
 *     documented set (xensock.h), never a kernel-internal one (>= 512);
 *   - results within bounds: no read returns more than asked for, no
 *     address longer than the room given.
 * The kernel's detectors check the rest (lab/guest/kernel-check.sh).
 * Exit status 0 if nothing was found; a line per finding otherwise.
 * The seed is printed: a failing run is replayed with the same -s (one
 * thread's sequence of choices is the seed's; thread timing is not).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <linux/sockios.h>
#include "xensock.h"

#define NFD 48            /* descriptor table slots */
#define NPORTS 8          /* ports the fuzzers bind and connect to */
#define HANG_SECS 30      /* a call still blocked this long after its timer: hung */
#define MAX_THREADS 16

static int fam;
static uint32_t own_domid;
static _Atomic uint32_t peer_domid;
static const char *peer_file;
static uint32_t port_base = 7600;
static double deadline;
static const char *name = "fuzz";

/* the table, shared by a process's threads; races are the point */
static atomic_int fds[NFD];
/* per thread: the call in progress, and since when its timer fired */
struct slot {
	atomic_long started_ns;     /* 0: no call in progress */
	const char *volatile op;
	pid_t tid;
};
static struct slot slots[MAX_THREADS + 1];
static atomic_long calls, findings, unexpected_errno;
static atomic_long ok_connects, ok_accepts, ok_grafts, ok_sends, ok_recvs;
static char *guard;       /* two pages: readable+writable, then PROT_NONE */
static long page;

static void finding(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void finding(const char *fmt, ...)
{
	char b[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b, sizeof(b), fmt, ap);
	va_end(ap);
	printf("xsfuzz[%s %d]: FINDING: %s\n", name, getpid(), b);
	fflush(stdout);
	atomic_fetch_add(&findings, 1);
}

static long now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000L + t.tv_nsec;
}

/* xorshift64*: a thread's own sequence of choices */
struct rng { uint64_t s; };
static uint64_t rnd(struct rng *r)
{
	r->s ^= r->s >> 12;
	r->s ^= r->s << 25;
	r->s ^= r->s >> 27;
	return r->s * 2685821657736338717ULL;
}
static unsigned pick(struct rng *r, unsigned n) { return n ? (unsigned)(rnd(r) % n) : 0; }
static int coin(struct rng *r, unsigned one_in) { return pick(r, one_in) == 0; }

/* --- the errnos a call on an AF_XEN socket may fail with (xensock.h, and
 * what the socket layer itself returns before the family is asked) */
static int errno_documented(int e)
{
	switch (e) {
	case EAGAIN: case EINTR: case EINVAL: case EBADF: case ENOTSOCK: case EFAULT:
	case EADDRINUSE: case EADDRNOTAVAIL: case EAFNOSUPPORT: case ECONNREFUSED:
	case EHOSTUNREACH: case ETIMEDOUT: case EINPROGRESS: case EALREADY: case EISCONN:
	case ENOTCONN: case EPIPE: case ECONNRESET: case ECONNABORTED: case EOPNOTSUPP:
	case ENOPROTOOPT: case EMSGSIZE: case EPERM: case EACCES: case ENOMEM: case ENOBUFS:
	case ESOCKTNOSUPPORT: case EPROTONOSUPPORT: case EPROTOTYPE: case ENOTTY:
	case EDESTADDRREQ: case EMFILE: case ENFILE: case ENODEV: case ESPIPE:
	case ESHUTDOWN: case ENOENT: case EBUSY:
	case EDOM:      /* SO_RCVTIMEO/SO_SNDTIMEO: a timeval out of range */
	case ENETUNREACH: /* connect while this guest is being saved */
	case ENODATA:   /* SO_PEERPIDFD: no peer process, as on TCP (the socket layer) */
		return 1;
	}
	return 0;
}

static int is_afxen(int fd)
{
	int d = 0;
	socklen_t l = sizeof(d);

	return fd >= 0 && getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &d, &l) == 0 && d == fam;
}

/* Record a call's outcome: kernel-internal errnos anywhere, undocumented
 * ones on a socket that was AF_XEN when the call began. */
static void outcome(const char *op, int fd_was_afxen, long rc)
{
	int e = errno;

	atomic_fetch_add(&calls, 1);
	if (rc >= 0)
		return;
	if (e >= 512)
		finding("%s: kernel-internal errno %d leaked to user space", op, e);
	else if (fd_was_afxen && !errno_documented(e)) {
		atomic_fetch_add(&unexpected_errno, 1);
		finding("%s on an AF_XEN socket: undocumented errno %d (%s)", op, e, strerror(e));
	}
	errno = e;
}

/* --- bounded blocking: a per-thread timer interrupts the call */
static void on_usr1(int sig) { (void)sig; }

struct tctx {
	int idx;
	struct rng r;
	timer_t timer;
	int have_timer;
};

static void begin(struct tctx *t, const char *op)
{
	struct itimerspec its = { 0 };

	slots[t->idx].op = op;
	its.it_value.tv_sec = 1 + pick(&t->r, 3);
	its.it_value.tv_nsec = pick(&t->r, 1000) * 1000000L;
	if (t->have_timer)
		timer_settime(t->timer, 0, &its, NULL);
	atomic_store(&slots[t->idx].started_ns, now_ns() + its.it_value.tv_sec * 1000000000L
		     + its.it_value.tv_nsec);
}

static void end(struct tctx *t)
{
	struct itimerspec its = { 0 };

	if (t->have_timer)
		timer_settime(t->timer, 0, &its, NULL);
	atomic_store(&slots[t->idx].started_ns, 0);
}

/* --- arguments */
static int rand_fd(struct tctx *t)
{
	switch (pick(&t->r, 16)) {
	case 0: return -1;
	case 1: return 1000 + pick(&t->r, 100);   /* never open */
	default: return atomic_load(&fds[pick(&t->r, NFD)]);
	}
}

static void put_fd(struct tctx *t, int fd)
{
	int old;

	if (fd < 0)
		return;
	old = atomic_exchange(&fds[pick(&t->r, NFD)], fd);
	/* the slot's old descriptor goes (another thread may be in a call on
	 * it, or about to make one on its number: the race is wanted; kept,
	 * they would run the process out of descriptors) */
	if (old >= 0)
		close(old);
}

static uint32_t rand_domid(struct tctx *t)
{
	switch (pick(&t->r, 8)) {
	case 0: case 1: case 2: return peer_domid;
	case 3: return own_domid;
	case 4: return XEN_DOMID_SELF;
	case 5: return XEN_DOMID_ANY;
	case 6: return 1000 + pick(&t->r, 30000);   /* nobody */
	default: return (uint32_t)rnd(&t->r);
	}
}

static uint32_t rand_port(struct tctx *t)
{
	switch (pick(&t->r, 8)) {
	case 0: return XEN_PORT_ANY;
	case 1: return (uint32_t)rnd(&t->r);
	case 2: return 0;
	default: return port_base + pick(&t->r, NPORTS);
	}
}

/* an address and its length: mostly valid, sometimes wrong in one way */
static socklen_t rand_addr(struct tctx *t, struct sockaddr_storage *ss)
{
	struct sockaddr_xen *a = (struct sockaddr_xen *)ss;

	memset(ss, 0, sizeof(*ss));
	a->sxen_family = fam;
	a->sxen_port = rand_port(t);
	a->sxen_domid = rand_domid(t);
	switch (pick(&t->r, 12)) {
	case 0: a->sxen_flags = 1 + pick(&t->r, 0xffff); break;
	case 1: a->sxen_zero[pick(&t->r, 4)] = 1 + pick(&t->r, 255); break;
	case 2: a->sxen_family = pick(&t->r, 2) ? AF_INET : pick(&t->r, 64); break;
	case 3: return pick(&t->r, sizeof(struct sockaddr_xen));
	case 4: return sizeof(struct sockaddr_xen) + 1 + pick(&t->r, 64);
	}
	return sizeof(struct sockaddr_xen);
}

/* a buffer: in range, crossing into the unmapped page, NULL, or wild */
static void *rand_buf(struct tctx *t, size_t *len)
{
	static __thread char mine[1 << 17];

	switch (pick(&t->r, 10)) {
	case 0: *len = 1 + pick(&t->r, 64); return guard + page - pick(&t->r, (unsigned)*len);
	case 1: *len = pick(&t->r, 16); return NULL;
	case 2: *len = 1 + pick(&t->r, 4096); return (void *)(uintptr_t)(0xdead0000UL + pick(&t->r, 4096));
	case 3: *len = sizeof(mine); return mine;
	default: *len = pick(&t->r, 3) ? pick(&t->r, 512) : pick(&t->r, sizeof(mine)); return mine;
	}
}

static int rand_msg_flags(struct tctx *t)
{
	static const int f[] = { MSG_DONTWAIT, MSG_PEEK, MSG_WAITALL, MSG_TRUNC, MSG_ERRQUEUE,
				 MSG_OOB, MSG_NOSIGNAL, MSG_MORE, MSG_EOR, MSG_CMSG_CLOEXEC,
				 MSG_CONFIRM, MSG_DONTROUTE };
	int flags = 0, n = pick(&t->r, 4), i;

	for (i = 0; i < n; i++)
		flags |= f[pick(&t->r, sizeof(f) / sizeof(f[0]))];
	if (coin(&t->r, 16))
		flags |= (int)rnd(&t->r);
	/* a blocking call here is bounded by the thread's timer */
	return flags;
}

static int rand_int_value(struct tctx *t)
{
	static const int v[] = { 0, 1, -1, 2, 7, 64, 128, 4096, 65536, 1 << 20, 1 << 22,
				 1 << 30, INT32_MAX, INT32_MIN };
	return pick(&t->r, 4) ? v[pick(&t->r, sizeof(v) / sizeof(v[0]))] : (int)rnd(&t->r);
}

/* --- the calls */
static void op_socket(struct tctx *t)
{
	static const int types[] = { SOCK_STREAM, SOCK_SEQPACKET, SOCK_STREAM, SOCK_SEQPACKET,
				     SOCK_DGRAM, SOCK_RAW, 0, 77 };
	int type = types[pick(&t->r, 8)], proto = coin(&t->r, 8) ? (int)pick(&t->r, 300) : 0, fd;

	if (coin(&t->r, 2))
		type |= SOCK_NONBLOCK;
	if (coin(&t->r, 2))
		type |= SOCK_CLOEXEC;
	fd = socket(fam, type, proto);
	outcome("socket", 1, fd);
	put_fd(t, fd);
}

/* descriptors of other kinds, for the calls that take any descriptor */
static void op_other_kind(struct tctx *t)
{
	int fd = -1, p[2];

	switch (pick(&t->r, 6)) {
	case 0: fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0); break;
	case 1: fd = socket(AF_INET6, SOCK_STREAM, 0); break;
	case 2: fd = socket(AF_INET, SOCK_DGRAM, 0); break;
	case 3:
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, p) == 0) { put_fd(t, p[1]); fd = p[0]; }
		break;
	case 4:
		if (pipe2(p, O_NONBLOCK) == 0) { put_fd(t, p[1]); fd = p[0]; }
		break;
	default: fd = eventfd(0, EFD_NONBLOCK); break;
	}
	put_fd(t, fd);
}

static void op_bind(struct tctx *t)
{
	struct sockaddr_storage ss;
	int fd = rand_fd(t), x = is_afxen(fd);
	socklen_t l = rand_addr(t, &ss);
	long rc;

	if (coin(&t->r, 8) && x) {
		int one = 1;
		setsockopt(fd, fam, XENSOCK_REUSEPORT, &one, sizeof(one));
	}
	rc = bind(fd, coin(&t->r, 32) ? NULL : (struct sockaddr *)&ss, l);
	outcome("bind", x, rc);
}

static void op_listen(struct tctx *t)
{
	static const int b[] = { -1, 0, 1, 2, 5, 128, 4096, INT32_MAX };
	int fd = rand_fd(t), x = is_afxen(fd);

	outcome("listen", x, listen(fd, b[pick(&t->r, 8)]));
}

static void op_connect(struct tctx *t)
{
	struct sockaddr_storage ss;
	int fd = rand_fd(t), x = is_afxen(fd);
	socklen_t l = rand_addr(t, &ss);
	long rc;

	if (x && coin(&t->r, 2))
		fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
	begin(t, "connect");
	rc = connect(fd, (struct sockaddr *)&ss, l);
	end(t);
	outcome("connect", x, rc);
	if (rc == 0)
		atomic_fetch_add(&ok_connects, 1);
}

static void op_accept(struct tctx *t)
{
	static const int f[] = { 0, SOCK_NONBLOCK, SOCK_CLOEXEC, SOCK_NONBLOCK | SOCK_CLOEXEC, 0x40000000 };
	struct sockaddr_storage ss;
	socklen_t l = pick(&t->r, sizeof(ss) + 1);
	int fd = rand_fd(t), x = is_afxen(fd), c;

	begin(t, "accept4");
	c = accept4(fd, coin(&t->r, 4) ? NULL : (struct sockaddr *)&ss, coin(&t->r, 8) ? NULL : &l, f[pick(&t->r, 5)]);
	end(t);
	outcome("accept4", x, c);
	if (c >= 0) {
		atomic_fetch_add(&ok_accepts, 1);
		if (l > sizeof(ss))
			finding("accept4: address length %u beyond the room given", l);
		put_fd(t, c);
	}
}

static void op_send(struct tctx *t)
{
	struct sockaddr_storage ss;
	struct iovec iov[4];
	struct msghdr m = { 0 };
	int fd = rand_fd(t), x = is_afxen(fd), flags = rand_msg_flags(t) & ~(MSG_PEEK | MSG_WAITALL), i;
	size_t len;
	void *b = rand_buf(t, &len);
	long rc;
	char cbuf[CMSG_SPACE(sizeof(int) * 2)];

	begin(t, "send");
	switch (pick(&t->r, 5)) {
	case 0: rc = write(fd, b, len); break;
	case 1: rc = send(fd, b, len, flags); break;
	case 2: rc = sendto(fd, b, len, flags, (struct sockaddr *)&ss, rand_addr(t, &ss)); break;
	case 3: {
		int n = 1 + pick(&t->r, 4);

		for (i = 0; i < n; i++) { iov[i].iov_base = rand_buf(t, &iov[i].iov_len); }
		rc = writev(fd, iov, n);
		break;
	}
	default: {
		int n = pick(&t->r, 5);

		for (i = 0; i < n; i++) { iov[i].iov_base = rand_buf(t, &iov[i].iov_len); }
		m.msg_iov = iov;
		m.msg_iovlen = n;
		if (coin(&t->r, 4)) {
			/* SCM_RIGHTS over AF_XEN: descriptors the family does not carry */
			struct cmsghdr *c;
			int two[2] = { rand_fd(t), rand_fd(t) };

			m.msg_control = cbuf;
			m.msg_controllen = sizeof(cbuf);
			c = CMSG_FIRSTHDR(&m);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(two));
			memcpy(CMSG_DATA(c), two, sizeof(two));
		}
		if (coin(&t->r, 8)) {
			m.msg_name = &ss;
			m.msg_namelen = rand_addr(t, &ss);
		}
		rc = sendmsg(fd, &m, flags);
	}
	}
	end(t);
	outcome("send", x, rc);
	if (rc > 0)
		atomic_fetch_add(&ok_sends, 1);
}

static void op_recv(struct tctx *t)
{
	struct sockaddr_storage ss;
	struct iovec iov[4];
	struct msghdr m = { 0 };
	char cbuf[256];
	int fd = rand_fd(t), x = is_afxen(fd), flags = rand_msg_flags(t), i, n = 1;
	size_t len, total;
	void *b = rand_buf(t, &len);
	socklen_t l = pick(&t->r, sizeof(ss) + 1);
	long rc;

	total = len;
	begin(t, "recv");
	switch (pick(&t->r, 5)) {
	case 0: rc = read(fd, b, len); break;
	case 1: rc = recv(fd, b, len, flags); break;
	case 2: rc = recvfrom(fd, b, len, flags, (struct sockaddr *)&ss, &l); break;
	case 3:
		n = 1 + pick(&t->r, 4);
		total = 0;
		for (i = 0; i < n; i++) { iov[i].iov_base = rand_buf(t, &iov[i].iov_len); total += iov[i].iov_len; }
		rc = readv(fd, iov, n);
		break;
	default:
		n = pick(&t->r, 5);
		total = 0;
		for (i = 0; i < n; i++) { iov[i].iov_base = rand_buf(t, &iov[i].iov_len); total += iov[i].iov_len; }
		m.msg_iov = iov;
		m.msg_iovlen = n;
		if (coin(&t->r, 2)) { m.msg_control = cbuf; m.msg_controllen = pick(&t->r, sizeof(cbuf)); }
		if (coin(&t->r, 2)) { m.msg_name = &ss; m.msg_namelen = pick(&t->r, sizeof(ss)); }
		rc = recvmsg(fd, &m, flags);
		if (rc >= 0 && m.msg_namelen > sizeof(ss))
			finding("recvmsg: msg_namelen %u beyond the room given", m.msg_namelen);
		break;
	}
	end(t);
	outcome("recv", x, rc);
	if (rc > 0) {
		atomic_fetch_add(&ok_recvs, 1);
		/* MSG_TRUNC on a record may say how long it was */
		if (x && (size_t)rc > total && !(flags & MSG_TRUNC))
			finding("recv: returned %ld bytes for room of %zu", rc, total);
	}
}

static void op_poll(struct tctx *t)
{
	struct pollfd p[4];
	int i, n = 1 + pick(&t->r, 4);

	for (i = 0; i < n; i++) {
		p[i].fd = rand_fd(t);
		p[i].events = (short)(coin(&t->r, 4) ? rnd(&t->r) : (POLLIN | POLLOUT | POLLRDHUP));
	}
	begin(t, "poll");
	outcome("poll", 0, poll(p, n, pick(&t->r, 50)));
	end(t);
}

static void op_epoll(struct tctx *t)
{
	static __thread int ep = -1;
	struct epoll_event ev = { 0 }, out[8];
	int fd = rand_fd(t);

	if (ep < 0 || coin(&t->r, 64)) {
		if (ep >= 0)
			close(ep);
		ep = epoll_create1(EPOLL_CLOEXEC);
	}
	ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP | (coin(&t->r, 2) ? EPOLLET : 0)
		| (coin(&t->r, 8) ? EPOLLONESHOT : 0);
	ev.data.fd = fd;
	switch (pick(&t->r, 3)) {
	case 0: epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev); break;
	case 1: epoll_ctl(ep, EPOLL_CTL_MOD, fd, &ev); break;
	default: epoll_ctl(ep, EPOLL_CTL_DEL, fd, NULL); break;
	}
	begin(t, "epoll_wait");
	outcome("epoll_wait", 0, epoll_wait(ep, out, 8, pick(&t->r, 50)));
	end(t);
}

static void op_sockopt(struct tctx *t)
{
	static const int sol[] = { SO_RCVBUF, SO_SNDBUF, SO_RCVTIMEO, SO_SNDTIMEO, SO_RCVLOWAT,
				   SO_SNDLOWAT, SO_LINGER, SO_ERROR, SO_TYPE, SO_ACCEPTCONN,
				   SO_DOMAIN, SO_BUSY_POLL, SO_KEEPALIVE, SO_REUSEADDR,
				   SO_REUSEPORT, SO_PEEK_OFF, SO_RCVBUFFORCE, SO_PROTOCOL,
				   SO_PEERCRED, SO_ZEROCOPY, SO_INCOMING_CPU, SO_MARK };
	int fd = rand_fd(t), x = is_afxen(fd), level, name, v[8];
	socklen_t l;
	void *p = v;
	long rc;

	switch (pick(&t->r, 6)) {
	case 0: case 1: level = SOL_SOCKET; name = sol[pick(&t->r, sizeof(sol) / sizeof(sol[0]))]; break;
	case 2: level = fam; name = coin(&t->r, 2) ? XENSOCK_REUSEPORT : 0x7e50 + (int)pick(&t->r, 32); break;
	case 3: level = IPPROTO_TCP; name = pick(&t->r, 40); break;
	case 4: level = IPPROTO_IP; name = pick(&t->r, 60); break;
	default: level = (int)pick(&t->r, 300); name = (int)pick(&t->r, 100); break;
	}
	for (l = 0; l < 8; l++)
		v[l] = rand_int_value(t);
	switch (pick(&t->r, 8)) {
	case 0: l = 0; break;
	case 1: l = 1 + pick(&t->r, 3); break;
	case 2: l = sizeof(v); break;
	case 3: l = 1 + pick(&t->r, 64); p = guard + page - l / 2; break;
	case 4: l = 4; p = NULL; break;
	case 5: l = 8 + pick(&t->r, 8); break;
	default: l = sizeof(int); break;
	}
	if (coin(&t->r, 2)) {
		rc = setsockopt(fd, level, name, p, l);
		outcome("setsockopt", x && (level == SOL_SOCKET || level == fam), rc);
	} else {
		socklen_t got = l, *lp = coin(&t->r, 16) ? NULL : &got;

		rc = getsockopt(fd, level, name, p, lp);
		outcome("getsockopt", x && (level == SOL_SOCKET || level == fam), rc);
		if (rc == 0 && lp && got > l && p)
			finding("getsockopt(%d, %d): wrote %u bytes into room for %u", level, name, got, l);
	}
}

static void op_ioctl(struct tctx *t)
{
	int fd = rand_fd(t), x = is_afxen(fd), v = 0;
	struct xensock_graft g;
	struct xensock_resolve r;
	long rc;
	uint32_t d;

	begin(t, "ioctl");
	switch (pick(&t->r, 9)) {
	case 0: rc = ioctl(fd, FIONREAD, coin(&t->r, 8) ? NULL : &v); break;
	case 1: rc = ioctl(fd, SIOCOUTQ, &v); break;
	case 2: rc = ioctl(fd, XENSOCK_IOC_LOCAL_DOMID, coin(&t->r, 8) ? (void *)(guard + page) : (void *)&d); break;
	case 3: case 4: {
		/* GRAFT: a descriptor of any kind, a wrong address or length */
		struct sockaddr_in *in = (struct sockaddr_in *)g.addr;

		memset(&g, 0, sizeof(g));
		g.fd = coin(&t->r, 3) ? socket(AF_INET, SOCK_STREAM, 0) : rand_fd(t);
		in->sin_family = coin(&t->r, 4) ? AF_INET6 : AF_INET;
		in->sin_port = htons(port_base);
		in->sin_addr.s_addr = htonl(0x0a00000b + pick(&t->r, 2));
		g.addrlen = coin(&t->r, 4) ? pick(&t->r, 40) : (in->sin_family == AF_INET ? 16 : 28);
		rc = ioctl(fd, XENSOCK_IOC_GRAFT, coin(&t->r, 16) ? NULL : &g);
		if (rc == 0)
			atomic_fetch_add(&ok_grafts, 1);
		/* the grafted descriptor is an AF_XEN connection now */
		put_fd(t, g.fd);
		break;
	}
	case 5: {
		memset(&r, 0, sizeof(r));
		r.family = coin(&t->r, 4) ? (uint16_t)rnd(&t->r) : (coin(&t->r, 2) ? AF_INET : AF_INET6);
		r.zero = coin(&t->r, 8);
		r.addr[0] = 10; r.addr[3] = 11 + pick(&t->r, 3);
		rc = ioctl(fd, XENSOCK_IOC_RESOLVE, &r);
		break;
	}
	case 6: v = coin(&t->r, 2); rc = ioctl(fd, FIONBIO, &v); break;
	case 7: rc = ioctl(fd, _IOC(pick(&t->r, 4), 'X', pick(&t->r, 0x20), pick(&t->r, 64)), guard); break;
	default:
		/* any number: the socket layer's own ioctls answer many, with
		 * errnos of their own */
		rc = ioctl(fd, (unsigned long)rnd(&t->r), guard);
		x = 0;
		break;
	}
	end(t);
	outcome("ioctl", x, rc);
}

static void op_names(struct tctx *t)
{
	struct sockaddr_storage ss;
	socklen_t l = pick(&t->r, sizeof(ss) + 1), l0 = l;
	int fd = rand_fd(t), x = is_afxen(fd);
	long rc;

	rc = coin(&t->r, 2) ? getsockname(fd, (struct sockaddr *)&ss, &l)
			    : getpeername(fd, coin(&t->r, 16) ? (struct sockaddr *)(guard + page) : (struct sockaddr *)&ss, &l);
	outcome("getname", x, rc);
	(void)l0;
}

static void op_shutdown(struct tctx *t)
{
	int fd = rand_fd(t), x = is_afxen(fd);

	begin(t, "shutdown");
	outcome("shutdown", x, shutdown(fd, coin(&t->r, 8) ? (int)pick(&t->r, 10) - 2 : (int)pick(&t->r, 3)));
	end(t);
}

static void op_close(struct tctx *t)
{
	int i = pick(&t->r, NFD), fd = atomic_exchange(&fds[i], -1);

	if (fd < 0)
		return;
	if (is_afxen(fd) && coin(&t->r, 4)) {
		struct linger lg = { 1, (int)pick(&t->r, 2) };
		setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	begin(t, "close");
	close(fd);
	end(t);
}

static void op_dup(struct tctx *t)
{
	int fd = rand_fd(t), n;

	switch (pick(&t->r, 3)) {
	case 0: n = dup(fd); put_fd(t, n); break;
	case 1: {
		/* onto a descriptor another thread may be using */
		int target = atomic_load(&fds[pick(&t->r, NFD)]);

		if (target > 2)
			dup2(fd, target);
		break;
	}
	default: n = fcntl(fd, F_DUPFD_CLOEXEC, 100); put_fd(t, n); break;
	}
}

/* a descriptor sent through a Unix socket to ourselves and back */
static void op_scm_rights(struct tctx *t)
{
	int p[2], fd = rand_fd(t), got = -1;
	char c = 'x', cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = { &c, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf) };
	struct cmsghdr *cm;

	if (fd < 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, p))
		return;
	cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof(int));
	if (sendmsg(p[0], &m, MSG_DONTWAIT) == 1) {
		/* half the time the descriptor dies in flight with the pair */
		if (coin(&t->r, 2)) {
			m.msg_controllen = sizeof(cbuf);
			if (recvmsg(p[1], &m, MSG_DONTWAIT) == 1 && (cm = CMSG_FIRSTHDR(&m)))
				memcpy(&got, CMSG_DATA(cm), sizeof(int));
		}
	}
	close(p[0]);
	close(p[1]);
	put_fd(t, got);
}

static void run_ops(struct tctx *t, int n);

/* a child that inherits every descriptor, makes calls for a while, dies */
static void op_fork(struct tctx *t)
{
	static atomic_int children;
	pid_t c;

	if (t->idx == MAX_THREADS || atomic_load(&children) >= 4)
		return;
	c = fork();
	if (c == 0) {
		struct tctx ct = { .idx = MAX_THREADS, .r = { t->r.s ^ 0x5bd1e995 } };
		struct sigevent se = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGUSR1 };

		se._sigev_un._tid = (pid_t)syscall(SYS_gettid);
		ct.have_timer = timer_create(CLOCK_MONOTONIC, &se, &ct.timer) == 0;
		/* the child dies with whatever it holds open, at the latest here */
		alarm(20);
		run_ops(&ct, 20 + pick(&ct.r, 200));
		_exit(0);
	}
	if (c > 0)
		atomic_fetch_add(&children, 1);
	while ((c = waitpid(-1, NULL, WNOHANG)) > 0)
		atomic_fetch_sub(&children, 1);
}

static void op_socketpair_mmap(struct tctx *t)
{
	int p[2], fd = rand_fd(t), x = is_afxen(fd);
	void *m;

	if (coin(&t->r, 2)) {
		outcome("socketpair", 1, socketpair(fam, SOCK_STREAM, 0, p));
		return;
	}
	m = mmap(NULL, page, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	outcome("mmap", x, m == MAP_FAILED ? -1 : 0);
	if (m != MAP_FAILED)
		munmap(m, page);
}

/* connect to a listener of the peer's and move some bytes */
static void op_real_connect(struct tctx *t)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port_base + pick(&t->r, NPORTS),
				  .sxen_domid = coin(&t->r, 4) ? own_domid : peer_domid };
	int fd = socket(fam, coin(&t->r, 4) ? SOCK_SEQPACKET : SOCK_STREAM, 0);
	char b[2048];
	long rc;

	if (fd < 0)
		return;
	begin(t, "connect-real");
	rc = connect(fd, (struct sockaddr *)&a, sizeof(a));
	end(t);
	outcome("connect-real", 1, rc);
	if (rc == 0) {
		atomic_fetch_add(&ok_connects, 1);
		memset(b, pick(&t->r, 256), sizeof(b));
		begin(t, "send-real");
		rc = send(fd, b, 1 + pick(&t->r, sizeof(b)), MSG_NOSIGNAL | MSG_DONTWAIT);
		end(t);
		outcome("send-real", 1, rc);
	}
	put_fd(t, fd);
}

typedef void (*op_fn)(struct tctx *);
static const struct { op_fn fn; unsigned weight; } ops[] = {
	{ op_socket, 8 }, { op_other_kind, 2 }, { op_bind, 6 }, { op_listen, 4 },
	{ op_connect, 6 }, { op_real_connect, 4 }, { op_accept, 4 }, { op_send, 8 },
	{ op_recv, 8 }, { op_poll, 3 }, { op_epoll, 3 }, { op_sockopt, 8 }, { op_ioctl, 6 },
	{ op_names, 3 }, { op_shutdown, 3 }, { op_close, 6 }, { op_dup, 2 },
	{ op_scm_rights, 1 }, { op_fork, 1 }, { op_socketpair_mmap, 1 },
};

static void run_ops(struct tctx *t, int n)
{
	unsigned total = 0, i, w;

	for (i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		total += ops[i].weight;
	while (n-- != 0 && now_ns() / 1e9 < deadline) {
		w = pick(&t->r, total);
		for (i = 0; w >= ops[i].weight; i++)
			w -= ops[i].weight;
		ops[i].fn(t);
	}
}

static void *worker(void *arg)
{
	struct tctx *t = arg;
	struct sigevent se = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGUSR1 };

	slots[t->idx].tid = (pid_t)syscall(SYS_gettid);
	se._sigev_un._tid = slots[t->idx].tid;
	t->have_timer = timer_create(CLOCK_MONOTONIC, &se, &t->timer) == 0;
	run_ops(t, -1);
	return NULL;
}

/* the process's own listener: accepts, reads and writes a little, closes */
static void *anchor(void *arg)
{
	int l = (int)(intptr_t)arg;
	char b[4096];

	for (;;) {
		int c = accept4(l, NULL, NULL, SOCK_NONBLOCK);

		if (c < 0) {
			if (now_ns() / 1e9 >= deadline)
				return NULL;
			usleep(20000);
			continue;
		}
		for (int i = 0; i < 8; i++) {
			if (recv(c, b, sizeof(b), MSG_DONTWAIT) < 0 && errno != EAGAIN)
				break;
			send(c, b, 1 + (i * 97) % sizeof(b), MSG_DONTWAIT | MSG_NOSIGNAL);
			usleep(5000);
		}
		close(c);
	}
}

static void read_peer(void)
{
	FILE *f;
	unsigned d;

	if (!peer_file || !(f = fopen(peer_file, "r")))
		return;
	if (fscanf(f, "%u", &d) == 1)
		atomic_store(&peer_domid, d);
	fclose(f);
}

/* the watchdog: a call still blocked HANG_SECS after its timer fired */
static void check_hangs(void)
{
	long n = now_ns();

	for (int i = 0; i <= MAX_THREADS; i++) {
		long s = atomic_load(&slots[i].started_ns);

		if (s && n - s > HANG_SECS * 1000000000L) {
			char path[64], wchan[64] = "?";
			FILE *f;

			snprintf(path, sizeof(path), "/proc/self/task/%d/wchan", slots[i].tid);
			if ((f = fopen(path, "r"))) {
				if (!fgets(wchan, sizeof(wchan), f))
					wchan[0] = 0;
				fclose(f);
			}
			finding("%s blocked %ld s after its timer fired (thread %d, wchan %s)",
				slots[i].op, (n - s) / 1000000000L, slots[i].tid, wchan);
			atomic_store(&slots[i].started_ns, 0);
		}
	}
}

static int fuzz_process(int proc, uint64_t seed, int threads, int seconds)
{
	pthread_t th[MAX_THREADS], an;
	struct tctx ctx[MAX_THREADS];
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port_base + proc, .sxen_domid = XEN_DOMID_ANY };
	struct sigaction sa = { .sa_handler = on_usr1 };
	int l, i;

	sigaction(SIGUSR1, &sa, NULL);   /* no SA_RESTART: blocking calls end with EINTR */
	signal(SIGPIPE, SIG_IGN);
	for (i = 0; i < NFD; i++)
		atomic_store(&fds[i], -1);
	l = socket(fam, SOCK_STREAM, 0);
	if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof(a)) || listen(l, 64)) {
		printf("xsfuzz[%s %d]: no listener on port %u: %s\n", name, proc, a.sxen_port, strerror(errno));
		return 2;
	}
	pthread_create(&an, NULL, anchor, (void *)(intptr_t)l);
	for (i = 0; i < threads; i++) {
		ctx[i] = (struct tctx){ .idx = i, .r = { seed * 0x9e3779b97f4a7c15ULL + proc * 1000003ULL + i * 7919ULL + 1 } };
		pthread_create(&th[i], NULL, worker, &ctx[i]);
	}
	/* signals at random threads, and the hang watch */
	struct rng r = { seed ^ 0xa5a5a5a5ULL ^ (uint64_t)proc };
	unsigned ticks = 0;
	while (now_ns() / 1e9 < deadline) {
		usleep(50000 + pick(&r, 200000));
		syscall(SYS_tgkill, getpid(), slots[pick(&r, threads)].tid, SIGUSR1);
		check_hangs();
		if (++ticks % 30 == 0)
			read_peer();
	}
	/* the workers end at the deadline, each after its call in progress */
	for (i = 0; i < threads; i++) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += HANG_SECS + 5;
		if (pthread_timedjoin_np(th[i], NULL, &ts)) {
			check_hangs();
			finding("thread %d did not end within %d s of the deadline (in %s)", i, HANG_SECS + 5,
				slots[i].op ? slots[i].op : "?");
		}
	}
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
	printf("xsfuzz[%s %d]: %ld calls; %ld connects, %ld accepts, %ld grafts, %ld sends, %ld receives succeeded; %ld findings\n",
	       name, proc, atomic_load(&calls), atomic_load(&ok_connects), atomic_load(&ok_accepts),
	       atomic_load(&ok_grafts), atomic_load(&ok_sends), atomic_load(&ok_recvs), atomic_load(&findings));
	fflush(stdout);
	(void)seconds;
	return atomic_load(&findings) ? 1 : 0;
}

int main(int argc, char **argv)
{
	uint64_t seed = 0;
	int seconds = 60, procs = 2, threads = 4, o, i, bad = 0;
	FILE *f;

	while ((o = getopt(argc, argv, "s:t:p:P:T:b:n:")) != -1) {
		switch (o) {
		case 's': seed = strtoull(optarg, NULL, 0); break;
		case 't': seconds = atoi(optarg); break;
		case 'p':
			if (optarg[0] == '/')
				peer_file = optarg;
			else
				peer_domid = strtoul(optarg, NULL, 0);
			break;
		case 'P': procs = atoi(optarg); break;
		case 'T': threads = atoi(optarg); break;
		case 'b': port_base = strtoul(optarg, NULL, 0); break;
		case 'n': name = optarg; break;
		default:
			fprintf(stderr, "usage: xsfuzz -s SEED -t SECONDS -p PEER_DOMID|FILE [-P PROCS] [-T THREADS] [-b PORT_BASE] [-n NAME]\n");
			return 2;
		}
	}
	if (threads < 1 || threads > MAX_THREADS || procs < 1 || procs > NPORTS || seconds < 1) {
		fprintf(stderr, "xsfuzz: 1..%d threads, 1..%d processes, 1 s or more\n", MAX_THREADS, NPORTS);
		return 2;
	}
	read_peer();
	fam = xensock_family();
	if (fam < 0) {
		fprintf(stderr, "xsfuzz: af_xen is not loaded (%s)\n", XENSOCK_FAMILY_SYSFS);
		return 2;
	}
	{
		int s = socket(fam, SOCK_STREAM, 0);

		if (s < 0 || ioctl(s, XENSOCK_IOC_LOCAL_DOMID, &own_domid)) {
			fprintf(stderr, "xsfuzz: XENSOCK_IOC_LOCAL_DOMID: %s\n", strerror(errno));
			return 2;
		}
		close(s);
	}
	page = sysconf(_SC_PAGESIZE);
	guard = mmap(NULL, 2 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (guard == MAP_FAILED || mprotect(guard + page, page, PROT_NONE)) {
		perror("xsfuzz: guard pages");
		return 2;
	}
	deadline = now_ns() / 1e9 + seconds;
	printf("xsfuzz[%s]: seed %llu, %d s, %d processes x %d threads, own dom%u, peer dom%u, ports %u..%u\n",
	       name, (unsigned long long)seed, seconds, procs, threads, own_domid, atomic_load(&peer_domid), port_base,
	       port_base + NPORTS - 1);
	fflush(stdout);
	if ((f = fopen("/proc/self/oom_score_adj", "w"))) {
		fputs("500", f);
		fclose(f);
	}
	for (i = 0; i < procs; i++) {
		if (fork() == 0)
			_exit(fuzz_process(i, seed, threads, seconds));
	}
	for (i = 0; i < procs; i++) {
		int st;
		pid_t p = wait(&st);

		if (p < 0)
			break;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			printf("xsfuzz[%s]: process %d ended with %s %d\n", name, p,
			       WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
			bad++;
		}
	}
	return bad ? 1 : 0;
}
