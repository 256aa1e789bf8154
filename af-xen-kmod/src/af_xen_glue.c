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
static int afx_proc_show(struct seq_file *m, void *v) { return afx_rs_proc_show(m); }
int afx_proc_init(void)
{
	return proc_create_single("af_xen", 0444, init_net.proc_net, afx_proc_show) ? 0 : -ENOMEM;
}
void afx_proc_exit(void) { remove_proc_entry("af_xen", init_net.proc_net); }
void afx_seq_write(struct seq_file *m, const void *p, size_t n) { seq_write(m, p, n); }
