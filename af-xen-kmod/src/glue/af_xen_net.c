// SPDX-License-Identifier: GPL-2.0
/*
 * Kernel TCP sockets for the TCP carrier (docs/migration.md, "Kernel TCP
 * carrier"): the module parameters of the TCP leg listener, socket calls
 * whose arguments are kernel structs Rust cannot build from
 * kernel::bindings (sockaddr_in, msghdr/kvec) and the struct sock callbacks
 * (sk_callback_lock, sk_data_ready), which are opaque to Rust. Every
 * function is wrapped by src/sys/net.rs.
 */
#include <linux/module.h>
#include <linux/net.h>
#include <linux/in.h>
#include <linux/inet.h>
#include <linux/inetdevice.h>
#include <linux/netdevice.h>
#include <linux/platform_device.h>
#include <linux/random.h>
#include <linux/tcp.h>
#include <linux/in6.h>
#include <linux/uaccess.h>
#include <linux/workqueue.h>
#include <net/sock.h>
#include <net/tcp.h>
#include <net/net_namespace.h>
#include "af_xen_net.h"
#include "af_xen_glue.h"

/*
 * 7919: unassigned by IANA, below the ephemeral range (so no outgoing
 * connection of the guest holds it), not used by Xen's tools.
 */
static int tcp_port = 7919;
module_param(tcp_port, int, 0444);
MODULE_PARM_DESC(tcp_port, "TCP port of the TCP leg listener (0: no TCP carrier; default 7919)");

static char *tcp_addr = "";
module_param(tcp_addr, charp, 0444);
MODULE_PARM_DESC(tcp_addr, "IPv4 address advertised for the TCP leg (default: the first global IPv4 address of an interface, e.g. netfront's eth0)");

static int peer_lost_ms = 10000;
module_param(peer_lost_ms, int, 0644);
MODULE_PARM_DESC(peer_lost_ms, "After a carrier switch, a connection whose TCP legs are not both up within this many milliseconds (or whose peer stops acknowledging for as long) fails with ECONNRESET (default 10000)");

int afx_tcp_port(void) { return tcp_port; }
int afx_peer_lost_ms(void) { return peer_lost_ms < 100 ? 100 : peer_lost_ms; }

/*
 * The address to advertise, network byte order in out[4]: tcp_addr, or
 * the first universe-scope IPv4 address of any interface (read at each
 * handshake: the address may be configured after the module loaded).
 * 0 when there is none.
 */
int afx_tcp_local_addr(u8 *out)
{
	struct net_device *dev;
	__be32 a = 0;

	if (tcp_addr && tcp_addr[0]) {
		if (!in4_pton(tcp_addr, -1, (u8 *)&a, -1, NULL))
			return 0;
		memcpy(out, &a, 4);
		return 1;
	}
	rcu_read_lock();
	for_each_netdev_rcu(&init_net, dev) {
		struct in_device *in_dev = __in_dev_get_rcu(dev);
		const struct in_ifaddr *ifa;

		if (!in_dev || (dev->flags & IFF_LOOPBACK) || !(dev->flags & IFF_UP))
			continue;
		in_dev_for_each_ifa_rcu(ifa, in_dev) {
			if (ifa->ifa_scope == RT_SCOPE_UNIVERSE) {
				a = ifa->ifa_local;
				break;
			}
		}
		if (a)
			break;
	}
	rcu_read_unlock();
	if (!a)
		return 0;
	memcpy(out, &a, 4);
	return 1;
}

u64 afx_random_u64(void)
{
	u64 v;

	get_random_bytes(&v, sizeof(v));
	return v;
}

/* All TCP legs' socket events run one work item (Rust: afx_rs_tcp_work). */
static void afx_tcp_work_fn(struct work_struct *w) { afx_rs_tcp_work(); }
static DECLARE_WORK(afx_tcp_work, afx_tcp_work_fn);
/* the same work, later: hello deadlines */
static void afx_tcp_dwork_fn(struct work_struct *w) { afx_rs_tcp_work(); }
static DECLARE_DELAYED_WORK(afx_tcp_dwork, afx_tcp_dwork_fn);
/* and the carrier's tick (leg connects, the peer-lost bound), separate so
 * that neither delays the other */
static void afx_tcp_tick_fn(struct work_struct *w) { afx_rs_tcp_work(); }
static DECLARE_DELAYED_WORK(afx_tcp_tick, afx_tcp_tick_fn);
/* the legs' liveness cadence (carrier/switch/work.rs leg_unanswered), apart from the other
 * two so that its slower period never postpones theirs */
static void afx_tcp_live_fn(struct work_struct *w) { afx_rs_tcp_work(); }
static DECLARE_DELAYED_WORK(afx_tcp_live, afx_tcp_live_fn);

/*
 * A leg's owner (sk_user_data): the AF_XEN socket whose connection it
 * carries, set while the application holds that socket and cleared under
 * sk_callback_lock before it lets go (afx_tcp_set_owner), so a callback
 * that finds it finds a live sock. Its waiters -- a reader blocked in
 * recvmsg, a writer waiting for room, epoll -- are woken straight from the
 * leg's callbacks and take the bytes or make room themselves; through the
 * work item alone each wake cost a context switch to the worker first
 * (5-6 per MiB on the reader).
 */
/*
 * The low bits of sk_user_data: the owner's recvmsg pulls this leg (see
 * afx_tcp_data_ready); the owner's writer flushes what this leg's queue
 * holds, so a drain need not run the work item (afx_tcp_write_space).
 */
#define AFX_OWNER_PULLS 1UL
#define AFX_OWNER_WRITES 2UL
#define AFX_OWNER_FLAGS (AFX_OWNER_PULLS | AFX_OWNER_WRITES)

/* Wakes the leg's owner; returns the owner's flags (0: no owner). */
static unsigned long afx_leg_wake(struct sock *sk, unsigned int mask)
{
	unsigned long v;
	struct sock *owner;

	read_lock_bh(&sk->sk_callback_lock);
	v = (unsigned long)sk->sk_user_data;
	owner = (struct sock *)(v & ~AFX_OWNER_FLAGS);
	if (owner)
		afx_wake(owner, mask);
	read_unlock_bh(&sk->sk_callback_lock);
	return owner ? v & AFX_OWNER_FLAGS : 0;
}

/*
 * An inbound leg whose direction is on TCP is read by the application's
 * recvmsg (payload straight into its buffers, control frames on the way):
 * its data wakes the owner only, no work item (whose pass preempted the
 * reader 3.5 times per MiB). Everything else -- the outbound leg's Consumed,
 * a leg whose direction is on a ring (TxFreeze), a leg without an owner --
 * is the work item's.
 */
static void afx_tcp_data_ready(struct sock *sk)
{
	if (!(afx_leg_wake(sk, EPOLLIN | EPOLLRDNORM) & AFX_OWNER_PULLS))
		schedule_work(&afx_tcp_work);
}
static void afx_tcp_state_change(struct sock *sk)
{
	afx_leg_wake(sk, EPOLLIN | EPOLLRDNORM | EPOLLOUT | EPOLLWRNORM);
	schedule_work(&afx_tcp_work);
}
/*
 * As sk_stream_write_space: only once a third of the send buffer is free,
 * and SOCK_NOSPACE cleared then. Left set, tcp_check_space called us on
 * every ACK, and each call ran the work item (1-1.4 involuntary context
 * switches per MiB on the writer); the next send
 * that finds the buffer full sets it again.
 */
static void afx_tcp_write_space(struct sock *sk)
{
	struct socket *sock = sk->sk_socket;

	if (!sk_stream_is_writeable(sk))
		return;
	if (sock)
		clear_bit(SOCK_NOSPACE, &sock->flags);
	/*
	 * The work item only when something is queued that no writer will
	 * flush (carrier/switch/owners.rs own_outbound). Run at every drain, it competed
	 * with the writer it had just woken, on the same vCPU: the stream was
	 * 0.65-0.79x TCP's with both domains idling more than TCP's (the pipe
	 * ran dry between drains); 0.86x with the work a jiffy later, 0.93x
	 * without it (docs/lab.md, "The TCP carrier at TCP's speed").
	 */
	if (!(afx_leg_wake(sk, EPOLLOUT | EPOLLWRNORM) & AFX_OWNER_WRITES))
		schedule_work(&afx_tcp_work);
}

/* The leg's owner from now on (NULL: none) and its AFX_OWNER_* flags; see afx_leg_wake. */
void afx_tcp_set_owner(struct socket *s, struct sock *owner, int flags)
{
	struct sock *sk = s->sk;

	write_lock_bh(&sk->sk_callback_lock);
	sk->sk_user_data = owner ? (void *)((unsigned long)owner | ((unsigned long)flags & AFX_OWNER_FLAGS)) : NULL;
	write_unlock_bh(&sk->sk_callback_lock);
}

/* "Not writeable" answers that found SOCK_NOSPACE clear and set it: each a
 * sleep that no write_space would have ended before the fix below. */
static atomic_long_t afx_nospace_armed = ATOMIC_LONG_INIT(0);
long afx_tcp_nospace_armed(void) { return atomic_long_read(&afx_nospace_armed); }

/*
 * Whether a send would take bytes now (as TCP's own poll says EPOLLOUT).
 * A "no" arms SOCK_NOSPACE first, as tcp_poll does: tcp_check_space calls
 * write_space (which wakes the writer) only while that bit is set, and
 * the send that last filled the leg may not have set it, or write_space
 * cleared it at a moment the leg was writeable and the leg was no longer
 * when the woken writer looked (a split of a queued skb grows
 * sk_wmem_queued without a send). The leg then drained with no callback
 * and the writer slept on with its frame's rest queued
 * (seen: leg empty and writeable, SOCK_NOSPACE clear,
 * 27376 bytes queued, writer asleep). The barrier orders the bit against
 * the second look, which catches space freed in between.
 */
int afx_tcp_writable(struct socket *s)
{
	struct sock *sk = s->sk;

	if (sk_stream_is_writeable(sk))
		return 1;
	if (!test_and_set_bit(SOCK_NOSPACE, &s->flags))
		atomic_long_inc(&afx_nospace_armed);
	smp_mb__after_atomic();
	return sk_stream_is_writeable(sk);
}

/* the callbacks the socket had before ours (the same for every TCP socket) */
static void (*orig_data_ready)(struct sock *sk);
static void (*orig_state_change)(struct sock *sk);
static void (*orig_write_space)(struct sock *sk);

void afx_tcp_schedule(void) { schedule_work(&afx_tcp_work); }
void afx_tcp_schedule_after_ms(unsigned int ms) { schedule_delayed_work(&afx_tcp_dwork, msecs_to_jiffies(ms)); }
void afx_tcp_tick_after_ms(unsigned int ms) { schedule_delayed_work(&afx_tcp_tick, msecs_to_jiffies(ms)); }
void afx_tcp_live_after_ms(unsigned int ms) { schedule_delayed_work(&afx_tcp_live, msecs_to_jiffies(ms)); }
/* CLOCK_MONOTONIC, which stands still while this guest is saved: boot time
 * jumps by the time it was away, and every bound running (a pending leg's
 * hello, the peer-lost bound, connects) expired at once on the restore */
u64 afx_now_ms(void) { return ktime_get_ns() / NSEC_PER_MSEC; }
void afx_tcp_flush(void)
{
	cancel_delayed_work_sync(&afx_tcp_dwork);
	cancel_delayed_work_sync(&afx_tcp_tick);
	cancel_delayed_work_sync(&afx_tcp_live);
	cancel_work_sync(&afx_tcp_work);
}

/*
 * A leg starts with a 1 MiB send buffer (not locked: TCP's autotuning
 * still grows it, never shrinks it). Its writer is woken once a third of
 * the buffer is free (afx_tcp_write_space); from tcp_wmem's 16 KiB start
 * the pipe ran dry between wakes (0.65x TCP with half the writer's CPU).
 */
#define AFX_LEG_SNDBUF (1 << 20)

static void afx_hook(struct sock *sk)
{
	if (READ_ONCE(sk->sk_sndbuf) < AFX_LEG_SNDBUF && sk->sk_state != TCP_LISTEN)
		WRITE_ONCE(sk->sk_sndbuf, AFX_LEG_SNDBUF);
	/* as the TCP it is measured against: a write's frames go out with
	 * MSG_MORE until its last; a 1-byte frame must not wait for an ACK */
	tcp_sock_set_nodelay(sk);
	write_lock_bh(&sk->sk_callback_lock);
	if (!orig_data_ready) {
		orig_data_ready = sk->sk_data_ready;
		orig_state_change = sk->sk_state_change;
		orig_write_space = sk->sk_write_space;
	}
	sk->sk_data_ready = afx_tcp_data_ready;
	sk->sk_state_change = afx_tcp_state_change;
	sk->sk_write_space = afx_tcp_write_space;
	write_unlock_bh(&sk->sk_callback_lock);
}

/* TCP listener on INADDR_ANY:port whose events schedule the work. */
int afx_tcp_listen(int port, struct socket **out)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port), .sin_addr.s_addr = htonl(INADDR_ANY) };
	struct socket *s;
	int err;

	err = sock_create_kern(&init_net, AF_INET, SOCK_STREAM, IPPROTO_TCP, &s);
	if (err)
		return err;
	sock_set_reuseaddr(s->sk);
	err = kernel_bind(s, (struct sockaddr *)&a, sizeof(a));
	if (!err)
		err = kernel_listen(s, 64);
	if (err) {
		sock_release(s);
		return err;
	}
	afx_hook(s->sk);
	*out = s;
	return 0;
}

/* Non-blocking accept: 0 and *out, or -EAGAIN. The child inherits our callbacks. */
int afx_tcp_accept(struct socket *l, struct socket **out)
{
	int err = kernel_accept(l, out, O_NONBLOCK);

	if (!err)
		afx_hook((*out)->sk);
	return err;
}

/* Blocking connect to addr (network byte order):port, process context. */
int afx_tcp_connect(const u8 *addr, int port, struct socket **out)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct socket *s;
	int err;

	memcpy(&a.sin_addr.s_addr, addr, 4);
	err = sock_create_kern(&init_net, AF_INET, SOCK_STREAM, IPPROTO_TCP, &s);
	if (err)
		return err;
	tcp_sock_set_nodelay(s->sk);
	err = kernel_connect(s, (struct sockaddr *)&a, sizeof(a), 0);
	if (err) {
		sock_release(s);
		return err;
	}
	afx_hook(s->sk);
	*out = s;
	return 0;
}

/*
 * Non-blocking connect of a carrier leg: 0 and *out (connecting or
 * connected; afx_tcp_leg_state tells), or -errno. Our callbacks are on
 * before the connect, so its completion schedules the work; the leg gives
 * up on a peer that stops acknowledging after user_timeout_ms.
 */
int afx_tcp_connect_start(const u8 *addr, int port, unsigned int user_timeout_ms, struct socket **out)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port) };
	struct socket *s;
	int err;

	memcpy(&a.sin_addr.s_addr, addr, 4);
	err = sock_create_kern(&init_net, AF_INET, SOCK_STREAM, IPPROTO_TCP, &s);
	if (err)
		return err;
	tcp_sock_set_nodelay(s->sk);
	tcp_sock_set_user_timeout(s->sk, user_timeout_ms);
	afx_hook(s->sk);
	err = kernel_connect(s, (struct sockaddr *)&a, sizeof(a), O_NONBLOCK);
	if (err && err != -EINPROGRESS) {
		afx_tcp_release(s);
		return err;
	}
	*out = s;
	return 0;
}

/* 1 established, 0 still connecting, -errno failed or closed */
int afx_tcp_leg_state(struct socket *s)
{
	struct sock *sk = s->sk;
	int st = READ_ONCE(sk->sk_state);
	int err = READ_ONCE(sk->sk_err);

	if (err)
		return -err;
	if (st == TCP_ESTABLISHED || st == TCP_CLOSE_WAIT)
		return 1;
	if (st == TCP_SYN_SENT || st == TCP_SYN_RECV)
		return 0;
	return -ECONNRESET;
}

void afx_tcp_set_user_timeout(struct socket *s, unsigned int ms)
{
	tcp_sock_set_user_timeout(s->sk, ms);
}

/*
 * Whether the leg waits for an answer from its peer: -1 when it holds
 * nothing unacknowledged or unsent, 1 when a retransmission or a window
 * probe is outstanding, 0 otherwise. The carrier's bound for a peer that
 * died with the legs up: a leg unanswered at every look for peer_lost_ms
 * (carrier/switch/work.rs leg_unanswered). TCP_USER_TIMEOUT, which bounded it before,
 * also ends a leg whose live peer keeps its window shut that long
 * (tcp_probe_timer, tcp_rtx_probe0_timed_out): a reader that stopped
 * reading for peer_lost_ms reset the connection. A peer that answers its
 * probes clears icsk_probes_out with each answer, however far apart the
 * probes have backed off.
 */
int afx_tcp_leg_waits(struct socket *s)
{
	struct sock *sk = s->sk;
	struct inet_connection_sock *icsk = inet_csk(sk);
	int w = -1;

	lock_sock(sk);
	if ((sk->sk_state == TCP_ESTABLISHED || sk->sk_state == TCP_CLOSE_WAIT) &&
	    (tcp_sk(sk)->packets_out || tcp_send_head(sk)))
		w = icsk->icsk_retransmits || icsk->icsk_probes_out ? 1 : 0;
	release_sock(sk);
	return w;
}

/* Segments the leg has received (pure ACKs included): the peer heard from. */
u32 afx_tcp_segs_in(struct socket *s)
{
	return READ_ONCE(tcp_sk(s->sk)->segs_in);
}

/*
 * A leg whose retransmission has backed off at least twice -- its peer was
 * unreachable: saved, paused, moving -- retransmits now instead of at the
 * end of the back-off, which after a save of tens of seconds is as long
 * again (carrier/switch/work.rs kick_if_heard calls this once the peer has been heard
 * from). The retransmission's ACK resets the back-off, as at any RTO; the
 * bound (TCP_USER_TIMEOUT) counts from the first retransmission, so firing
 * early never ends the leg sooner. Never a zero-window probe: a peer that
 * answers probes is reachable, and its window update restarts the sending
 * by itself. 1 if kicked.
 */
int afx_tcp_kick_retransmit(struct socket *s)
{
	struct sock *sk = s->sk;
	struct inet_connection_sock *icsk = inet_csk(sk);
	int kicked = 0;

	/* the common case, a leg not backed off, without its lock */
	if (READ_ONCE(icsk->icsk_backoff) < 2)
		return 0;
	lock_sock(sk);
	if ((sk->sk_state == TCP_ESTABLISHED || sk->sk_state == TCP_CLOSE_WAIT) &&
	    icsk->icsk_backoff >= 2 &&
	    icsk->icsk_pending == ICSK_TIME_RETRANS &&
	    time_after(icsk->icsk_timeout, jiffies + 1)) {
		inet_csk_reset_xmit_timer(sk, icsk->icsk_pending, 1, TCP_RTO_MAX);
		kicked = 1;
	}
	release_sock(sk);
	return kicked;
}

/* Send without blocking: bytes sent, -EAGAIN when the socket is full (its
 * write_space callback then schedules the work), or -errno; with more,
 * held back (MSG_MORE) for what follows at once (a Data frame's payload
 * behind its prefix). */
int afx_tcp_send_nb(struct socket *s, const void *buf, size_t len, int more)
{
	struct kvec v = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr m = { .msg_flags = MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0) };

	return kernel_sendmsg(s, &m, &v, 1, len);
}

/*
 * Non-blocking receive of at most len bytes straight into the user buffers
 * of the recvmsg being served (user->msg_iter, advanced by what arrived):
 * one copy, as TCP's own recvmsg, instead of leg -> frame -> buffer -> user.
 * A fault before any byte leaves the data in the socket (-EFAULT).
 */
int afx_tcp_recv_msg(struct socket *s, struct msghdr *user, size_t len)
{
	struct msghdr m = { .msg_flags = MSG_DONTWAIT };
	int n;

	m.msg_iter = user->msg_iter;
	iov_iter_truncate(&m.msg_iter, len);
	n = sock_recvmsg(s, &m, MSG_DONTWAIT);
	if (n > 0)
		iov_iter_advance(&user->msg_iter, n);
	return n;
}

/*
 * Non-blocking send of at most len bytes straight from the user buffers of
 * the sendmsg being served (advanced by what the socket took): the payload
 * of a Data frame whose prefix went just before.
 */
int afx_tcp_send_msg_nb(struct socket *s, struct msghdr *user, size_t len, int more)
{
	struct msghdr m = { .msg_flags = MSG_NOSIGNAL | MSG_DONTWAIT | (more ? MSG_MORE : 0) };
	int n;

	m.msg_iter = user->msg_iter;
	iov_iter_truncate(&m.msg_iter, len);
	n = sock_sendmsg(s, &m);
	if (n > 0)
		iov_iter_advance(&user->msg_iter, n);
	return n;
}

/*
 * A leg's state for /proc/net/af_xen_tcp (lockless snapshots, as ss reads
 * them): out[0] bytes written and not yet acknowledged, out[1] its
 * sk_wmem_queued, out[2] its sk_sndbuf, out[3] SOCK_NOSPACE (the write_space
 * callback comes only while it is set), out[4] sk_stream_is_writeable,
 * out[5] bytes received and not read, out[6] the owner's AFX_OWNER_* flags
 * (-1: no owner).
 */
void afx_tcp_leg_info(struct socket *s, int *out)
{
	struct sock *sk = s->sk;
	const struct tcp_sock *tp = tcp_sk(sk);
	unsigned long v = (unsigned long)READ_ONCE(sk->sk_user_data);

	out[0] = READ_ONCE(tp->write_seq) - READ_ONCE(tp->snd_una);
	out[1] = READ_ONCE(sk->sk_wmem_queued);
	out[2] = READ_ONCE(sk->sk_sndbuf);
	out[3] = test_bit(SOCK_NOSPACE, &s->flags);
	out[4] = sk_stream_is_writeable(sk);
	out[5] = READ_ONCE(tp->rcv_nxt) - READ_ONCE(tp->copied_seq);
	out[6] = v ? (int)(v & AFX_OWNER_FLAGS) : -1;
}

/*
 * Whether a leg has something for a reader to look at: queued bytes, an
 * error or the peer's FIN (lockless, as tcp_poll; a reader that finds
 * nothing waits for the next sk_data_ready).
 */
int afx_tcp_readable(struct socket *s)
{
	struct sock *sk = s->sk;

	return !skb_queue_empty_lockless(&sk->sk_receive_queue) || READ_ONCE(sk->sk_err) ||
	       (READ_ONCE(sk->sk_shutdown) & RCV_SHUTDOWN);
}

/* Non-blocking receive into a kernel buffer: bytes, 0 at EOF, or -errno. */
int afx_tcp_recv(struct socket *s, void *buf, size_t len)
{
	struct kvec v = { .iov_base = buf, .iov_len = len };
	struct msghdr m = { .msg_flags = MSG_DONTWAIT };

	return kernel_recvmsg(s, &m, &v, 1, len, MSG_DONTWAIT);
}

/* Send a kernel buffer (may block for room): bytes sent or -errno. */
int afx_tcp_send(struct socket *s, const void *buf, size_t len)
{
	struct kvec v = { .iov_base = (void *)buf, .iov_len = len };
	struct msghdr m = { .msg_flags = MSG_NOSIGNAL };

	return kernel_sendmsg(s, &m, &v, 1, len);
}

/* Our callbacks off (the socket may outlive the module as an orphan), then release. */
void afx_tcp_release(struct socket *s)
{
	struct sock *sk = s->sk;

	write_lock_bh(&sk->sk_callback_lock);
	sk->sk_user_data = NULL;
	if (orig_data_ready) {
		sk->sk_data_ready = orig_data_ready;
		sk->sk_state_change = orig_state_change;
		sk->sk_write_space = orig_write_space;
	}
	write_unlock_bh(&sk->sk_callback_lock);
	kernel_sock_shutdown(s, SHUT_RDWR);
	sock_release(s);
}

/*
 * This guest's own save/restore (xl save / restore / migrate): Xen's
 * do_suspend() freezes every device (dpm_suspend_start(PMSG_FREEZE)) while
 * grants, mappings and event channels are still valid, and after the
 * domain is back restores them (PMSG_RESTORE; PMSG_THAW when the suspend
 * was cancelled). A platform device of ours gets both: the freeze moves
 * every stream connection to TCP and takes the links down properly, the
 * restore lets the link work start over under the (new) domid.
 */
static int afx_pm_freeze(struct device *dev) { afx_rs_suspend(); return 0; }
static int afx_pm_thaw(struct device *dev) { afx_rs_resume(0); return 0; }
static int afx_pm_restore(struct device *dev) { afx_rs_resume(1); return 0; }
static const struct dev_pm_ops afx_pm_ops = {
	.freeze = afx_pm_freeze,
	.thaw = afx_pm_thaw,
	.restore = afx_pm_restore,
};
static struct platform_driver afx_pm_driver = {
	.driver = { .name = "af_xen_pm", .pm = &afx_pm_ops },
};
static struct platform_device *afx_pm_dev;

int afx_pm_register(void)
{
	int err = platform_driver_register(&afx_pm_driver);

	if (err)
		return err;
	afx_pm_dev = platform_device_register_simple("af_xen_pm", -1, NULL, 0);
	if (IS_ERR(afx_pm_dev)) {
		err = PTR_ERR(afx_pm_dev);
		afx_pm_dev = NULL;
		platform_driver_unregister(&afx_pm_driver);
		return err;
	}
	return 0;
}

void afx_pm_unregister(void)
{
	if (!afx_pm_dev)
		return;
	platform_device_unregister(afx_pm_dev);
	platform_driver_unregister(&afx_pm_driver);
	afx_pm_dev = NULL;
}

/*
 * tcp_redirect: this module takes connections of unmodified TCP programs
 * over (XENSOCK_IOC_GRAFT, afx_graft_tcp below); the preload library
 * redirects only where it reads 1 here.
 */
static bool tcp_redirect = true;
module_param(tcp_redirect, bool, 0444);
MODULE_PARM_DESC(tcp_redirect, "Take TCP connections to co-resident guests over for the preload library (XENSOCK_IOC_GRAFT; read-only)");

/*
 * The calling process's TCP stream socket `fd` of `family`, with a
 * reference (sockfd_put), for a graft onto `ours`; NULL and *err:
 * EBADF/ENOTSOCK, EINVAL (`ours` itself, or a socket without a sock),
 * EPROTONOSUPPORT (not a TCP stream socket), EAFNOSUPPORT (not `family`).
 */
static struct socket *afx_program_tcp(struct socket *ours, int fd, int family, int *err)
{
	struct socket *prog = sockfd_lookup(fd, err);
	struct sock *tsk;

	if (!prog)
		return NULL;
	tsk = prog->sk;
	if (prog == ours || !tsk || !ours->sk)
		*err = -EINVAL;
	else if ((tsk->sk_family != AF_INET && tsk->sk_family != AF_INET6) ||
		 prog->type != SOCK_STREAM || tsk->sk_protocol != IPPROTO_TCP)
		*err = -EPROTONOSUPPORT;
	else if (tsk->sk_family != family)
		*err = -EAFNOSUPPORT;
	else
		return prog;
	sockfd_put(prog);
	return NULL;
}

/*
 * Moves the connected AF_XEN sock of `ours` into the program's own TCP
 * socket `fd` (an unconnected AF_INET/AF_INET6 stream socket of the calling
 * process whose family is `family`), and that socket's TCP sock into
 * `ours`, whose descriptor the caller then closes (tcp_close on a sock
 * that never connected). The ops change in place, as IPV6_ADDRFORM
 * changes a socket's: the program's descriptor, file and wait queue stay,
 * so an epoll registration made before connect, a dup and a forked
 * child's copy all see the AF_XEN sock from now on. Each socket holds a
 * reference on the module of its ops; swapping the ops swaps which socket
 * holds which, so the counts stay right.
 *
 * The TCP sock is locked across the check and the swap: a call that holds
 * it (another thread's connect or bind on the same descriptor) finishes
 * first and the check sees what it did. 0 or -errno: EBADF/ENOTSOCK (fd),
 * EPROTONOSUPPORT (not a TCP stream socket), EAFNOSUPPORT (not `family`),
 * EISCONN (connected), EALREADY (connecting), EINVAL (listening, or `fd`
 * is `ours`).
 */
/*
 * sock_graft() for a socket that has a sock already: `parent`'s sock is
 * `sk` from now on. Without the NULL in between that sock_graft() wants
 * (it warns on a socket with a sock): another thread's call on the same
 * socket (getsockopt at SOL_SOCKET reads sock->sk and uses it) must never
 * find none.
 */
static void afx_regraft(struct sock *sk, struct socket *parent)
{
	write_lock_bh(&sk->sk_callback_lock);
	rcu_assign_pointer(sk->sk_wq, &parent->wq);
	WRITE_ONCE(parent->sk, sk);
	sk_set_socket(sk, parent);
	sk->sk_uid = SOCK_INODE(parent)->i_uid;
	security_sock_graft(sk, parent);
	write_unlock_bh(&sk->sk_callback_lock);
}

int afx_graft_tcp(struct socket *ours, int fd, int family)
{
	struct socket *prog;
	struct sock *tsk, *xsk = ours->sk;
	const struct proto_ops *tops;
	int err = 0;

	prog = afx_program_tcp(ours, fd, family, &err);
	if (!prog)
		return err;
	tsk = prog->sk;
	lock_sock(tsk);
	if (prog->state == SS_CONNECTED || tsk->sk_state == TCP_ESTABLISHED ||
	    tsk->sk_state == TCP_CLOSE_WAIT)
		err = -EISCONN;
	else if (prog->state == SS_CONNECTING || tsk->sk_state == TCP_SYN_SENT)
		err = -EALREADY;
	else if (prog->state != SS_UNCONNECTED || tsk->sk_state != TCP_CLOSE)
		err = -EINVAL;
	if (err) {
		release_sock(tsk);
		goto out;
	}
	tops = prog->ops;
	afx_regraft(xsk, prog);
	afx_regraft(tsk, ours);
	WRITE_ONCE(prog->ops, ours->ops);
	WRITE_ONCE(ours->ops, tops);
	prog->state = SS_CONNECTED;
	ours->state = SS_UNCONNECTED;
	release_sock(tsk);
	/* the connect completed: an edge-triggered EPOLLOUT registered before
	 * it (a non-blocking connect's completion) gets its edge */
	afx_wake(xsk, EPOLLOUT | EPOLLWRNORM);
out:
	sockfd_put(prog);
	return err;
}

/*
 * getsockopt of a taken-over connection (an AF_XEN sock under a TCP
 * program's socket) at the TCP and IP levels: the options programs read
 * routinely, with the values of what carries the bytes now: no Nagle
 * delay (every write goes to the ring at once), a ring-sized segment,
 * TCP_INFO of an established connection with no TCP statistics (there is
 * no TCP on this path). -ENOPROTOOPT for anything else.
 */
int afx_inet_getsockopt(int level, int optname, char __user *optval, int __user *optlen)
{
	struct tcp_info info;
	const void *p;
	int len, v = 0;
	size_t size = sizeof(v);

	if (get_user(len, optlen))
		return -EFAULT;
	if (len < 0)
		return -EINVAL;
	p = &v;
	switch (level) {
	case SOL_TCP:
		switch (optname) {
		case TCP_NODELAY:
			v = 1;
			break;
		case TCP_MAXSEG:
			v = 65483;
			break;
		case TCP_INFO:
			memset(&info, 0, sizeof(info));
			info.tcpi_state = TCP_ESTABLISHED;
			p = &info;
			size = sizeof(info);
			break;
		default:
			return -ENOPROTOOPT;
		}
		break;
	case SOL_IP:
		if (optname != IP_TOS)
			return -ENOPROTOOPT;
		break;
	case SOL_IPV6:
		if (optname != IPV6_V6ONLY)
			return -ENOPROTOOPT;
		break;
	default:
		return -ENOPROTOOPT;
	}
	len = min_t(int, len, size);
	if (put_user(len, optlen) || copy_to_user(optval, p, len))
		return -EFAULT;
	return 0;
}

/*
 * The dual listener: a TCP program's listening socket becomes an AF_XEN
 * listener (co-resident clients, over AF_XEN) that holds the program's
 * TCP listener inside it (everyone else), so one descriptor serves both.
 *
 * The held TCP listener's new connections wake the AF_XEN listener's
 * waiters: its sk_data_ready chains to TCP's own and wakes the owner named
 * in sk_user_data, which is set and cleared under sk_callback_lock (as a
 * leg's owner) and marked SK_USER_DATA_NOCOPY, so the connections cloned
 * from the listener do not inherit it. They do inherit the callback
 * itself: afx_listener_accept gives them TCP's back before the program
 * sees them.
 */
static void (*orig_listen_data_ready)(struct sock *sk);

static void afx_listener_data_ready(struct sock *sk)
{
	struct sock *owner;

	orig_listen_data_ready(sk);
	read_lock_bh(&sk->sk_callback_lock);
	owner = (struct sock *)((unsigned long)sk->sk_user_data & SK_USER_DATA_PTRMASK);
	if (owner && sk->sk_state == TCP_LISTEN)
		afx_wake(owner, EPOLLIN | EPOLLRDNORM);
	read_unlock_bh(&sk->sk_callback_lock);
}

/*
 * Moves the program's listening TCP socket `fd` (of `family`, of the
 * calling process) into a kernel socket of our own (*held), and the sock
 * and ops of `ours`, a listening AF_XEN socket, into the program's socket;
 * `owner` (ours' sock) is woken by the TCP listener's new connections.
 * `ours` is left with `spare`, a new sock of ours (an unbound socket,
 * which the caller closes), so that it never has none. The module
 * references move with the ops: *held keeps the one the program's socket
 * held on TCP's module, the program's socket takes one on ours.
 * 0 or -errno, nothing changed: EBADF/ENOTSOCK, EPROTONOSUPPORT (not a
 * TCP stream socket), EAFNOSUPPORT (not `family`), EINVAL (not
 * listening), EBUSY (its sk_user_data is taken), ENOMEM.
 */
int afx_graft_listener(struct socket *ours, int fd, int family, struct socket **held,
		       struct sock *spare)
{
	struct socket *prog, *inner = NULL;
	struct sock *tsk, *xsk = ours->sk;
	int err = 0;

	prog = afx_program_tcp(ours, fd, family, &err);
	if (!prog)
		return err;
	tsk = prog->sk;
	err = sock_create_lite(tsk->sk_family, SOCK_STREAM, IPPROTO_TCP, &inner);
	if (err)
		goto out;
	lock_sock(tsk);
	/* (a listener whose sk_user_data someone else uses: BPF, a ULP) */
	if (tsk->sk_state != TCP_LISTEN || tsk->sk_user_data) {
		err = tsk->sk_state != TCP_LISTEN ? -EINVAL : -EBUSY;
		release_sock(tsk);
		sock_release(inner);
		goto out;
	}
	inner->ops = prog->ops;
	inner->state = prog->state;
	sock_graft(tsk, inner);
	__module_get(ours->ops->owner);
	afx_regraft(xsk, prog);
	WRITE_ONCE(prog->ops, ours->ops);
	/* `ours` is left with a new unbound sock of ours, never with none */
	afx_regraft(spare, ours);
	write_lock_bh(&tsk->sk_callback_lock);
	if (!orig_listen_data_ready)
		orig_listen_data_ready = tsk->sk_data_ready;
	tsk->sk_data_ready = afx_listener_data_ready;
	tsk->sk_user_data = (void *)((unsigned long)xsk | SK_USER_DATA_NOCOPY);
	write_unlock_bh(&tsk->sk_callback_lock);
	release_sock(tsk);
	*held = inner;
out:
	sockfd_put(prog);
	return err;
}

/*
 * A connection the held TCP listener has ready, made the socket
 * `newsock` that accept(2) made for the AF_XEN listener: TCP's own ops and
 * sock from now on, nothing of ours on its path. -EAGAIN: none ready.
 * `newsock` came with a reference on our module (the listener's ops); it
 * takes one on TCP's instead.
 */
int afx_listener_accept(struct socket *held, struct socket *newsock)
{
	struct socket *child;
	struct sock *csk;
	struct module *ours = newsock->ops->owner;
	int err;

	err = kernel_accept(held, &child, O_NONBLOCK);
	if (err)
		return err;
	csk = child->sk;
	lock_sock(csk);
	write_lock_bh(&csk->sk_callback_lock);
	if (csk->sk_data_ready == afx_listener_data_ready)
		csk->sk_data_ready = orig_listen_data_ready;
	write_unlock_bh(&csk->sk_callback_lock);
	child->sk = NULL;
	__module_get(child->ops->owner);
	WRITE_ONCE(newsock->ops, child->ops);
	sock_graft(csk, newsock);
	newsock->state = SS_CONNECTED;
	release_sock(csk);
	/* the program's listening socket holds our module across this call */
	module_put(ours);
	sock_release(child);
	return 0;
}

/* Whether the held TCP listener has a connection to accept (lockless, as inet_csk_listen_poll). */
int afx_listener_ready(struct socket *held)
{
	return !reqsk_queue_empty(&inet_csk(held->sk)->icsk_accept_queue);
}

/* The held TCP listener's own name (getsockname), or -errno. */
int afx_listener_getname(struct socket *held, struct sockaddr *addr)
{
	return held->ops->getname(held, addr, 0);
}

/* A TCP- or IP-level option set on the dual listener goes to its TCP listener. */
int afx_listener_setsockopt(struct socket *held, int level, int optname, sockptr_t optval, unsigned int optlen)
{
	return held->ops->setsockopt(held, level, optname, optval, optlen);
}

/* The AF_XEN listener closes: the TCP listener's callbacks are TCP's again, then it goes. */
void afx_listener_release(struct socket *held)
{
	struct sock *sk = held->sk;

	write_lock_bh(&sk->sk_callback_lock);
	sk->sk_user_data = NULL;
	sk->sk_data_ready = orig_listen_data_ready;
	write_unlock_bh(&sk->sk_callback_lock);
	sock_release(held);
}
