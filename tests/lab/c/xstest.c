// SPDX-License-Identifier: GPL-2.0
/*
 * xstest: C tests of the AF_XEN socket family (af_xen.ko), run in the lab
 * guests by tests/lab/kmod. Every check prints a lab marker line:
 *   @@RESULT c-<name> PASS|FAIL [detail]
 * and the exit status is the number of failures (capped at 100).
 *
 *   xstest local            calls within one domain: socket/bind/listen/
 *                           getsockname/accept/connect and their errno cases
 *   xstest hold N           keep a socket open N seconds (rmmod refusal)
 *   xstest autoload         socket(19) with the module unloaded
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
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "xensock.h"

static int failures;
static int fam;

static void result(const char *name, int ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void result(const char *name, int ok, const char *fmt, ...)
{
	char detail[256] = "";
	va_list ap;

	if (fmt) {
		va_start(ap, fmt);
		vsnprintf(detail, sizeof(detail), fmt, ap);
		va_end(ap);
	}
	printf("@@RESULT c-%s %s%s%s\n", name, ok ? "PASS" : "FAIL", detail[0] ? " " : "", detail);
	fflush(stdout);
	if (!ok)
		failures++;
}

/* expect a call to fail with errno e */
#define EXPECT_ERR(name, call, e) do { \
	errno = 0; long _r = (long)(call); int _e = errno; \
	result(name, _r == -1 && _e == (e), "rc=%ld errno=%s want=%s", _r, strerrorname_np(_e) ?: "0", strerrorname_np(e)); \
} while (0)
#define EXPECT_OK(name, call) do { \
	errno = 0; long _r = (long)(call); int _e = errno; \
	result(name, _r >= 0, "rc=%ld errno=%s", _r, _r < 0 ? (strerrorname_np(_e) ?: "?") : "0"); \
} while (0)

static struct sockaddr_xen xaddr(uint32_t domid, uint32_t port)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = domid };
	return a;
}

static int xsock(void)
{
	return socket(fam, SOCK_STREAM, 0);
}

static double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static uint32_t own_domid(void)
{
	FILE *p = popen("xenstore-read domid", "r");
	unsigned d = 0;

	if (p) {
		if (fscanf(p, "%u", &d) != 1)
			d = 0;
		pclose(p);
	}
	return d;
}

static void test_local(void)
{
	uint32_t me = own_domid();
	struct sockaddr_xen a, b;
	socklen_t len;
	int s, s2, v;

	result("family-sysfs", fam == XENSOCK_FAMILY_DEFAULT, "family=%d", fam);

	/* socket() */
	s = xsock();
	result("socket-stream", s >= 0, "fd=%d errno=%s", s, strerrorname_np(errno) ?: "0");
	EXPECT_ERR("socket-dgram", socket(fam, SOCK_DGRAM, 0), ESOCKTNOSUPPORT);
	EXPECT_ERR("socket-protocol", socket(fam, SOCK_STREAM, 7), EPROTONOSUPPORT);
	len = sizeof(v);
	result("so-domain", getsockopt(s, SOL_SOCKET, SO_DOMAIN, &v, &len) == 0 && v == fam, "v=%d", v);
	len = sizeof(v);
	result("so-type", getsockopt(s, SOL_SOCKET, SO_TYPE, &v, &len) == 0 && v == SOCK_STREAM, "v=%d", v);

	/* getsockname of an unbound socket */
	memset(&b, 0xAA, sizeof(b));
	len = sizeof(b);
	EXPECT_OK("getsockname-unbound", getsockname(s, (struct sockaddr *)&b, &len));
	result("getsockname-unbound-any", len == sizeof(b) && b.sxen_port == XEN_PORT_ANY && b.sxen_family == fam,
	       "len=%u port=%#x", len, b.sxen_port);
	len = sizeof(b);
	EXPECT_ERR("getpeername-unconnected", getpeername(s, (struct sockaddr *)&b, &len), ENOTCONN);

	/* bind() error cases */
	a = xaddr(XEN_DOMID_ANY, 5000);
	EXPECT_ERR("bind-short-len", bind(s, (struct sockaddr *)&a, sizeof(a) - 1), EINVAL);
	a.sxen_family = AF_INET;
	EXPECT_ERR("bind-bad-family", bind(s, (struct sockaddr *)&a, sizeof(a)), EAFNOSUPPORT);
	a = xaddr(XEN_DOMID_ANY, 5000);
	a.sxen_flags = 1;
	EXPECT_ERR("bind-bad-flags", bind(s, (struct sockaddr *)&a, sizeof(a)), EINVAL);
	a = xaddr(me + 1000, 5000);
	EXPECT_ERR("bind-foreign-domid", bind(s, (struct sockaddr *)&a, sizeof(a)), EADDRNOTAVAIL);
	EXPECT_ERR("bind-efault", bind(s, (struct sockaddr *)8, sizeof(a)), EFAULT);

	/* bind() explicit */
	a = xaddr(XEN_DOMID_ANY, 5000);
	EXPECT_OK("bind-explicit", bind(s, (struct sockaddr *)&a, sizeof(a)));
	len = sizeof(b);
	getsockname(s, (struct sockaddr *)&b, &len);
	result("getsockname-bound", b.sxen_port == 5000 && b.sxen_domid == me && len == sizeof(b),
	       "port=%u domid=%u me=%u", b.sxen_port, b.sxen_domid, me);
	EXPECT_ERR("bind-twice", bind(s, (struct sockaddr *)&a, sizeof(a)), EINVAL);
	s2 = xsock();
	EXPECT_ERR("bind-in-use", bind(s2, (struct sockaddr *)&a, sizeof(a)), EADDRINUSE);
	a = xaddr(me, XEN_PORT_ANY);
	EXPECT_OK("bind-ephemeral", bind(s2, (struct sockaddr *)&a, sizeof(a)));
	len = sizeof(b);
	getsockname(s2, (struct sockaddr *)&b, &len);
	result("bind-ephemeral-port", b.sxen_port >= 49152 && b.sxen_port != XEN_PORT_ANY, "port=%u", b.sxen_port);
	close(s2);

	/* listen() / accept() */
	EXPECT_OK("listen", listen(s, 16));
	EXPECT_OK("listen-again", listen(s, 32));
	fcntl(s, F_SETFL, O_NONBLOCK);
	EXPECT_ERR("accept-nonblock-empty", accept(s, NULL, NULL), EAGAIN);
	fcntl(s, F_SETFL, 0);
	EXPECT_ERR("accept4-nonblock-empty", accept4(s, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), EAGAIN);
	{
		struct timeval tv = { 0, 200000 };
		double t0;

		setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		t0 = now();
		EXPECT_ERR("accept-rcvtimeo", accept(s, NULL, NULL), EAGAIN);
		result("accept-rcvtimeo-time", now() - t0 >= 0.19 && now() - t0 < 2, "%.3fs", now() - t0);
	}
	{
		struct pollfd p = { .fd = s, .events = POLLIN | POLLOUT };
		int n = poll(&p, 1, 0);

		result("poll-listener-idle", n == 0, "n=%d revents=%#x", n, p.revents);
	}
	EXPECT_ERR("connect-on-listener", connect(s, (struct sockaddr *)&a, sizeof(a)), EINVAL);
	s2 = xsock();
	EXPECT_ERR("accept-not-listening", accept(s2, NULL, NULL), EINVAL);
	EXPECT_OK("listen-autobind", listen(s2, 1));
	len = sizeof(b);
	getsockname(s2, (struct sockaddr *)&b, &len);
	result("listen-autobind-port", b.sxen_port >= 49152 && b.sxen_port != XEN_PORT_ANY, "port=%u", b.sxen_port);
	close(s2);

	/* unconnected data calls */
	s2 = xsock();
	{
		char c = 'x';

		EXPECT_ERR("send-unconnected", send(s2, &c, 1, MSG_NOSIGNAL), ENOTCONN);
		EXPECT_ERR("recv-unconnected", recv(s2, &c, 1, MSG_DONTWAIT), ENOTCONN);
		EXPECT_ERR("shutdown-unconnected", shutdown(s2, SHUT_WR), ENOTCONN);
	}
	/* connect() error cases */
	a = xaddr(me, 5999);
	EXPECT_ERR("connect-short-len", connect(s2, (struct sockaddr *)&a, 4), EINVAL);
	a.sxen_family = AF_UNIX;
	EXPECT_ERR("connect-bad-family", connect(s2, (struct sockaddr *)&a, sizeof(a)), EAFNOSUPPORT);
	a = xaddr(XEN_DOMID_ANY, 5999);
	EXPECT_ERR("connect-any-domid", connect(s2, (struct sockaddr *)&a, sizeof(a)), EINVAL);
	a = xaddr(me, 5999);
	EXPECT_ERR("connect-refused-self", connect(s2, (struct sockaddr *)&a, sizeof(a)), ECONNREFUSED);
	close(s2);

	/* the port is free again once its socket is closed */
	close(s);
	s = xsock();
	a = xaddr(XEN_DOMID_ANY, 5000);
	EXPECT_OK("bind-after-close", bind(s, (struct sockaddr *)&a, sizeof(a)));
	close(s);
}

int main(int argc, char **argv)
{
	const char *mode = argc > 1 ? argv[1] : "local";

	signal(SIGPIPE, SIG_IGN);
	if (!strcmp(mode, "autoload")) {
		/* module not loaded: socket(19) must load it by alias net-pf-19 */
		int s = socket(XENSOCK_FAMILY_DEFAULT, SOCK_STREAM, 0);

		result("autoload-socket", s >= 0, "errno=%s", s < 0 ? strerrorname_np(errno) : "0");
		return s < 0;
	}
	fam = xensock_family();
	if (fam < 0) {
		result("family-sysfs", 0, "cannot read %s: %s", XENSOCK_FAMILY_SYSFS, strerror(errno));
		return 1;
	}
	if (!strcmp(mode, "local")) {
		test_local();
	} else if (!strcmp(mode, "hold")) {
		/* keep one AF_XEN socket open for argv[2] seconds */
		int s = xsock();

		if (s < 0)
			return 1;
		sleep(argc > 2 ? atoi(argv[2]) : 3);
		close(s);
		return 0;
	} else {
		fprintf(stderr, "usage: xstest local\n");
		return 2;
	}
	printf("xstest %s: %d failure(s)\n", mode, failures);
	return failures > 100 ? 100 : failures;
}
