/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * xensock.h -- AF_XEN sockets for C programs.
 *
 * AF_XEN is not a mainline address family: the af_xen module registers it
 * under a number that no mainline kernel implements any more (default 19,
 * the old AF_ECONET, removed in Linux 3.5), chosen at load time with the
 * module parameter `family` and published in
 * /sys/module/af_xen/parameters/family. Always ask xensock_family().
 *
 * This header builds as C89 and later (with the glibc headers it
 * includes) and as C++.
 */
#ifndef XENSOCK_H
#define XENSOCK_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>
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
 * Socket types: SOCK_STREAM (a byte stream, as TCP) and SOCK_SEQPACKET
 * (records with boundaries, as AF_UNIX's); SOCK_NONBLOCK and SOCK_CLOEXEC
 * as usual. Any other type: ESOCKTNOSUPPORT; a protocol other than 0:
 * EPROTONOSUPPORT.
 *
 * Addresses: a struct sockaddr_xen of exactly sizeof(struct sockaddr_xen)
 * bytes (else EINVAL), sxen_family the AF_XEN number (else EAFNOSUPPORT),
 * sxen_flags and sxen_zero 0 (else EINVAL). bind: sxen_domid is
 * XEN_DOMID_ANY, XEN_DOMID_SELF or this guest's domid (another:
 * EADDRNOTAVAIL), sxen_port a port or XEN_PORT_ANY (ephemeral); a port in
 * use: EADDRINUSE (see XENSOCK_REUSEPORT). connect: ECONNREFUSED (nothing
 * listens on that port there), EHOSTUNREACH (no link to that domain: not
 * co-resident, or it does not run af_xen), ETIMEDOUT, EINPROGRESS (a
 * non-blocking connect; SO_ERROR tells its outcome), EALREADY, EISCONN,
 * ENETUNREACH (this guest is being saved or migrated, or af_xen is
 * unloading: try again once it is back).
 *
 * Data: read/write/send/recv and their msg forms, with MSG_DONTWAIT,
 * MSG_PEEK, MSG_WAITALL and MSG_NOSIGNAL; partial writes as TCP's. EPIPE
 * (and SIGPIPE unless MSG_NOSIGNAL) after shutdown(SHUT_WR) or once the
 * peer stopped reading; ECONNRESET when the peer reset, died, or broke the
 * ring protocol; ENOTCONN before connect; EAGAIN when non-blocking or on
 * a timeout; EFAULT for a bad buffer. SOCK_SEQPACKET: a message larger
 * than the ring: EMSGSIZE.
 *
 * Socket options (SOL_SOCKET): SO_RCVBUF before connect or listen (the
 * receive ring is half of it, from 2 KiB to 4 MiB; accepted sockets take
 * their listener's), SO_RCVTIMEO, SO_SNDTIMEO, SO_RCVLOWAT, SO_LINGER (a
 * zero timeout resets the connection at close), SO_ERROR, SO_TYPE, SO_ACCEPTCONN,
 * SO_DOMAIN, SO_BUSY_POLL. ioctl: FIONREAD/SIOCINQ (bytes readable; for
 * SOCK_SEQPACKET the next message's length), SIOCOUTQ (bytes not yet
 * delivered), and the XENSOCK_IOC_* below.
 *
 * AF_XEN's own options use the family number as the level (as vsock uses
 * AF_VSOCK): setsockopt(fd, xensock_family(), XENSOCK_..., ...). An
 * unknown one: ENOPROTOOPT.
 */

/*
 * XENSOCK_REUSEPORT (int, before bind: EINVAL after): SO_REUSEPORT for
 * AF_XEN, which Linux keeps to inet sockets. Sockets of one user that all
 * set it may bind one port; its connections go to the listening ones in
 * turn, and when the port's first socket closes the next takes its place.
 */
#define XENSOCK_REUSEPORT 0x7e62

/*
 * XENSOCK_IOC_LOCAL_DOMID: this guest's domid, on any AF_XEN socket (as
 * vsock's IOCTL_VM_SOCKETS_GET_LOCAL_CID): uint32_t d;
 * ioctl(fd, XENSOCK_IOC_LOCAL_DOMID, &d). It changes when the guest is
 * restored or migrated. EFAULT: a bad pointer.
 */
#define XENSOCK_IOC_LOCAL_DOMID _IOR('X', 0x12, uint32_t)

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
 * whether the module has it. Make it while no other thread is inside a
 * call on g.fd or x (as the preload library does, within the program's
 * connect): such a call may fail (EINVAL) or, on g.fd, act on the TCP
 * sock that has just moved to x.
 */
struct xensock_graft {
	int32_t fd;
	uint32_t addrlen;       /* of addr: 16 (AF_INET) or 28 (AF_INET6) */
	uint8_t addr[28];
};
#define XENSOCK_IOC_GRAFT _IOW('X', 0x11, struct xensock_graft)

#ifdef __cplusplus
#define XENSOCK_INLINE inline
#else
#define XENSOCK_INLINE __inline__
#endif

/* The family number the loaded module published, or -1. */
static XENSOCK_INLINE int xensock_family_published(void)
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

/*
 * The AF_XEN family number, or -1 with errno EAFNOSUPPORT if the module is
 * not loaded and cannot be. Not loaded but installed, it is loaded here by
 * its alias (net-pf-19), as the kernel does for a socket of a family nobody
 * registered: a socket of XENSOCK_FAMILY_DEFAULT (loaded with another
 * family from modprobe's options, the module is still loaded by it, and
 * sysfs says which).
 */
static XENSOCK_INLINE int xensock_family(void)
{
	int fam = xensock_family_published();
	int fd;

	if (fam >= 0)
		return fam;
	fd = socket(XENSOCK_FAMILY_DEFAULT, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd >= 0)
		close(fd);
	fam = xensock_family_published();
	if (fam < 0)
		errno = EAFNOSUPPORT;
	return fam;
}

#endif
