/* SPDX-License-Identifier: GPL-2.0 */
/*
 * What every C test program of the lab shares: the @@RESULT line the lab
 * collects (checked against EXPECT in each scenario.conf), the failure count, the
 * family number read from sysfs, and small helpers. Include after the
 * system headers and xensock.h.
 */
#ifndef XSTEST_COMMON_H
#define XSTEST_COMMON_H

static int failures;
static int fam;

static inline void result(const char *name, int ok, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static inline void result(const char *name, int ok, const char *fmt, ...)
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

static inline struct sockaddr_xen xaddr(uint32_t domid, uint32_t port)
{
	struct sockaddr_xen a = { .sxen_family = fam, .sxen_port = port, .sxen_domid = domid };
	return a;
}

static inline double now(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

#endif
