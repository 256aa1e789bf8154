/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * xensock.h -- AF_XEN sockets for C programs.
 *
 * AF_XEN is not a mainline address family: the af_xen module registers it
 * under a number that no mainline kernel implements any more (default 19,
 * the old AF_ECONET, removed in Linux 3.5), chosen at load time with the
 * module parameter `family` and published in
 * /sys/module/af_xen/parameters/family. Always ask xensock_family().
 */
#ifndef XENSOCK_H
#define XENSOCK_H

#include <stdint.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#define XENSOCK_FAMILY_DEFAULT 19
#define XENSOCK_FAMILY_SYSFS "/sys/module/af_xen/parameters/family"

#define XEN_DOMID_SELF 0x7FF0u  /* DOMID_SELF: this domain */
#define XEN_DOMID_ANY  0xFFFFFFFFu /* bind: any peer */
#define XEN_PORT_ANY   0xFFFFFFFFu /* bind: pick an ephemeral port */

struct sockaddr_xen {
	sa_family_t sxen_family;  /* xensock_family() */
	uint16_t sxen_flags;      /* 0 */
	uint32_t sxen_port;
	uint32_t sxen_domid;
	uint8_t sxen_zero[4];     /* 0 */
};

/*
 * setsockopt() level for AF_XEN options: the family number itself (as
 * vsock uses AF_VSOCK), i.e. setsockopt(fd, xensock_family(), ...).
 *
 * XENSOCK_TEST_CORRUPT (int): lab test mode, refused with EPERM unless the
 * module was loaded with hostile_test=1. Makes this end behave as a hostile
 * peer: scribbles over the shared ring header of this one connection.
 */
#define XENSOCK_TEST_CORRUPT 0x7e57
#define XENSOCK_CORRUPT_PROD  1 /* producer index of the ring we write (the peer reads it) */
#define XENSOCK_CORRUPT_CONS  2 /* consumer index of the ring we read (the peer's producer checks it) */
#define XENSOCK_CORRUPT_FLAGS 3 /* undefined flag bits in the ring we write */
#define XENSOCK_CORRUPT_DIRECTORY 4 /* before connect: our ring's grant directory names a bogus grant */

/*
 * XENSOCK_COPY_ROUTINE (int, connected sockets): how this connection's
 * ring writes copy from user memory -- the same bytes either way; a
 * benchmark knob (lab/run bench). See docs/design.md, "Ring copies".
 */
#define XENSOCK_COPY_ROUTINE 0x7e61

/*
 * XENSOCK_REUSEPORT (int, before bind): SO_REUSEPORT for AF_XEN, which
 * Linux keeps to inet sockets. Sockets of one user that all set it may
 * bind one port; its connections go to the listening ones in turn, and
 * when the port's first socket closes the next takes its place.
 */
#define XENSOCK_REUSEPORT 0x7e62
#define XENSOCK_COPY_ITER    0 /* copy_from_iter (the default) */
#define XENSOCK_COPY_NOCACHE 1 /* copy_from_iter_nocache: non-temporal stores */

/*
 * XENSOCK_IOC_RESOLVE: which co-resident guest has an IP address, from the
 * co-residency table dom0's agent keeps for this guest (unprivileged:
 * any AF_XEN socket, ioctl(fd, XENSOCK_IOC_RESOLVE, &r)). Fill family
 * (AF_INET or AF_INET6) and addr (an IPv4 address in its first 4 bytes);
 * on success domid is the guest's. EHOSTUNREACH: no co-resident guest
 * has it; EINVAL: another family.
 */
struct xensock_resolve {
	uint16_t family;
	uint16_t zero;          /* 0 */
	uint32_t domid;         /* out */
	uint8_t addr[16];
};
#define XENSOCK_IOC_RESOLVE _IOWR('X', 0x10, struct xensock_resolve)

/*
 * XENSOCK_IOC_GRAFT: a TCP program's connection rides AF_XEN (what the
 * preload library does for it). On a connected AF_XEN stream socket x,
 * ioctl(x, XENSOCK_IOC_GRAFT, &g) with g.fd an unconnected TCP socket of
 * the calling process (never connected or listening) and g.addr the
 * sockaddr_in or sockaddr_in6 it was to connect to: x's connection moves
 * into g.fd, which from then on is that AF_XEN connection (same
 * descriptor, same file: epoll registrations, dups and forked copies
 * follow), answers getsockname/getpeername with AF_INET/AF_INET6 names and
 * accepts the TCP and IP options programs set. x is left holding the
 * unused TCP sock: close it. Errors, with nothing changed: ENOTCONN (x is
 * not a connected stream), EINVAL (addr, or g.fd is x or listening),
 * EPROTONOSUPPORT (g.fd is not a TCP stream socket), EAFNOSUPPORT (its
 * family is not addr's), EISCONN/EALREADY (g.fd is connected/connecting),
 * EBADF/ENOTSOCK (g.fd). /sys/module/af_xen/parameters/tcp_redirect says
 * whether the module has it.
 */
struct xensock_graft {
	int32_t fd;
	uint32_t addrlen;       /* of addr: 16 (AF_INET) or 28 (AF_INET6) */
	uint8_t addr[28];
};
#define XENSOCK_IOC_GRAFT _IOW('X', 0x11, struct xensock_graft)

/* The AF_XEN family number, or -1 if the module is not loaded (errno set). */
static inline int xensock_family(void)
{
	FILE *f = fopen(XENSOCK_FAMILY_SYSFS, "r");
	int fam = -1;

	if (!f)
		return -1;
	if (fscanf(f, "%d", &fam) != 1)
		fam = -1;
	fclose(f);
	return fam;
}

#endif
