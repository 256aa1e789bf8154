// SPDX-License-Identifier: GPL-2.0
//! One AF_XEN socket's state, [`XenSock`]: the module's part of each
//! `struct sock`, shared by the socket core (`socket/`) and the carriers
//! (`carrier/`), as `struct vsock_sock` (af_vsock.h) is by vsock's core
//! and its transports. The parts of a connection that the layers above
//! define (its rings, its switch, its TCP endpoints, its link) come in as
//! the types of [`Parts`], so this file names none of them:
//! `carrier::Carriers` says what they are, and `carrier::XenSock` is the
//! socket every layer above uses.

use crate::sys::{self, errno as e, Sk};
use kernel::new_spinlock;
use kernel::prelude::*;
use kernel::sync::{Arc, SpinLock};

/// The parts of a socket defined above this file.
pub(crate) trait Parts: 'static {
    /// One direction of a connection over a shared ring.
    type Pipe;
    /// An inter-domain stream's switch between its rings and TCP legs.
    type Switch;
    /// A connection's TCP endpoints: its legs' cookie and the peer's.
    type Tcp: Default;
    /// The link to the peer's domain.
    type Link;
}

/// `struct sockaddr_xen` (xensock.h), 16 bytes.
pub(crate) const SOCKADDR_XEN_LEN: usize = 16;
pub(crate) const PORT_ANY: u32 = u32::MAX;
pub(crate) const DOMID_ANY: u32 = u32::MAX;
pub(crate) const DOMID_SELF: u32 = 0x7FF0;

#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Addr {
    pub(crate) port: u32,
    pub(crate) domid: u32,
}

impl Addr {
    pub(crate) fn parse(addr: &[u8]) -> core::result::Result<Addr, i32> {
        // like vsock, any length short of ours is EINVAL (not EAFNOSUPPORT)
        let Some(b) = addr.get(..SOCKADDR_XEN_LEN) else {
            return Err(e::EINVAL);
        };
        let fam = u16::from_ne_bytes([b[0], b[1]]);
        if fam as i32 != sys::family() {
            return Err(e::EAFNOSUPPORT);
        }
        let flags = u16::from_ne_bytes([b[2], b[3]]);
        if flags != 0 || b[12..16] != [0, 0, 0, 0] {
            return Err(e::EINVAL);
        }
        Ok(Addr {
            port: u32::from_ne_bytes([b[4], b[5], b[6], b[7]]),
            domid: u32::from_ne_bytes([b[8], b[9], b[10], b[11]]),
        })
    }
    pub(crate) fn bytes(&self) -> [u8; SOCKADDR_XEN_LEN] {
        let mut b = [0u8; SOCKADDR_XEN_LEN];
        b[0..2].copy_from_slice(&(sys::family() as u16).to_ne_bytes());
        b[4..8].copy_from_slice(&self.port.to_ne_bytes());
        b[8..12].copy_from_slice(&self.domid.to_ne_bytes());
        b
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum State {
    Unbound,
    Bound,
    Listening,
    Connecting,
    Connected,
    Closed,
}

impl State {
    pub(crate) fn name(&self) -> &'static str {
        match self {
            State::Unbound => "UNBOUND",
            State::Bound => "BOUND",
            State::Listening => "LISTEN",
            State::Connecting => "CONNECTING",
            State::Connected => "ESTABLISHED",
            State::Closed => "CLOSED",
        }
    }
}

pub(crate) struct Inner<P: Parts> {
    pub(crate) state: State,
    pub(crate) local: Addr,
    pub(crate) peer: Addr,
    pub(crate) bound: bool,
    pub(crate) backlog: u32,
    pub(crate) accept_q: KVec<Arc<XenSock<P>>>,
    pub(crate) shut_rd: bool,
    pub(crate) shut_wr: bool,
    pub(crate) released: bool,
    /// the ring we write (owned by the peer) and the one we read
    pub(crate) tx: Option<Arc<P::Pipe>>,
    pub(crate) rx: Option<Arc<P::Pipe>>,
    /// the peer broke the protocol or reset: ECONNRESET
    pub(crate) reset: bool,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
    /// inter-domain: the link, our and the peer's connection ids
    pub(crate) link: Option<Arc<P::Link>>,
    pub(crate) conn_id: u32,
    pub(crate) peer_conn: u32,
    /// why a connect over a link failed (0: none)
    pub(crate) connect_err: i32,
    /// SOCK_SEQPACKET: messages travel as proto records (see seq_sendmsg)
    pub(crate) seqpacket: bool,
    /// a connect over a link whose ConnectRequest is not sent yet (the link
    /// was not up, or its control ring was full): the work item sends it
    pub(crate) request: Option<crate::proto::ctrl::RingGrant>,
    /// test mode: the next connect names a bogus grant in its directory
    #[cfg(afx_test_hooks)]
    pub(crate) test_bad_directory: bool,
    /// inter-domain: cookie and peer endpoint of the TCP legs
    pub(crate) tcp: P::Tcp,
    /// inter-domain stream: its switch between rings and TCP legs
    pub(crate) sw: Option<Arc<P::Switch>>,
    /// inter-domain: our one Close or Reset for this connection went out
    /// (or there is nobody to tell)
    pub(crate) end_sent: bool,
    /// inter-domain: the peer's Close or Reset for this connection arrived
    pub(crate) peer_ended: bool,
    /// inter-domain, connecting: when the connect fails with ETIMEDOUT
    /// (net::now_ms), whether anyone waits for it or not
    pub(crate) connect_deadline_ms: u64,
    /// inter-domain, accepted: the peer may not have mapped our receive
    /// ring yet (it maps it when our ConnectAccept reaches it), so a close
    /// lends the ring until the peer's Close or Reset (`link::Lent`)
    pub(crate) lends_rx: bool,
    /// a TCP program's connection this socket took over (the preload
    /// library, `XENSOCK_IOC_GRAFT`): the names it answers getsockname
    /// and getpeername with
    pub(crate) inet: Option<InetNames>,
    /// a listener that took a TCP program's listener over (the dual
    /// listener): that TCP listener, whose connections its accept hands
    /// out too
    pub(crate) tcp_listener: Option<Arc<sys::net::HeldListener>>,
    /// XENSOCK_REUSEPORT: may share its port (`Ports::may_share`)
    pub(crate) reuse_port: bool,
}

#[pin_data(PinnedDrop)]
pub(crate) struct XenSock<P: Parts> {
    pub(crate) sk: Sk,
    #[pin]
    pub(crate) inner: SpinLock<Inner<P>>,
}

impl<P: Parts> XenSock<P> {
    pub(crate) fn new(sk: Sk) -> Result<Arc<Self>> {
        Arc::pin_init(
            pin_init!(Self {
                sk,
                inner <- new_spinlock!(Inner {
                    state: State::Unbound,
                    local: Addr { port: PORT_ANY, domid: DOMID_ANY },
                    peer: Addr::default(),
                    bound: false,
                    backlog: 0,
                    accept_q: KVec::new(),
                    shut_rd: false,
                    shut_wr: false,
                    released: false,
                    tx: None,
                    rx: None,
                    reset: false,
                    bytes_in: 0,
                    bytes_out: 0,
                    link: None,
                    conn_id: 0,
                    peer_conn: 0,
                    connect_err: 0,
                    seqpacket: false,
                    request: None,
                    #[cfg(afx_test_hooks)]
                    test_bad_directory: false,
                    tcp: P::Tcp::default(),
                    sw: None,
                    end_sent: false,
                    connect_deadline_ms: 0,
                    peer_ended: false,
                    lends_rx: false,
                    inet: None,
                    tcp_listener: None,
                    reuse_port: false,
                }, "af_xen_sock"),
            }),
            GFP_KERNEL,
        )
        .inspect(|_| sys::counters::add(&sys::counters::SOCKS, 1))
    }

    /// Wakes the socket's waiters, unless the application released it.
    /// `sk` is not a counted reference: a link's table, a pipe's ends or
    /// the TCP work item can hold this XenSock after close() freed its
    /// `struct sock` (an oops in the work item's wake after a restore).
    /// `destroy` sets `released` under `inner`
    /// before the sock goes, and this wakes under `inner`.
    pub(crate) fn wake_live(&self, mask: u32) {
        let i = self.inner.lock();
        if !i.released {
            self.sk.wake(mask);
        }
    }
}

#[pinned_drop]
impl<P: Parts> PinnedDrop for XenSock<P> {
    fn drop(self: Pin<&mut Self>) {
        sys::counters::add(&sys::counters::SOCKS, -1);
    }
}

pub(crate) const AF_INET: u16 = 2;
pub(crate) const AF_INET6: u16 = 10;
pub(crate) const SOCKADDR_IN_LEN: usize = 16;
pub(crate) const SOCKADDR_IN6_LEN: usize = 28;

/// The AF_INET or AF_INET6 names a taken-over connection answers
/// getsockname and getpeername with: the peer the program connected to,
/// and this guest's address (the TCP leg's) with the AF_XEN port.
#[derive(Clone, Copy)]
pub(crate) struct InetNames {
    family: u16,
    local: [u8; SOCKADDR_IN6_LEN],
    peer: [u8; SOCKADDR_IN6_LEN],
}

impl InetNames {
    /// The names of a connection to `peer` (a sockaddr_in or
    /// sockaddr_in6 of `family`), the local one not known yet.
    pub(crate) fn connected_to(family: u16, peer: [u8; SOCKADDR_IN6_LEN]) -> InetNames {
        InetNames {
            family,
            local: [0; SOCKADDR_IN6_LEN],
            peer,
        }
    }
    /// These names with the local one made of `ip` (none: unspecified)
    /// and `port` (an AF_XEN port; 0 if it does not fit a TCP port).
    pub(crate) fn with_local(mut self, ip: Option<[u8; 4]>, port: u32) -> InetNames {
        self.local = sockaddr(self.family, ip, port);
        self
    }
    /// A dual listener's names: its TCP listener's own (`local`, a
    /// sockaddr_in or sockaddr_in6).
    pub(crate) fn listening(family: u16, local: &[u8]) -> InetNames {
        let mut l = [0u8; SOCKADDR_IN6_LEN];
        let n = local.len().min(l.len());
        l[..n].copy_from_slice(&local[..n]);
        InetNames {
            family,
            local: l,
            peer: [0; SOCKADDR_IN6_LEN],
        }
    }
    /// The names of a connection this dual listener accepted from a
    /// co-resident client: the listener's local name, and the client's
    /// guest address (none: unspecified) with its port.
    pub(crate) fn accepted(&self, ip: Option<[u8; 4]>, port: u32) -> InetNames {
        InetNames {
            peer: sockaddr(self.family, ip, port),
            ..*self
        }
    }
    pub(crate) fn family(&self) -> u16 {
        self.family
    }
    fn len(&self) -> usize {
        if self.family == AF_INET {
            SOCKADDR_IN_LEN
        } else {
            SOCKADDR_IN6_LEN
        }
    }
    pub(crate) fn local(&self) -> &[u8] {
        &self.local[..self.len()]
    }
    pub(crate) fn peer(&self) -> &[u8] {
        &self.peer[..self.len()]
    }
    /// The peer (`peer`) or the local name as `address:port` (IPv6 as
    /// `[address]:port`).
    pub(crate) fn display(&self, peer: bool) -> NameDisplay<'_> {
        NameDisplay(self, peer)
    }
}

/// A sockaddr_in (`family` AF_INET) or sockaddr_in6 of IPv4 address `ip`
/// (none: unspecified; IPv4-mapped in an AF_INET6 one, as a dual-stack
/// socket shows it) and `port` (0 if it does not fit a TCP port).
fn sockaddr(family: u16, ip: Option<[u8; 4]>, port: u32) -> [u8; SOCKADDR_IN6_LEN] {
    let mut a = [0u8; SOCKADDR_IN6_LEN];
    a[..2].copy_from_slice(&family.to_ne_bytes());
    a[2..4].copy_from_slice(&u16::try_from(port).unwrap_or(0).to_be_bytes());
    if let Some(ip) = ip {
        if family == AF_INET {
            a[4..8].copy_from_slice(&ip);
        } else {
            a[18..20].copy_from_slice(&[0xff, 0xff]);
            a[20..24].copy_from_slice(&ip);
        }
    }
    a
}

pub(crate) struct NameDisplay<'a>(&'a InetNames, bool);

impl core::fmt::Display for NameDisplay<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        let p = if self.1 { &self.0.peer } else { &self.0.local };
        let port = u16::from_be_bytes([p[2], p[3]]);
        if self.0.family == AF_INET {
            let ip = core::net::Ipv4Addr::new(p[4], p[5], p[6], p[7]);
            write!(f, "{}:{}", ip, port)
        } else {
            let mut a = [0u8; 16];
            a.copy_from_slice(&p[8..24]);
            write!(f, "[{}]:{}", core::net::Ipv6Addr::from(a), port)
        }
    }
}
