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

/* a counter of /proc/net/af_xen_stats, or -1 */
static inline long long afx_stat(const char *name)
{
	FILE *f = fopen("/proc/net/af_xen_stats", "r");
	char key[64];
	long long v, r = -1;

	if (!f)
		return -1;
	while (fscanf(f, "%63s %lld", key, &v) == 2)
		if (!strcmp(key, name))
			r = v;
	fclose(f);
	return r;
}

/* this guest's domid, 0 if XenStore cannot say */
static inline uint32_t own_domid(void)
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

/* the 64-bit words the stream tests send and check: word i of a stream */
static inline uint64_t pattern_word(uint64_t i) { return (i * 2654435761u) >> 7 ^ (i << 29); }

static inline int write_full(int fd, const void *p, size_t n)
{
	const char *c = p;

	while (n) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);

		if (w <= 0)
			return -1;
		c += w;
		n -= w;
	}
	return 0;
}

static inline int read_full(int fd, void *p, size_t n)
{
	char *c = p;

	while (n) {
		ssize_t r = recv(fd, c, n, 0);

		if (r <= 0)
			return -1;
		c += r;
		n -= r;
	}
	return 0;
}

/* stream `total` bytes of pattern_word() out in writes of `wsize` (multiple of 8) */
static inline int stream_out(int fd, uint64_t total, size_t wsize)
{
	static uint64_t blk[(4 << 20) / 8];
	uint64_t i = 0, words = total / 8, per = wsize / 8;

	while (i < words) {
		uint64_t n = words - i < per ? words - i : per, k;

		for (k = 0; k < n; k++)
			blk[k] = pattern_word(i + k);
		if (write_full(fd, blk, n * 8))
			return -1;
		i += n;
	}
	return 0;
}

/* read to EOF checking the pattern; bytes read, -1 on error or mismatch */
static inline int64_t stream_in(int fd)
{
	static uint64_t blk[8192];
	uint64_t got = 0;

	for (;;) {
		ssize_t r = recv(fd, blk, sizeof(blk), MSG_WAITALL);
		uint64_t k;

		if (r < 0)
			return -1;
		if (r == 0)
			return got;
		if (r % 8) {
			if (read_full(fd, (char *)blk + r, 8 - r % 8))
				return -1;
			r += 8 - r % 8;
		}
		for (k = 0; k < (uint64_t)r / 8; k++)
			if (blk[k] != pattern_word(got / 8 + k))
				return -1;
		got += r;
	}
}

#endif
