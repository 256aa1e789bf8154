// SPDX-License-Identifier: GPL-2.0
/*
 * af_xen.ko C glue: only what Rust cannot reach through bindgen -- module
 * parameter and alias macros, static inlines, and fields of struct sock
 * (opaque in kernel::bindings). No socket logic lives here.
 */
#include <linux/delay.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/net.h>
#include <linux/sched/signal.h>
#include <linux/sched/clock.h>
#include <net/sock.h>
#include <linux/vmalloc.h>
#include <xen/xen.h>
#include <xen/page.h>
#include "af_xen_glue.h"

/*
 * The family number. Out-of-tree modules cannot get a number of their own
 * (sock_register() refuses >= AF_MAX), so AF_XEN reuses one that no mainline
 * kernel has implemented for a decade: 19, AF_ECONET (removed in 3.5).
 * See af-xen-kmod/README.md.
 */
#define AFX_FAMILY_DEFAULT 19
static int family = AFX_FAMILY_DEFAULT;
module_param(family, int, 0444);
MODULE_PARM_DESC(family, "address family number to register AF_XEN under (default 19, the retired AF_ECONET)");
/* socket(19, ...) loads us (request_module("net-pf-19")) */
MODULE_ALIAS("net-pf-19");

int afx_family(void) { return family; }

/*
 * Receive ring size of a connection whose socket did not set SO_RCVBUF
 * (with SO_RCVBUF, the ring is the size asked for, rounded up to a power of
 * two, 2 KiB..4 MiB). 128 KiB: two 64 KiB writes in flight at once, 34
 * grants per direction. See af-xen-kmod/README.md, "Ring sizes".
 */
static unsigned int default_ring_kib = 128;
module_param(default_ring_kib, uint, 0644);
MODULE_PARM_DESC(default_ring_kib, "receive ring size in KiB for sockets without SO_RCVBUF (rounded up to a power of two, 2..4096; default 128)");
unsigned int afx_default_ring_kib(void) { return READ_ONCE(default_ring_kib); }

/*
 * The default under little grant pressure (docs/design.md, "A larger
 * default ring while grants are plentiful"): an inter-domain stream socket
 * without SO_RCVBUF gets a large_ring_kib receive ring while the grants
 * this module has handed out, that ring's included, stay within
 * large_ring_grants; past that, default_ring_kib, as before. As tcp_mem
 * lets TCP grow its buffers until memory gets tight. large_ring_grants 0
 * (or large_ring_kib <= default_ring_kib) turns it off.
 */
static unsigned int large_ring_kib = 1024;
module_param(large_ring_kib, uint, 0644);
MODULE_PARM_DESC(large_ring_kib, "receive ring size in KiB for stream sockets without SO_RCVBUF while grant use is low (see large_ring_grants; default 1024)");
unsigned int afx_large_ring_kib(void) { return READ_ONCE(large_ring_kib); }
static unsigned int large_ring_grants = 4096;
module_param(large_ring_grants, uint, 0644);
MODULE_PARM_DESC(large_ring_grants, "large_ring_kib rings only while this module's granted pages, the new ring's included, stay within this many (default 4096, an eighth of a 32768-entry grant table; 0: never)");
unsigned int afx_large_ring_grants(void) { return READ_ONCE(large_ring_grants); }

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
 * Test hook (lab kmod-impostor): writing N sends, over every link that is
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
 * Time the stream data path (/proc/net/af_xen_stats send_ns ... irq_ns):
 * off by default, as each timed part reads the clock twice, and under the
 * lab's emulation a clock read is not free (docs/design.md, "Counters of
 * the data path"). The bench turns it on for its timed rows.
 */
static bool time_data_path;
module_param(time_data_path, bool, 0644);
MODULE_PARM_DESC(time_data_path, "sum the time of sendmsg/recvmsg, ring steps, copies, waits, kicks and the interrupt handler in /proc/net/af_xen_stats (default off)");
int afx_time_data_path(void) { return READ_ONCE(time_data_path); }

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

struct afx_sock {
	struct sock sk;		/* must be first */
	void *priv;		/* Rust: Arc<XenSock> */
};

static struct proto afx_proto = {
	.name = "AF_XEN",
	.owner = THIS_MODULE,
	.obj_size = sizeof(struct afx_sock),
};

int afx_proto_register(void) { return proto_register(&afx_proto, 0); }
void afx_proto_unregister(void) { proto_unregister(&afx_proto); }

struct sock *afx_sk_alloc(struct net *net, struct socket *sock, int kern, void *priv)
{
	struct sock *sk = sk_alloc(net, family, GFP_KERNEL, &afx_proto, kern);

	if (!sk)
		return NULL;
	sock_init_data(sock, sk);	/* sock may be NULL (accepted child) */
	((struct afx_sock *)sk)->priv = priv;
	return sk;
}

void *afx_sk_priv(struct sock *sk) { return ((struct afx_sock *)sk)->priv; }
/*
 * Whether a sock is one of ours. A callback can be reached with another's:
 * accept(2) asks the listener's ops for the name of the socket it just
 * accepted (do_accept: ops->getname(newsock)), and a dual listener's
 * accept may have made that socket a TCP connection (afx_listener_accept).
 */
int afx_sk_is_ours(struct sock *sk) { return sk->sk_prot == &afx_proto; }
/* getname of a socket whose sock is not ours, by the ops it has now */
int afx_foreign_getname(struct socket *sock, struct sockaddr *addr, int peer)
{
	return READ_ONCE(sock->ops)->getname(sock, addr, peer);
}
void afx_sk_set_priv(struct sock *sk, void *priv) { ((struct afx_sock *)sk)->priv = priv; }

void afx_sk_release(struct socket *sock)
{
	struct sock *sk = sock->sk;

	if (!sk)
		return;
	sock_orphan(sk);
	sock->sk = NULL;
	sock_put(sk);
}

/* accept(): attach a child sock to the socket the kernel made for it */
void afx_sk_graft(struct sock *sk, struct socket *sock)
{
	sock_graft(sk, sock);
	sock->state = SS_CONNECTED;
}

long afx_rcvtimeo(struct sock *sk, int nonblock) { return sock_rcvtimeo(sk, nonblock); }
long afx_sndtimeo(struct sock *sk, int nonblock) { return sock_sndtimeo(sk, nonblock); }
int afx_rcvbuf(struct sock *sk) { return READ_ONCE(sk->sk_rcvbuf); }
int afx_rcvbuf_locked(struct sock *sk) { return !!(READ_ONCE(sk->sk_userlocks) & SOCK_RCVBUF_LOCK); }
void afx_set_err(struct sock *sk, int err) { WRITE_ONCE(sk->sk_err, err); sk_error_report(sk); }
int afx_sock_error(struct sock *sk) { return sock_error(sk); }
/* pending error without consuming it (poll) */
int afx_sk_err_pending(struct sock *sk) { return READ_ONCE(sk->sk_err); }
/* SO_LINGER set with l_linger == 0: close() aborts (reset, unsent data dropped) */
int afx_linger_abort(struct sock *sk) { return sock_flag(sk, SOCK_LINGER) && !READ_ONCE(sk->sk_lingertime); }
int afx_rcvlowat(struct sock *sk) { return READ_ONCE(sk->sk_rcvlowat); }
/* the socket's owner (its inode's uid, sk_uid) */
unsigned int afx_sk_uid(struct sock *sk) { return from_kuid_munged(&init_user_ns, sk->sk_uid); }
/* SO_ACCEPTCONN reads sk_state == TCP_LISTEN, for every family (vsock and
 * AF_UNIX set it too): a listening AF_XEN socket must say so. */
void afx_set_listening(struct sock *sk, int on) { WRITE_ONCE(sk->sk_state, on ? TCP_LISTEN : TCP_CLOSE); }
/* an int option value from setsockopt */
int afx_sockopt_int(sockptr_t optval, unsigned int optlen, int *out)
{
	if (optlen < sizeof(int))
		return -EINVAL;
	if (copy_from_sockptr(out, optval, sizeof(int)))
		return -EFAULT;
	return 0;
}

/*
 * Sleep on the socket's wait queue until cond(arg) != 0, the timeout runs
 * out (-EAGAIN, or 0 if it did run) or a signal comes (-ERESTARTSYS/-EINTR).
 * cond is Rust; it must not sleep. The usual wait_woken() loop: a wakeup
 * between the check and the sleep is not lost.
 */
int afx_wait(struct sock *sk, long *timeo, int (*cond)(void *), void *arg)
{
	DEFINE_WAIT_FUNC(wait, woken_wake_function);
	int err = 0;

	add_wait_queue(sk_sleep(sk), &wait);
	while (!cond(arg)) {
		if (!*timeo) {
			err = -EAGAIN;
			break;
		}
		if (signal_pending(current)) {
			err = sock_intr_errno(*timeo);
			break;
		}
		*timeo = wait_woken(&wait, TASK_INTERRUPTIBLE, *timeo);
	}
	remove_wait_queue(sk_sleep(sk), &wait);
	return err;
}

/*
 * Busy-poll before sleeping (SO_BUSY_POLL / net.core.busy_read, as for
 * TCP's blocking receive): spin until cond(arg) for at most sk_ll_usec
 * microseconds; never when 0 (the default), and never past a pending
 * reschedule or signal (PREEMPT_NONE kernels too). 1 if cond came true.
 */
int afx_busy_wait(struct sock *sk, int (*cond)(void *), void *arg)
{
	unsigned int us = READ_ONCE(sk->sk_ll_usec);
	u64 end;

	if (!us)
		return 0;
	end = local_clock() + (u64)us * NSEC_PER_USEC;
	do {
		if (cond(arg))
			return 1;
		if (need_resched() || signal_pending(current))
			return 0;
		cpu_relax();
	} while (local_clock() < end);
	return cond(arg) ? 1 : 0;
}

void afx_wake(struct sock *sk, unsigned int mask)
{
	struct socket_wq *wq;

	rcu_read_lock();
	wq = rcu_dereference(sk->sk_wq);
	if (skwq_has_sleeper(wq))
		wake_up_interruptible_poll(&wq->wait, mask);
	rcu_read_unlock();
}

void afx_poll_wait(struct file *file, struct socket *sock, struct poll_table_struct *wait)
{
	sock_poll_wait(file, sock, wait);
}

void afx_sigpipe(void) { send_sig(SIGPIPE, current, 0); }
unsigned long afx_virt_to_gfn(void *v) { return virt_to_gfn(v); }
int afx_xen_domain(void) { return xen_domain(); }
size_t afx_msg_left(struct msghdr *msg) { return msg_data_left(msg); }

int afx_accept_flags(struct proto_accept_arg *arg) { return arg->flags; }
int afx_accept_kern(struct proto_accept_arg *arg) { return arg->kern; }
void afx_sk_put(struct sock *sk) { sock_put(sk); }

/* an accepted connection's sock: same netns and buffer sizes as the listener */
struct sock *afx_sk_alloc_child(struct sock *parent, void *priv)
{
	struct sock *sk = sk_alloc(sock_net(parent), family, GFP_KERNEL, &afx_proto, 0);

	if (!sk)
		return NULL;
	sock_init_data(NULL, sk);
	sk->sk_type = parent->sk_type;	/* SO_TYPE on the accepted socket */
	sk->sk_rcvbuf = READ_ONCE(parent->sk_rcvbuf);
	sk->sk_sndbuf = READ_ONCE(parent->sk_sndbuf);
	sk->sk_userlocks = READ_ONCE(parent->sk_userlocks) & (SOCK_RCVBUF_LOCK | SOCK_SNDBUF_LOCK);
	sk->sk_rcvtimeo = parent->sk_rcvtimeo;
	sk->sk_sndtimeo = parent->sk_sndtimeo;
	((struct afx_sock *)sk)->priv = priv;
	return sk;
}

void afx_msleep(unsigned int ms) { msleep(ms); }
void *afx_vzalloc(size_t size) { return vzalloc(size); }
void afx_vfree(void *p) { vfree(p); }

/* /proc/net/af_xen (initial netns): one line per socket, written by Rust */
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <net/net_namespace.h>
int afx_rs_proc_show(struct seq_file *m);	/* Rust (socket/mod.rs) */
int afx_rs_stats_show(struct seq_file *m);	/* Rust (sys.rs) */
int afx_rs_tcp_show(struct seq_file *m);	/* Rust (socket/mod.rs, carrier/switch/proc.rs) */
static int afx_proc_show(struct seq_file *m, void *v) { return afx_rs_proc_show(m); }
static int afx_stats_show(struct seq_file *m, void *v) { return afx_rs_stats_show(m); }
static int afx_tcp_show(struct seq_file *m, void *v) { return afx_rs_tcp_show(m); }
/* /proc/net/af_xen_stats: the module's resource counters (leak checks) */
int afx_proc_init(void)
{
	if (!proc_create_single("af_xen", 0444, init_net.proc_net, afx_proc_show))
		return -ENOMEM;
	if (!proc_create_single("af_xen_stats", 0444, init_net.proc_net, afx_stats_show)) {
		remove_proc_entry("af_xen", init_net.proc_net);
		return -ENOMEM;
	}
	/* /proc/net/af_xen_tcp: each connection's carrier switch and legs */
	if (!proc_create_single("af_xen_tcp", 0400, init_net.proc_net, afx_tcp_show)) {
		remove_proc_entry("af_xen_stats", init_net.proc_net);
		remove_proc_entry("af_xen", init_net.proc_net);
		return -ENOMEM;
	}
	return 0;
}
void afx_proc_exit(void)
{
	remove_proc_entry("af_xen_tcp", init_net.proc_net);
	remove_proc_entry("af_xen_stats", init_net.proc_net);
	remove_proc_entry("af_xen", init_net.proc_net);
}
void afx_seq_write(struct seq_file *m, const void *p, size_t n) { seq_write(m, p, n); }

/*
 * Inter-domain plumbing: event channels, grants, mappings, XenStore and one
 * module-wide work item. Interrupts and watch callbacks only schedule the
 * work; the work (Rust, afx_rs_work) drains control rings and wakes sockets.
 */
#include <linux/workqueue.h>
#include <linux/interrupt.h>
#include <linux/slab.h>
#include <xen/grant_table.h>
#include <xen/events.h>
#include <xen/xenbus.h>
#include <xen/interface/event_channel.h>
#include <asm/xen/hypercall.h>
#include <asm/xen/page.h>
#include <asm/pgtable_types.h>
#include <xen/page.h>

/* the largest ring: 4 MiB of data pages (proto's MAX_RING_ORDER 22) */
#define AFX_MAX_RING_PAGES 1024

void afx_rs_work(void);	/* Rust (sys/entry.rs: link/table.rs work) */
static void afx_work_fn(struct work_struct *w) { afx_rs_work(); }
static DECLARE_WORK(afx_work, afx_work_fn);
void afx_schedule(void) { schedule_work(&afx_work); }
void afx_cancel_work(void) { cancel_work_sync(&afx_work); }
/*
 * Receive rings lent after close (link/lent.rs): a delayed work ends
 * those whose peer never said it is done with them (Rust: afx_rs_reap).
 */
void afx_rs_reap(void);
static void afx_reap_fn(struct work_struct *w) { afx_rs_reap(); }
static DECLARE_DELAYED_WORK(afx_reap, afx_reap_fn);
/* queues the reap in `ms`, or moves a queued one earlier (never later) */
void afx_schedule_reap(unsigned int ms)
{
	unsigned long delay = msecs_to_jiffies(ms);

	if (!delayed_work_pending(&afx_reap) || time_before(jiffies + delay, READ_ONCE(afx_reap.timer.expires)))
		mod_delayed_work(system_wq, &afx_reap, delay);
}
void afx_cancel_reap(void) { cancel_delayed_work_sync(&afx_reap); }

int afx_evtchn_alloc_unbound(unsigned int remote, unsigned int *port)
{
	struct evtchn_alloc_unbound a = { .dom = DOMID_SELF, .remote_dom = remote };
	int err = HYPERVISOR_event_channel_op(EVTCHNOP_alloc_unbound, &a);

	if (!err)
		*port = a.port;
	return err;
}

int afx_evtchn_bind_interdomain(unsigned int remote, unsigned int rport, unsigned int *lport)
{
	struct evtchn_bind_interdomain b = { .remote_dom = remote, .remote_port = rport };
	int err = HYPERVISOR_event_channel_op(EVTCHNOP_bind_interdomain, &b);

	if (!err)
		*lport = b.local_port;
	return err;
}

void afx_evtchn_close(unsigned int port)
{
	struct evtchn_close c = { .port = port };

	HYPERVISOR_event_channel_op(EVTCHNOP_close, &c);
}

/* irq >= 0 or -errno; unbind_from_irqhandler also closes the port */
/*
 * The event-channel interrupt: handler and cookie come from Rust
 * (sys/mod.rs, Evtchn); the cookie stays alive while the irq is bound.
 */
int afx_bind_irq(unsigned int port, irq_handler_t handler, void *cookie)
{
	return bind_evtchn_to_irqhandler(port, handler, 0, "af_xen", cookie);
}
void afx_unbind_irq(int irq, void *cookie) { unbind_from_irqhandler(irq, cookie); }
/* an irq-safe spinlock for Rust (kernel::sync has none in 6.12): see sys.rs IrqSaveBackend */
unsigned long afx_spin_lock_irqsave(spinlock_t *l) { unsigned long f; spin_lock_irqsave(l, f); return f; }
void afx_spin_unlock_irqrestore(spinlock_t *l, unsigned long f) { spin_unlock_irqrestore(l, f); }
void afx_sock_hold(struct sock *sk) { sock_hold(sk); }
void afx_notify(unsigned int port) { notify_remote_via_evtchn(port); }

/* one zeroed page granted read-write to domid */
void *afx_grant_page(unsigned int domid, unsigned int *ref)
{
	void *p = (void *)get_zeroed_page(GFP_KERNEL);
	int r;

	if (!p)
		return NULL;
	r = gnttab_grant_foreign_access(domid, virt_to_gfn(p), 0);
	if (r < 0) {
		free_page((unsigned long)p);
		return NULL;
	}
	*ref = r;
	return p;
}

/*
 * Grants whose peer still maps the page when we end them. Linux's
 * gnttab_end_foreign_access() would put them on its own deferred list,
 * which retries free_per_iteration (10) entries a second: a connection's
 * 1 MiB ring is 258 entries, so a client that closed before its server
 * (which unmaps the ring only when it closes too) got its memory back
 * minutes later, and a few hundred such connections filled the grant
 * table (ENOMEM on every later connect). We keep them here instead and try
 * every one of them again each AFX_PENDING_MS, and at once when the peer
 * says it is done (afx_pending_kick), until the peer unmaps them (its own
 * close, or Xen when it dies).
 */
#define AFX_PENDING_MS 200
struct afx_pending {
	struct list_head list;
	grant_ref_t ref;
	struct page *page;
};
static LIST_HEAD(afx_pending_list);
static DEFINE_SPINLOCK(afx_pending_lock);
/* entries on the list now, and ever put on it (/proc/net/af_xen_stats) */
static atomic_long_t afx_pending_now = ATOMIC_LONG_INIT(0);
static atomic_long_t afx_pending_total = ATOMIC_LONG_INIT(0);
static void afx_pending_fn(struct work_struct *w);
static DECLARE_DELAYED_WORK(afx_pending_work, afx_pending_fn);
static bool afx_pending_stopping;

long afx_grants_pending(void) { return atomic_long_read(&afx_pending_now); }
long afx_grants_pended(void) { return atomic_long_read(&afx_pending_total); }

/* ends one grant and frees its page, or keeps both until the peer unmaps */
static void afx_end_one(grant_ref_t ref, struct page *page)
{
	struct afx_pending *e;
	gfp_t gfp = (in_atomic() || irqs_disabled()) ? GFP_ATOMIC : GFP_KERNEL;
	unsigned long f;

	if (gnttab_try_end_foreign_access(ref)) {
		put_page(page);
		return;
	}
	e = kmalloc(sizeof(*e), gfp);
	if (!e) {
		/* Linux's deferred list, slow but safe */
		gnttab_end_foreign_access(ref, page);
		return;
	}
	e->ref = ref;
	e->page = page;
	spin_lock_irqsave(&afx_pending_lock, f);
	list_add_tail(&e->list, &afx_pending_list);
	/* queue_ (not mod_): a stream of new entries must not keep the pass away */
	if (!afx_pending_stopping)
		queue_delayed_work(system_wq, &afx_pending_work, msecs_to_jiffies(AFX_PENDING_MS));
	spin_unlock_irqrestore(&afx_pending_lock, f);
	atomic_long_inc(&afx_pending_now);
	atomic_long_inc(&afx_pending_total);
}

/* one pass over the pending grants; true if some are left */
static bool afx_pending_pass(void)
{
	struct afx_pending *e, *n;
	LIST_HEAD(todo);
	unsigned long f;
	bool left;

	spin_lock_irqsave(&afx_pending_lock, f);
	list_splice_init(&afx_pending_list, &todo);
	spin_unlock_irqrestore(&afx_pending_lock, f);
	list_for_each_entry_safe(e, n, &todo, list) {
		if (!gnttab_try_end_foreign_access(e->ref))
			continue;
		list_del(&e->list);
		put_page(e->page);
		kfree(e);
		atomic_long_dec(&afx_pending_now);
	}
	spin_lock_irqsave(&afx_pending_lock, f);
	list_splice(&todo, &afx_pending_list);
	left = !list_empty(&afx_pending_list);
	spin_unlock_irqrestore(&afx_pending_lock, f);
	return left;
}

static void afx_pending_fn(struct work_struct *w)
{
	unsigned long f;

	if (!afx_pending_pass())
		return;
	spin_lock_irqsave(&afx_pending_lock, f);
	if (!afx_pending_stopping)
		queue_delayed_work(system_wq, &afx_pending_work, msecs_to_jiffies(AFX_PENDING_MS));
	spin_unlock_irqrestore(&afx_pending_lock, f);
}

/* the peer said it is done with a connection or went away: try now */
void afx_pending_kick(void)
{
	unsigned long f;

	spin_lock_irqsave(&afx_pending_lock, f);
	if (!afx_pending_stopping && !list_empty(&afx_pending_list))
		mod_delayed_work(system_wq, &afx_pending_work, 0);
	spin_unlock_irqrestore(&afx_pending_lock, f);
}

/*
 * Module exit: what a peer still maps goes to Linux's deferred list, which
 * outlives the module (it holds the page, and no code of ours).
 */
void afx_pending_exit(void)
{
	struct afx_pending *e, *n;
	unsigned long f;

	spin_lock_irqsave(&afx_pending_lock, f);
	afx_pending_stopping = true;
	spin_unlock_irqrestore(&afx_pending_lock, f);
	cancel_delayed_work_sync(&afx_pending_work);
	afx_pending_pass();
	list_for_each_entry_safe(e, n, &afx_pending_list, list) {
		list_del(&e->list);
		gnttab_end_foreign_access(e->ref, e->page);
		kfree(e);
		atomic_long_dec(&afx_pending_now);
	}
}

/* revoke and free (kept pending while the peer maps it) */
void afx_end_grant(unsigned int ref, void *p)
{
	afx_end_one(ref, virt_to_page(p));
}

struct afx_map {
	struct page *page;
	grant_handle_t handle;
	void *addr;
};

/*
 * Maps of a peer's grant that Xen refused (/proc/net/af_xen_stats
 * map_failures). A peer that offers grants and goes away before they are
 * mapped (clients that vanish mid-connect) makes every one fail: counted
 * here, logged at most a few times a second, so a peer cannot flood the log.
 */
static atomic_long_t afx_map_failed = ATOMIC_LONG_INIT(0);
long afx_map_failures(void) { return atomic_long_read(&afx_map_failed); }

void *afx_map_page(unsigned int domid, unsigned int ref, void **cookie)
{
	struct afx_map *m = kzalloc(sizeof(*m), GFP_KERNEL);
	struct gnttab_map_grant_ref op;

	if (!m)
		return NULL;
	if (gnttab_alloc_pages(1, &m->page)) {
		kfree(m);
		return NULL;
	}
	m->addr = pfn_to_kaddr(page_to_pfn(m->page));
	gnttab_set_map_op(&op, (unsigned long)m->addr, GNTMAP_host_map, ref, domid);
	if (gnttab_map_refs(&op, NULL, &m->page, 1) || op.status != GNTST_okay) {
		atomic_long_inc(&afx_map_failed);
		pr_warn_ratelimited("af_xen: map of grant %u from dom%u failed (status %d)\n",
				    ref, domid, op.status);
		gnttab_free_pages(1, &m->page);
		kfree(m);
		return NULL;
	}
	m->handle = op.handle;
	*cookie = m;
	return m->addr;
}

void afx_unmap_page(void *cookie)
{
	struct afx_map *m = cookie;
	struct gnttab_unmap_grant_ref u;

	gnttab_set_unmap_op(&u, (unsigned long)m->addr, GNTMAP_host_map, m->handle);
	if (gnttab_unmap_refs(&u, NULL, &m->page, 1) || u.status != GNTST_okay)
		pr_warn("af_xen: unmap failed (status %d)\n", u.status);
	gnttab_free_pages(1, &m->page);
	kfree(m);
}

/*
 * Our nodes in a link directory, in one transaction (EAGAIN: retry).
 * The link directory is dom0's (the agent's): it makes it with the
 * permissions that let the peer read it, and our nodes inherit them. A
 * write after dom0 removed it would create it again with the link root's
 * owner-only permissions, which the peer cannot read, and dom0's making
 * it again would not change our nodes' (a directory listing taken before the removal, then readvertise; the
 * peer stayed at state 3). So every write checks, in its transaction, that
 * the directory is there; -ENOENT if not.
 */
static int afx_xs_write_link(const char *dir, bool whole, unsigned int ref, unsigned int port, int state)
{
	struct xenbus_transaction t;
	int err;
again:
	err = xenbus_transaction_start(&t);
	if (err)
		return err;
	err = xenbus_exists(t, dir, "") ? 0 : -ENOENT;
	if (!err && whole)
		err = xenbus_printf(t, dir, "version", "%u", 1);
	if (!err && whole)
		err = xenbus_printf(t, dir, "ring-ref", "%u", ref);
	if (!err && whole)
		err = xenbus_printf(t, dir, "event-channel", "%u", port);
	if (!err)
		err = xenbus_printf(t, dir, "state", "%d", state);
	if (err) {
		xenbus_transaction_end(t, 1);
		return err;
	}
	err = xenbus_transaction_end(t, 0);
	if (err == -EAGAIN)
		goto again;
	return err;
}

/* our whole advertisement (version, ring-ref, event-channel, state) */
int afx_xs_advertise(const char *dir, unsigned int ref, unsigned int port, int state)
{
	return afx_xs_write_link(dir, true, ref, port, state);
}

int afx_xs_write_state(const char *dir, int state)
{
	return afx_xs_write_link(dir, false, 0, 0, state);
}

/* unload: state 6, advertisement gone (the directory is dom0's: it stays) */
void afx_xs_retract(const char *dir)
{
	/* a directory dom0 removed is not made again (see afx_xs_advertise) */
	if (!xenbus_exists(XBT_NIL, dir, ""))
		return;
	xenbus_rm(XBT_NIL, dir, "ring-ref");
	xenbus_rm(XBT_NIL, dir, "event-channel");
	xenbus_printf(XBT_NIL, dir, "state", "%d", 6);
}

int afx_xs_read_uint(const char *dir, const char *node, unsigned int *out)
{
	int n = xenbus_scanf(XBT_NIL, dir, node, "%u", out);

	return n == 1 ? 0 : (n < 0 ? n : -EINVAL);
}

/* numeric entries of dir into out[0..max); count or -errno */
int afx_xs_dir_ids(const char *dir, unsigned int *out, int max)
{
	unsigned int n, i;
	int k = 0;
	char **names = xenbus_directory(XBT_NIL, dir, "", &n);

	if (IS_ERR(names))
		return PTR_ERR(names);
	for (i = 0; i < n && k < max; i++) {
		unsigned int v;

		if (kstrtouint(names[i], 10, &v) == 0)
			out[k++] = v;
	}
	kfree(names);
	return k;
}

struct afx_watch {
	struct xenbus_watch w;
};

/* set by watches: the work re-reads XenStore only then (never per interrupt) */
static atomic_t afx_xs_dirty = ATOMIC_INIT(1);
int afx_take_xs_dirty(void) { return atomic_xchg(&afx_xs_dirty, 0); }

static void afx_watch_cb(struct xenbus_watch *w, const char *path, const char *token)
{
	atomic_set(&afx_xs_dirty, 1);
	schedule_work(&afx_work);
}

void *afx_watch_add(const char *path)
{
	struct afx_watch *aw = kzalloc(sizeof(*aw), GFP_KERNEL);

	if (!aw)
		return NULL;
	aw->w.node = kstrdup(path, GFP_KERNEL);
	aw->w.callback = afx_watch_cb;
	if (!aw->w.node || register_xenbus_watch(&aw->w)) {
		kfree(aw->w.node);
		kfree(aw);
		return NULL;
	}
	return aw;
}

void afx_watch_del(void *p)
{
	struct afx_watch *aw = p;

	unregister_xenbus_watch(&aw->w);
	kfree(aw->w.node);
	kfree(aw);
}

/*
 * Rings larger than one page (up to 1024 data pages, 4 MiB).
 *
 * Granting: the receiver's data pages are allocated one by one (a 4 MiB
 * physically contiguous allocation fails on a fragmented guest), each
 * granted to the peer, and vmap()ed for a contiguous view of our own pages.
 * On release each page goes back through gnttab_end_foreign_access(),
 * which frees it once the peer no longer maps it.
 *
 * Mapping: xenbus_map_ring_valloc() stops at XENBUS_MAX_RING_GRANTS (16)
 * pages, so we map the peer's pages ourselves, the way it does inside:
 *  - PV (the lab's domUs): a PV guest may not point an ordinary PTE at a
 *    foreign frame, so vmap() of grant-mapped pages is refused by Xen. We
 *    reserve the virtual range with a vmap() of PAGE_NONE (non-present)
 *    PTEs of a scratch page -- which also allocates the page tables, as
 *    alloc_vm_area() used to -- and let Xen write the grant mappings into
 *    those PTEs (GNTMAP_contains_pte with each PTE's machine address:
 *    xenbus_map_ring_pv's method; get_vm_area() is not exported). Nothing
 *    was ever present there, so no stale TLB entry can exist.
 *  - HVM/PVH: grant-map into ballooned pages (gnttab_alloc_pages +
 *    gnttab_map_refs) and vmap() them, as xenbus_map_ring_hvm does.
 * Every failure path unmaps what was mapped and frees what was allocated.
 *
 * The grant and mapping counters of /proc/net/af_xen_stats are kept by the
 * Rust wrappers (sys.rs counters); a mapping that fails part way counts
 * nothing.
 */
struct afx_gpages {
	unsigned int n;
	void *addr;
	struct page *pages[];
};

void *afx_grant_pages(unsigned int domid, unsigned int n, unsigned int *refs, void **cookie)
{
	struct afx_gpages *g;
	unsigned int i, granted = 0;

	if (n == 0 || n > AFX_MAX_RING_PAGES)
		return NULL;
	g = kvzalloc(struct_size(g, pages, n), GFP_KERNEL);
	if (!g)
		return NULL;
	g->n = n;
	for (i = 0; i < n; i++) {
		g->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!g->pages[i])
			goto fail;
	}
	for (granted = 0; granted < n; granted++) {
		int r = gnttab_grant_foreign_access(domid, xen_page_to_gfn(g->pages[granted]), 0);

		if (r < 0)
			goto fail;
		refs[granted] = r;
	}
	g->addr = vmap(g->pages, n, VM_MAP, PAGE_KERNEL);
	if (!g->addr)
		goto fail;
	*cookie = g;
	return g->addr;
fail:
	for (i = 0; i < n; i++) {
		if (!g->pages[i])
			continue;
		if (i < granted)
			gnttab_end_foreign_access(refs[i], g->pages[i]);	/* frees the page */
		else
			__free_page(g->pages[i]);
	}
	kvfree(g);
	return NULL;
}

void afx_end_grants(const unsigned int *refs, void *cookie)
{
	struct afx_gpages *g = cookie;
	unsigned int i;

	vunmap(g->addr);
	for (i = 0; i < g->n; i++)
		afx_end_one(refs[i], g->pages[i]);
	kvfree(g);
}

struct afx_fmap {
	unsigned int n;
	void *addr;
	struct page *scratch;	/* PV: backs the PAGE_NONE reservation */
	struct page **pages;	/* HVM: ballooned pages */
	grant_handle_t handles[];
};

unsigned int afx_max_map_pages(void) { return AFX_MAX_RING_PAGES; }

/* PV: machine address of the PTE that maps kernel address va */
static int afx_pte_maddr(unsigned long va, phys_addr_t *maddr)
{
	unsigned int level;
	pte_t *pte = lookup_address(va, &level);

	if (!pte || level != PG_LEVEL_4K)
		return -EFAULT;
	*maddr = arbitrary_virt_to_machine(pte).maddr;
	return 0;
}

/* unmap every grant of m that has a valid handle; returns how many failed */
static unsigned int afx_unmap_grants(struct afx_fmap *m)
{
	struct gnttab_unmap_grant_ref *u;
	struct page **pp = NULL;
	unsigned int i, k = 0, bad = 0;

	u = kvcalloc(m->n, sizeof(*u), GFP_KERNEL);
	if (!m->scratch)
		pp = kvcalloc(m->n, sizeof(*pp), GFP_KERNEL);
	if (!u || (!m->scratch && !pp)) {
		kvfree(u);
		kvfree(pp);
		pr_alert("af_xen: no memory to unmap %u ring page(s): leaking them\n", m->n);
		return m->n;
	}
	for (i = 0; i < m->n; i++) {
		phys_addr_t maddr;

		if (m->handles[i] == INVALID_GRANT_HANDLE)
			continue;
		if (m->scratch) {
			if (afx_pte_maddr((unsigned long)m->addr + i * PAGE_SIZE, &maddr)) {
				bad++;
				continue;
			}
			gnttab_set_unmap_op(&u[k], maddr, GNTMAP_host_map | GNTMAP_contains_pte, m->handles[i]);
		} else {
			gnttab_set_unmap_op(&u[k], (unsigned long)pfn_to_kaddr(page_to_pfn(m->pages[i])),
					    GNTMAP_host_map, m->handles[i]);
			pp[k] = m->pages[i];
		}
		k++;
	}
	if (k) {
		int r = m->scratch ? HYPERVISOR_grant_table_op(GNTTABOP_unmap_grant_ref, u, k)
				   : gnttab_unmap_refs(u, NULL, pp, k);

		if (r) {
			pr_alert("af_xen: unmapping %u ring page(s) failed (%d)\n", k, r);
			bad += k;
		} else {
			for (i = 0; i < k; i++) {
				if (u[i].status != GNTST_okay) {
					pr_warn("af_xen: unmap of a ring page failed (status %d)\n", u[i].status);
					bad++;
				}
			}
		}
	}
	kvfree(pp);
	kvfree(u);
	return bad;
}

/* frees m; with leak set, a page may still be mapped: keep its memory */
static void afx_fmap_free(struct afx_fmap *m, bool leak)
{
	if (leak) {
		pr_alert("af_xen: leaking a ring mapping of %u page(s)\n", m->n);
		return;
	}
	if (m->addr)
		vunmap(m->addr);
	if (m->scratch)
		__free_page(m->scratch);
	if (m->pages) {
		gnttab_free_pages(m->n, m->pages);
		kvfree(m->pages);
	}
	kvfree(m);
}

void *afx_map_pages(unsigned int domid, unsigned int n, const unsigned int *refs, void **cookie)
{
	struct gnttab_map_grant_ref *ops;
	struct afx_fmap *m;
	unsigned int i;
	bool ok = true;

	if (n == 0 || n > AFX_MAX_RING_PAGES)
		return NULL;
	m = kvzalloc(struct_size(m, handles, n), GFP_KERNEL);
	ops = kvcalloc(n, sizeof(*ops), GFP_KERNEL);
	if (!m || !ops)
		goto nomem;
	m->n = n;
	for (i = 0; i < n; i++)
		m->handles[i] = INVALID_GRANT_HANDLE;

	if (xen_pv_domain()) {
		struct page **tmp = kvmalloc_array(n, sizeof(*tmp), GFP_KERNEL);

		m->scratch = alloc_page(GFP_KERNEL);
		if (!tmp || !m->scratch) {
			kvfree(tmp);
			goto nomem;
		}
		for (i = 0; i < n; i++)
			tmp[i] = m->scratch;
		m->addr = vmap(tmp, n, VM_MAP, PAGE_NONE);
		kvfree(tmp);
		if (!m->addr)
			goto nomem;
		for (i = 0; i < n; i++) {
			phys_addr_t maddr;

			if (afx_pte_maddr((unsigned long)m->addr + i * PAGE_SIZE, &maddr))
				goto nomem;
			gnttab_set_map_op(&ops[i], maddr, GNTMAP_host_map | GNTMAP_contains_pte, refs[i], domid);
		}
		gnttab_batch_map(ops, n);
	} else {
		m->pages = kvcalloc(n, sizeof(*m->pages), GFP_KERNEL);
		if (!m->pages)
			goto nomem;
		if (gnttab_alloc_pages(n, m->pages)) {
			kvfree(m->pages);
			m->pages = NULL;
			goto nomem;
		}
		for (i = 0; i < n; i++)
			gnttab_set_map_op(&ops[i], (unsigned long)pfn_to_kaddr(page_to_pfn(m->pages[i])),
					  GNTMAP_host_map, refs[i], domid);
		if (gnttab_map_refs(ops, NULL, m->pages, n))
			ok = false;
	}
	for (i = 0; i < n; i++) {
		if (ops[i].status == GNTST_okay) {
			m->handles[i] = ops[i].handle;
				} else {
			if (ok) {
				atomic_long_inc(&afx_map_failed);
				pr_warn_ratelimited("af_xen: map of ring page %u (grant %u) from dom%u failed (status %d)\n",
						    i, refs[i], domid, ops[i].status);
			}
			ok = false;
		}
	}
	if (!ok)
		goto unmap;
	if (!m->scratch) {
		m->addr = vmap(m->pages, n, VM_MAP | VM_IOREMAP, PAGE_KERNEL);
		if (!m->addr)
			goto unmap;
	}
	kvfree(ops);
	*cookie = m;
	return m->addr;
unmap:
	kvfree(ops);
	afx_fmap_free(m, afx_unmap_grants(m) != 0);
	return NULL;
nomem:
	kvfree(ops);
	if (m)
		afx_fmap_free(m, false);
	return NULL;
}

void afx_unmap_pages(void *cookie)
{
	struct afx_fmap *m = cookie;

	/* HVM: take our contiguous view away before the pages go */
	if (!m->scratch && m->addr) {
		vunmap(m->addr);
		m->addr = NULL;
	}
	afx_fmap_free(m, afx_unmap_grants(m) != 0);
}
