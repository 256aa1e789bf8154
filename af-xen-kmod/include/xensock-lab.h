/* SPDX-License-Identifier: (GPL-2.0 OR MIT) */
/*
 * xensock-lab.h -- the af_xen module's test and benchmark knobs, for the
 * lab's programs (tests/lab/c, lab/tools). Not installed: programs use
 * xensock.h.
 */
#ifndef XENSOCK_LAB_H
#define XENSOCK_LAB_H

#include "xensock.h"

/*
 * The test modes exist only in the lab's build of the module (make LAB=1 or
 * TEST_HOOKS=1; elsewhere ENOPROTOOPT), and are refused with EPERM unless
 * it was loaded with hostile_test=1.
 *
 * XENSOCK_TEST_CORRUPT (int): makes this end behave as a hostile peer:
 * scribbles over the shared ring header of this one connection.
 */
#define XENSOCK_TEST_CORRUPT 0x7e57
#define XENSOCK_CORRUPT_PROD  1 /* producer index of the ring we write (the peer reads it) */
#define XENSOCK_CORRUPT_CONS  2 /* consumer index of the ring we read (the peer's producer checks it) */
#define XENSOCK_CORRUPT_FLAGS 3 /* undefined flag bits in the ring we write */
#define XENSOCK_CORRUPT_DIRECTORY 4 /* before connect: our ring's grant directory names a bogus grant */
#define XENSOCK_CORRUPT_FREEZE 5 /* the ring we write frozen, as by a peer about to be saved */

/*
 * XENSOCK_TEST_OPEN_LEG (int, connected stream sockets): opens this
 * connection's outbound TCP leg now: 1 with the right cookie, 2 with a
 * wrong one (the peer must refuse and count it).
 */
#define XENSOCK_TEST_OPEN_LEG 0x7e58

/*
 * XENSOCK_TEST_SILENT_CLOSE (int, 1): this socket's close sends no Close or
 * Reset, as a peer that never answers.
 */
#define XENSOCK_TEST_SILENT_CLOSE 0x7e60

/*
 * XENSOCK_COPY_ROUTINE (int, connected sockets): how this connection's
 * ring writes copy from user memory -- the same bytes either way; a
 * benchmark knob (lab/run bench). See docs/design.md, "Ring copies".
 */
#define XENSOCK_COPY_ROUTINE 0x7e61
#define XENSOCK_COPY_ITER    0 /* copy_from_iter (the default) */
#define XENSOCK_COPY_NOCACHE 1 /* copy_from_iter_nocache: non-temporal stores */

#endif
