// SPDX-License-Identifier: GPL-2.0
//! What `/proc/net/af_xen` and `/proc/net/af_xen_tcp` show of a
//! connection's carriers; the socket core writes the rest of the line.

use super::ring::Pipe;
use super::switch::Switch;
use core::sync::atomic::Ordering;
use kernel::sync::Arc;

/// A connection's carrier columns of `/proc/net/af_xen`.
pub(crate) struct Shown {
    /// the receive ring's size and the bytes in it
    pub(crate) rx_size: u32,
    pub(crate) rx_fill: u32,
    /// the ring we write: its size and the bytes the peer has not taken
    pub(crate) tx_size: u32,
    pub(crate) tx_fill: u32,
    /// what carries it now: `ring-xen`, `ring-local`, `draining`, `tcp`,
    /// `upgrading`, `reset` or `-`
    pub(crate) name: &'static str,
    /// the switch's moves to TCP and back to rings
    pub(crate) to_tcp: u32,
    pub(crate) to_ring: u32,
}

/// The carrier columns of a connection with these rings and switch.
pub(crate) fn show(
    tx: Option<&Arc<Pipe>>,
    rx: Option<&Arc<Pipe>>,
    sw: Option<&Arc<Switch>>,
    reset: bool,
) -> Shown {
    use crate::proto::switch::Phase;
    let (rx_size, rx_fill) = match rx {
        Some(r) => (r.capacity(), r.rx_state().map(|(n, _)| n).unwrap_or(0)),
        None => (0, 0),
    };
    let (tx_size, tx_fill) = match tx {
        Some(t) => (
            t.capacity(),
            t.tx_state()
                .map(|(free, _)| t.capacity() - free.min(t.capacity()))
                .unwrap_or(0),
        ),
        None => (0, 0),
    };
    let phase = sw.filter(|s| s.is_active()).map(|s| s.phase());
    let name = if reset {
        "reset"
    } else if let Some(p) = phase {
        match p {
            Phase::Ring => "ring-xen",
            Phase::Draining => "draining",
            Phase::Tcp => "tcp",
            Phase::Upgrading => "upgrading",
        }
    } else if tx.is_some_and(|t| t.is_remote()) {
        "ring-xen"
    } else if tx.is_some() {
        "ring-local"
    } else {
        "-"
    };
    let (to_tcp, to_ring) = sw
        .map(|s| {
            (
                s.to_tcp.load(Ordering::Relaxed),
                s.to_ring.load(Ordering::Relaxed),
            )
        })
        .unwrap_or((0, 0));
    Shown {
        rx_size,
        rx_fill,
        tx_size,
        tx_fill,
        name,
        to_tcp,
        to_ring,
    }
}

/// A connection's switch, held for its `/proc/net/af_xen_tcp` lines.
pub(crate) type Shows = Arc<Switch>;

/// The `/proc/net/af_xen_tcp` lines of connection `conn`'s switch.
pub(crate) fn show_tcp(conn: u32, sw: &Shows, seq: &mut crate::sys::Seq) {
    super::switch::tcp_show(conn, sw, seq);
}
