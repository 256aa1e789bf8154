// SPDX-License-Identifier: GPL-2.0
/*
 * af_xen.ko C glue: only what Rust cannot reach through bindgen -- module
 * parameter and alias macros, static inlines, and fields of struct sock
 * (opaque in kernel::bindings), and /proc. No socket logic lives here. The
 * Xen side (event channels, grants, mappings, XenStore, the work items) is
 * af_xen_xen.c; kernel TCP sockets af_xen_net.c.
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
 * Time the stream data path (/proc/net/af_xen_stats send_ns ... irq_ns):
 * off by default, as each timed part reads the clock twice, and under the
 * lab's emulation a clock read is not free (docs/design.md, "Counters of
 * the data path"). The bench turns it on for its timed rows.
 */
static bool time_data_path;
module_param(time_data_path, bool, 0644);
MODULE_PARM_DESC(time_data_path, "sum the time of sendmsg/recvmsg, ring steps, copies, waits, kicks and the interrupt handler in /proc/net/af_xen_stats (default off)");
int afx_time_data_path(void) { return READ_ONCE(time_data_path); }

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
void afx_sock_hold(struct sock *sk) { sock_hold(sk); }

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
int afx_rs_proc_show(struct seq_file *m);	/* Rust (socket/proc.rs) */
int afx_rs_stats_show(struct seq_file *m);	/* Rust (sys/entry.rs) */
int afx_rs_tcp_show(struct seq_file *m);	/* Rust (socket/proc.rs, carrier/switch/proc.rs) */
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
