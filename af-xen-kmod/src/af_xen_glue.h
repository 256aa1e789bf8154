/* SPDX-License-Identifier: GPL-2.0 */
/* C glue of af_xen.ko: the functions Rust calls (declared again in src/sys.rs). */
struct net; struct socket; struct sock; struct file; struct poll_table_struct;
int afx_family(void);
int afx_proto_register(void);
void afx_proto_unregister(void);
struct sock *afx_sk_alloc(struct net *net, struct socket *sock, int kern, void *priv);
void *afx_sk_priv(struct sock *sk);
void afx_sk_set_priv(struct sock *sk, void *priv);
void afx_sk_release(struct socket *sock);
void afx_sk_graft(struct sock *sk, struct socket *sock);
long afx_rcvtimeo(struct sock *sk, int nonblock);
long afx_sndtimeo(struct sock *sk, int nonblock);
int afx_rcvbuf(struct sock *sk);
int afx_sndbuf(struct sock *sk);
void afx_set_err(struct sock *sk, int err);
int afx_sock_error(struct sock *sk);
int afx_wait(struct sock *sk, long *timeo, int (*cond)(void *), void *arg);
void afx_wake(struct sock *sk, unsigned int mask);
void afx_poll_wait(struct file *file, struct socket *sock, struct poll_table_struct *wait);
void afx_sigpipe(void);
unsigned long afx_virt_to_gfn(void *v);
int afx_xen_domain(void);
struct msghdr; struct proto_accept_arg;
size_t afx_msg_left(struct msghdr *msg);
int afx_accept_flags(struct proto_accept_arg *arg);
int afx_accept_kern(struct proto_accept_arg *arg);
void afx_sk_put(struct sock *sk);
