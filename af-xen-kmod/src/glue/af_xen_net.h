/* SPDX-License-Identifier: GPL-2.0 */
/* af_xen_net.c: kernel TCP sockets for the TCP carrier (wrapped by src/sys/net.rs). */
#ifndef AF_XEN_NET_H
#define AF_XEN_NET_H
#include <linux/types.h>
struct socket;
struct sock;
struct msghdr;
struct sk_buff;
int afx_tcp_port(void);
int afx_tcp_local_addr(u8 *out);
u64 afx_random_u64(void);
void afx_rs_tcp_work(void);
void afx_tcp_schedule(void);
void afx_tcp_flush(void);
void afx_tcp_schedule_after_ms(unsigned int ms);
u64 afx_now_ms(void);
int afx_tcp_listen(int port, struct socket **out);
int afx_tcp_accept(struct socket *l, struct socket **out);
int afx_tcp_connect(const u8 *addr, int port, struct socket **out);
int afx_tcp_recv(struct socket *s, void *buf, size_t len);
int afx_tcp_send(struct socket *s, const void *buf, size_t len);
void afx_tcp_release(struct socket *s);
int afx_peer_lost_ms(void);
void afx_tcp_tick_after_ms(unsigned int ms);
void afx_tcp_live_after_ms(unsigned int ms);
int afx_tcp_connect_start(const u8 *addr, int port, unsigned int user_timeout_ms, struct socket **out);
int afx_tcp_leg_state(struct socket *s);
void afx_tcp_set_user_timeout(struct socket *s, unsigned int ms);
u32 afx_tcp_segs_in(struct socket *s);
int afx_tcp_leg_waits(struct socket *s);
int afx_tcp_kick_retransmit(struct socket *s);
int afx_tcp_send_nb(struct socket *s, const void *buf, size_t len, int more);
int afx_tcp_recv_msg(struct socket *s, struct msghdr *user, size_t len);
int afx_graft_tcp(struct socket *ours, int fd, int family);
int afx_graft_listener(struct socket *ours, int fd, int family, struct socket **held,
		       struct sock *spare);
int afx_listener_accept(struct socket *held, struct socket *newsock);
int afx_listener_ready(struct socket *held);
int afx_listener_getname(struct socket *held, struct sockaddr *addr);
int afx_listener_setsockopt(struct socket *held, int level, int optname, sockptr_t optval, unsigned int optlen);
void afx_listener_release(struct socket *held);
int afx_inet_getsockopt(int level, int optname, char __user *optval, int __user *optlen);
int afx_tcp_send_msg_nb(struct socket *s, struct msghdr *user, size_t len, int more);
int afx_tcp_readable(struct socket *s);
void afx_tcp_leg_info(struct socket *s, int *out);
long afx_tcp_nospace_armed(void);
void afx_tcp_set_owner(struct socket *s, struct sock *owner, int flags);
int afx_tcp_writable(struct socket *s);
void afx_rs_suspend(void);
void afx_rs_resume(int restored);
int afx_pm_register(void);
void afx_pm_unregister(void);
#endif
