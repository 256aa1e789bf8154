// SPDX-License-Identifier: GPL-2.0
//! How a connection's bytes travel, behind one interface: [`Carrier`].
//!
//! - `ring`: one direction over a shared-memory ring (`Pipe`): our granted
//!   pages, the peer's mapped pages, or local memory for loopback; and
//!   [`rings::Rings`], the carrier of a connection that only ever uses its
//!   two rings (loopback, and every SOCK_SEQPACKET connection).
//! - `leg`: the TCP legs that carry a connection while its peer is on
//!   another host, and their listener.
//! - `switch`: [`switch::Switched`], the carrier of an inter-domain stream:
//!   each step goes to its rings or to its TCP legs,
//!   whichever carries that direction now, and the switch moves between
//!   them without losing, duplicating or reordering a byte.
//!
//! The socket core (`socket/`) holds the semantics: states, flags,
//! timeouts, signals, SO_RCVLOWAT, MSG_WAITALL and MSG_PEEK, partial
//! counts, EPIPE and SIGPIPE. A carrier moves one step of bytes at a time,
//! says why it could not, and knows what a waiter must wait for.

pub(crate) mod leg;
pub(crate) mod records;
pub(crate) mod ring;
pub(crate) mod rings;
pub(crate) mod setup;
pub(crate) mod show;
pub(crate) mod switch;

use crate::sock;
use crate::sys::Msg;
use kernel::ffi::c_long;
use kernel::sync::Arc;

/// What the link tells a connection's carriers, which the socket core
/// passes on: the link is up or back after a resume, a peer's half is gone,
/// a moved peer was followed to its new domain, a ring offer from the peer
/// or from a domain that may be the moved peer.
pub(crate) use switch::{
    followed_peer, link_up, on_candidate_offer, on_ring_offer, peer_gone, resumed,
};

/// A connection's receive ring as the link holds it (lent after close).
pub(crate) type Ring = Arc<ring::Pipe>;

/// The parts of a socket (`sock::Parts`) that the carriers and the link
/// define.
pub(crate) struct Carriers;

impl sock::Parts for Carriers {
    type Pipe = ring::Pipe;
    type Switch = switch::Switch;
    type Tcp = leg::ConnTcp;
    type Link = Link;
}

/// The module's socket: `sock::XenSock` with this module's rings, switch,
/// TCP endpoints and link.
pub(crate) type XenSock = sock::XenSock<Carriers>;
/// What a socket's lock guards.
pub(crate) type Inner = sock::Inner<Carriers>;
/// A link whose connections are the module's sockets.
pub(crate) type Link = crate::link::Link<XenSock>;

/// What a carrier asks of the socket core above it, which implements it
/// on [`XenSock`] (`socket/for_carriers.rs`).
pub(crate) trait SocketCore {
    /// Resets a connection whose peer broke the protocol; ECONNRESET.
    fn conn_reset(&self, why: impl core::fmt::Display) -> i32;
    /// The connected socket whose connection id is `conn_id`, and its TCP
    /// legs' cookie.
    fn find_connected(conn_id: u32) -> Option<(Arc<XenSock>, u64)>;
}

/// What one send step did.
pub(crate) enum Sent {
    /// this many bytes left the user's buffer and are on their way
    Bytes(usize),
    /// no room now: wait (`Carrier::wait_writable`) or EAGAIN
    Full,
    /// the peer reads no more: EPIPE
    Closed,
    /// the connection is reset: ECONNRESET
    Reset,
    /// the user's buffer faulted before a byte moved: EFAULT
    Fault,
    /// the connection cannot carry bytes (this errno)
    Failed(i32),
}

/// What one receive step did.
pub(crate) enum Received {
    /// this many bytes (at least one) went to the user, consumed unless
    /// peeking; `short`: the user's buffer faulted part way, stop here
    Bytes { n: usize, short: bool },
    /// nothing readable now; `eof`: nor ever again (the peer's FIN)
    Empty { eof: bool },
    /// the connection is reset (unread bytes are dropped, as TCP's RST)
    Reset,
    /// the user's buffer faulted before a byte moved
    Fault,
    /// the connection cannot carry bytes (this errno)
    Failed(i32),
}

/// What poll reports of a connection's carrier; the socket adds its own
/// shutdown and reset state.
#[derive(Default)]
pub(crate) struct Readiness {
    /// SO_RCVLOWAT bytes (or a whole record) are there to read
    pub(crate) readable: bool,
    /// the peer's FIN arrived
    pub(crate) read_hup: bool,
    /// a write would move a byte
    pub(crate) writable: bool,
    /// the peer reads no more
    pub(crate) write_hup: bool,
    /// the peer reset the connection, or broke the ring protocol
    pub(crate) error: bool,
}

/// One connection's way of moving bytes, as the socket core uses it.
///
/// A value is a cursor for one call (sendmsg, recvmsg, poll, ioctl): it
/// follows the connection's carrier as it changes during the call, so a
/// step never uses a ring the connection left. The waits sleep on the
/// socket (`Sk::wait`), and end early when the socket is reset or shut
/// down for reading, or when the carrier changes under the waiter.
pub(crate) trait Carrier {
    /// Moves up to `left` bytes of `msg` (MSG_DONTWAIT: `nonblock`).
    fn send(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, nonblock: bool) -> Sent;
    /// After `Sent::Full`: sleeps until a send step could move a byte,
    /// `timeo` running down. Err: EAGAIN (timed out) or a signal's errno.
    /// Its first look asks to be woken when there is room, so a
    /// non-blocking caller (`timeo` 0) calls it too before its EAGAIN: an
    /// edge-triggered poller is woken by nothing else.
    fn wait_writable(&mut self, xs: &XenSock, timeo: &mut c_long) -> Result<(), i32>;
    /// Moves up to `left` readable bytes into `msg` (`peek`: MSG_PEEK).
    fn recv(&mut self, xs: &XenSock, msg: &mut Msg, left: usize, peek: bool) -> Received;
    /// After `Received::Empty`: sleeps until bytes, an end, or a reset.
    fn wait_readable(&mut self, xs: &XenSock, timeo: &mut c_long) -> Result<(), i32>;
    /// For poll: asks to be woken by the next change first, then looks.
    fn readiness(&mut self, xs: &XenSock, lowat: usize) -> Readiness;
    /// SIOCINQ: bytes a read would return now.
    fn readable_bytes(&self, xs: &XenSock) -> usize;
    /// SIOCOUTQ: bytes written but not yet delivered (a ring is the peer's
    /// receive buffer, so only bytes queued for TCP count).
    fn unsent_bytes(&self) -> usize;
    /// shutdown(): no more writes (FIN after what is sent) and/or reads.
    fn shutdown(&mut self, xs: &XenSock, read: bool, write: bool);
    /// The connection is reset: the peer sees RESET on both rings (and on
    /// TCP), unread bytes are dropped.
    fn reset(&mut self, xs: &XenSock);
    /// close(): the socket lets go of the connection. `abort`: SO_LINGER
    /// 0 (reset, as TCP's RST); otherwise CLOSED for the peer's writes and
    /// FIN after what we sent, which is still delivered. Returns the ring
    /// we read, which an accepted connection may have to lend to the peer
    /// (it may not have mapped it yet).
    fn release(&mut self, xs: &XenSock, abort: bool) -> Option<kernel::sync::Arc<ring::Pipe>>;
}

/// The carrier of a connection, chosen from what the socket holds.
pub(crate) enum Stream {
    Rings(rings::Rings),
    Switched(switch::Switched),
}

impl Stream {
    /// The carrier of a connection whose rings are `tx` (we write) and
    /// `rx` (we read), switched by `sw` if it is an inter-domain stream.
    pub(crate) fn new(
        tx: Option<kernel::sync::Arc<ring::Pipe>>,
        rx: Option<kernel::sync::Arc<ring::Pipe>>,
        sw: Option<kernel::sync::Arc<switch::Switch>>,
    ) -> Stream {
        match sw {
            None => Stream::Rings(rings::Rings::new(tx, rx)),
            Some(sw) => Stream::Switched(switch::Switched::new(sw, tx, rx)),
        }
    }

    pub(crate) fn carrier(&mut self) -> &mut dyn Carrier {
        match self {
            Stream::Rings(r) => r,
            Stream::Switched(s) => s,
        }
    }
}
