// SPDX-License-Identifier: GPL-2.0
/*
 * af_xen.ko's test hooks, built only into the lab's module (make LAB=1 or
 * TEST_HOOKS=1: -DAFX_TEST_HOOKS, Rust's cfg afx_test_hooks): module
 * parameters that make this domain play a hostile peer once, so the lab can
 * check the other side's validation against a real kernel. A user's build
 * has neither these parameters nor the socket options they unlock.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include "af_xen_glue.h"

int afx_take_inject_bad_record(void);
int afx_take_inject_bad_dir(void);
int afx_take_inject_ring_offers(void);
int afx_hostile_test(void);

/*
 * Test hook: play a hostile peer once. Writing 1 makes the next SEQPACKET
 * message sent from this domain carry a record header whose length exceeds
 * the ring; the receiving domain must reset the connection. Used by the lab
 * (tests/lab/c/xstest_seqpacket.c) to check the receiver's validation
 * against a real kernel peer.
 */
static int inject_bad_record;
module_param(inject_bad_record, int, 0600);
MODULE_PARM_DESC(inject_bad_record, "test hook: 1 = corrupt the header of the next SOCK_SEQPACKET message sent (the peer must reset)");
int afx_take_inject_bad_record(void) { return xchg(&inject_bad_record, 0); }

/*
 * Test hook: writing 1 makes the grant directory of the next large receive
 * ring this domain offers name an invalid grant ref as its last data page,
 * so the peer's mapping fails part way and must undo the pages it mapped
 * (the lab checks both domains' counters come back and connect fails).
 */
static int inject_bad_dir;
module_param(inject_bad_dir, int, 0600);
MODULE_PARM_DESC(inject_bad_dir, "test hook: 1 = the next large ring's grant directory names an invalid grant (the peer's map must fail cleanly)");
int afx_take_inject_bad_dir(void) { return xchg(&inject_bad_dir, 0); }

/*
 * Test hook: writing N sends, over every link that is
 * up, a RingOffer naming each of our peers' connection ids 1..N, with grant
 * refs that name nothing: a guest posing as the moved peer of another
 * guest's connections. The receiver must keep such an offer until its
 * sender proves to be the peer (carrier/switch/offers.rs, on_candidate_offer).
 */
static int inject_ring_offers;
static int set_inject_ring_offers(const char *val, const struct kernel_param *kp)
{
	int r = param_set_int(val, kp);

	if (r == 0)
		afx_schedule();
	return r;
}
static const struct kernel_param_ops inject_ring_offers_ops = {
	.set = set_inject_ring_offers,
	.get = param_get_int,
};
module_param_cb(inject_ring_offers, &inject_ring_offers_ops, &inject_ring_offers, 0600);
MODULE_PARM_DESC(inject_ring_offers, "test hook: N = send forged RingOffers for connection ids 1..N over every link that is up (a guest posing as a moved peer)");
int afx_take_inject_ring_offers(void) { return xchg(&inject_ring_offers, 0); }

/*
 * Test mode for the lab's hostile-peer tests: with hostile_test=1 a socket
 * accepts setsockopt(fd, <family>, XENSOCK_TEST_CORRUPT, ...), which
 * scribbles over its connection's shared ring header. Off by default, and
 * read-only once loaded (an unprivileged program cannot switch it on).
 */
static bool hostile_test;
module_param(hostile_test, bool, 0444);
MODULE_PARM_DESC(hostile_test, "lab only: allow XENSOCK_TEST_CORRUPT (corrupt a connection's shared ring on purpose)");
int afx_hostile_test(void) { return hostile_test; }
