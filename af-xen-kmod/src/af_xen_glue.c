// SPDX-License-Identifier: GPL-2.0
/*
 * af_xen.ko C glue: only what Rust cannot reach through bindgen -- module
 * parameter and alias macros, static inlines, and fields of struct sock
 * (opaque in kernel::bindings). No socket logic lives here.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/net.h>
#include <linux/sched/signal.h>
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
int afx_sndbuf(struct sock *sk) { return READ_ONCE(sk->sk_sndbuf); }
void afx_set_err(struct sock *sk, int err) { WRITE_ONCE(sk->sk_err, err); sk_error_report(sk); }
int afx_sock_error(struct sock *sk) { return sock_error(sk); }
/* pending error without consuming it (poll) */
int afx_sk_err_pending(struct sock *sk) { return READ_ONCE(sk->sk_err); }
/* SO_LINGER set with l_linger == 0: close() aborts (reset, unsent data dropped) */
int afx_linger_abort(struct sock *sk) { return sock_flag(sk, SOCK_LINGER) && !READ_ONCE(sk->sk_lingertime); }
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
	sk->sk_rcvbuf = READ_ONCE(parent->sk_rcvbuf);
	sk->sk_sndbuf = READ_ONCE(parent->sk_sndbuf);
	sk->sk_rcvtimeo = parent->sk_rcvtimeo;
	sk->sk_sndtimeo = parent->sk_sndtimeo;
	((struct afx_sock *)sk)->priv = priv;
	return sk;
}

void *afx_vzalloc(size_t size) { return vzalloc(size); }
void afx_vfree(void *p) { vfree(p); }

/* /proc/net/af_xen (initial netns): one line per socket, written by Rust */
#include <linux/proc_fs.h>
#include <linux/seq_file.h>
#include <net/net_namespace.h>
int afx_rs_proc_show(struct seq_file *m);	/* Rust (sock.rs) */
int afx_rs_stats_show(struct seq_file *m);	/* Rust (sys.rs) */
static int afx_proc_show(struct seq_file *m, void *v) { return afx_rs_proc_show(m); }
static int afx_stats_show(struct seq_file *m, void *v) { return afx_rs_stats_show(m); }
/* /proc/net/af_xen_stats: the module's resource counters (leak checks) */
int afx_proc_init(void)
{
	if (!proc_create_single("af_xen", 0444, init_net.proc_net, afx_proc_show))
		return -ENOMEM;
	if (!proc_create_single("af_xen_stats", 0444, init_net.proc_net, afx_stats_show)) {
		remove_proc_entry("af_xen", init_net.proc_net);
		return -ENOMEM;
	}
	return 0;
}
void afx_proc_exit(void)
{
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

void afx_rs_work(void);	/* Rust (link.rs) */
static void afx_work_fn(struct work_struct *w) { afx_rs_work(); }
static DECLARE_WORK(afx_work, afx_work_fn);
void afx_schedule(void) { schedule_work(&afx_work); }
void afx_cancel_work(void) { cancel_work_sync(&afx_work); }
static irqreturn_t afx_irq(int irq, void *dev) { schedule_work(&afx_work); return IRQ_HANDLED; }

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
int afx_bind_irq(unsigned int port) { return bind_evtchn_to_irqhandler(port, afx_irq, 0, "af_xen", &afx_work); }
void afx_unbind_irq(int irq) { unbind_from_irqhandler(irq, &afx_work); }
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

/* revoke and free (deferred by the grant table code while the peer maps it) */
void afx_end_grant(unsigned int ref, void *p) { gnttab_end_foreign_access(ref, virt_to_page(p)); }

struct afx_map {
	struct page *page;
	grant_handle_t handle;
	void *addr;
};

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
		pr_warn("af_xen: map of grant %u from dom%u failed (status %d)\n", ref, domid, op.status);
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

/* version, ring-ref, event-channel, state in one transaction (EAGAIN: retry) */
int afx_xs_advertise(const char *dir, unsigned int ref, unsigned int port, int state)
{
	struct xenbus_transaction t;
	int err;
again:
	err = xenbus_transaction_start(&t);
	if (err)
		return err;
	err = xenbus_printf(t, dir, "version", "%u", 1);
	if (!err)
		err = xenbus_printf(t, dir, "ring-ref", "%u", ref);
	if (!err)
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

int afx_xs_write_state(const char *dir, int state) { return xenbus_printf(XBT_NIL, dir, "state", "%d", state); }

/* unload: state 6, advertisement gone (the directory is dom0's: it stays) */
void afx_xs_retract(const char *dir)
{
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
 * Rings larger than one page: the receiver's data pages are one contiguous
 * allocation, each page granted; the sender maps them contiguously with
 * xenbus_map_ring_valloc (at most XENBUS_MAX_RING_GRANTS pages). That API
 * wants a xenbus_device only for otherend_id and error reports, so we hand
 * it a private one (state Closing: an error report never switches a state).
 */
void *afx_grant_pages(unsigned int domid, unsigned int n, unsigned int *refs)
{
	void *p = alloc_pages_exact(n * PAGE_SIZE, GFP_KERNEL | __GFP_ZERO);
	unsigned int i, j;

	if (!p)
		return NULL;
	for (i = 0; i < n; i++) {
		int r = gnttab_grant_foreign_access(domid, virt_to_gfn(p + i * PAGE_SIZE), 0);

		if (r < 0) {
			for (j = 0; j < i; j++)
				gnttab_end_foreign_access(refs[j], virt_to_page(p + j * PAGE_SIZE));
			free_pages_exact(p + i * PAGE_SIZE, (n - i) * PAGE_SIZE);
			return NULL;
		}
		refs[i] = r;
	}
	return p;
}

void afx_end_grants(unsigned int n, const unsigned int *refs, void *p)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		gnttab_end_foreign_access(refs[i], virt_to_page(p + i * PAGE_SIZE));
}

struct afx_vmap {
	struct xenbus_device dev;
	void *addr;
};

unsigned int afx_max_map_pages(void) { return XENBUS_MAX_RING_GRANTS; }

void *afx_map_pages(unsigned int domid, unsigned int n, const unsigned int *refs, void **cookie)
{
	struct afx_vmap *m;
	grant_ref_t gr[XENBUS_MAX_RING_GRANTS];
	unsigned int i;

	if (n == 0 || n > XENBUS_MAX_RING_GRANTS)
		return NULL;
	m = kzalloc(sizeof(*m), GFP_KERNEL);
	if (!m)
		return NULL;
	for (i = 0; i < n; i++)
		gr[i] = refs[i];
	m->dev.nodename = "af_xen";
	m->dev.otherend_id = domid;
	m->dev.state = XenbusStateClosing;
	m->dev.dev.init_name = "af_xen";
	if (xenbus_map_ring_valloc(&m->dev, gr, n, &m->addr)) {
		/*
		 * The failure path reports through xenbus_dev_fatal(), which
		 * writes error/<nodename>/error under our home: remove it, the
		 * map failure is ours to report (the connection is refused).
		 */
		xenbus_rm(XBT_NIL, "error", m->dev.nodename);
		kfree(m);
		return NULL;
	}
	*cookie = m;
	return m->addr;
}

void afx_unmap_pages(void *cookie)
{
	struct afx_vmap *m = cookie;

	xenbus_unmap_ring_vfree(&m->dev, m->addr);
	kfree(m);
}
