// SPDX-License-Identifier: GPL-2.0
/*
 * xs-tracebuf.so: an LD_PRELOAD library for dom0's xenstored in the lab.
 *
 * xenstored -T writes its request trace with one write(2) per byte, which
 * under TCG slows it enough to hide the race that kills it now and then
 * (an assertion in consider_message). This keeps
 * what xenstored traces in memory instead, the last TRACE_RING bytes of
 * it: the -T trace file's writes, and its -V (verbose) lines, which it
 * prints with vfprintf to stderr (__vfprintf_chk), a message each way. They are written
 * out (to the trace file, else stderr) when xenstored dies of a signal
 * (SIGABRT: the failed assertion; SIGSEGV, SIGBUS), exits, or receives
 * SIGUSR2. dom0-init preloads it with lab_xstrace=ring.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define TRACE_RING (512 * 1024)
#define TRACE_NAME "xenstored-trace.log"

static char ring[TRACE_RING];
static size_t ring_head;
static int ring_wrapped;
static int trace_fd = -1;

static int is_trace_path(const char *path)
{
	size_t n = strlen(path), m = strlen(TRACE_NAME);

	return n >= m && strcmp(path + n - m, TRACE_NAME) == 0;
}

static int real_open(const char *path, int flags, mode_t mode)
{
	return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode);
}

static int remember(const char *path, int fd)
{
	if (fd >= 0 && is_trace_path(path))
		trace_fd = fd;
	return fd;
}

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;

	if (flags & O_CREAT) {
		va_start(ap, flags);
		mode = va_arg(ap, mode_t);
		va_end(ap);
	}
	return remember(path, real_open(path, flags, mode));
}

/* the same call under its large-file name */
int open64(const char *path, int flags, ...) __attribute__((alias("open")));

static void keep(const char *p, size_t left)
{
	while (left > 0) {
		size_t n = TRACE_RING - ring_head;

		if (n > left)
			n = left;
		memcpy(ring + ring_head, p, n);
		ring_head += n;
		p += n;
		left -= n;
		if (ring_head == TRACE_RING) {
			ring_head = 0;
			ring_wrapped = 1;
		}
	}
}

ssize_t write(int fd, const void *buf, size_t len)
{
	if (fd < 0 || fd != trace_fd)
		return syscall(SYS_write, fd, buf, len);
	keep(buf, len);
	return (ssize_t)len;
}

/*
 * xenstored's -V lines and barf messages: vfprintf(stderr, ...), which
 * Debian's build (_FORTIFY_SOURCE) calls as __vfprintf_chk
 */
int __vfprintf_chk(FILE *stream, int flag, const char *fmt, va_list ap)
{
	static int (*next)(FILE *, int, const char *, va_list);
	char line[1024];
	int n;

	if (stream != stderr) {
		if (!next)
			next = (int (*)(FILE *, int, const char *, va_list))
				dlsym(RTLD_NEXT, "__vfprintf_chk");
		return next ? next(stream, flag, fmt, ap) : -1;
	}
	n = vsnprintf(line, sizeof(line), fmt, ap);
	if (n > 0)
		keep(line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
	return n;
}

static void dump(void)
{
	static const char mark[] = "\n--- xs-tracebuf: the trace's last bytes follow ---\n";
	int fd = trace_fd >= 0 ? trace_fd : 2;

	syscall(SYS_write, fd, mark, sizeof(mark) - 1);
	if (ring_wrapped)
		syscall(SYS_write, fd, ring + ring_head, TRACE_RING - ring_head);
	syscall(SYS_write, fd, ring, ring_head);
}

static void on_fatal(int sig)
{
	dump();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void on_usr2(int sig)
{
	(void)sig;
	dump();
	ring_head = 0;
	ring_wrapped = 0;
}

__attribute__((destructor)) static void at_exit(void)
{
	dump();
}

__attribute__((constructor)) static void setup(void)
{
	signal(SIGABRT, on_fatal);
	signal(SIGSEGV, on_fatal);
	signal(SIGBUS, on_fatal);
	signal(SIGUSR2, on_usr2);
}
