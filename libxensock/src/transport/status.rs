// SPDX-License-Identifier: MIT OR Apache-2.0
//! What [`Transport::status`] reports: links, connections and their
//! carriers, counters.

use super::*;

/// A link, as reported by [`Transport::status`].
#[derive(Debug, Clone)]
pub struct LinkStatus {
    /// The peer domain.
    pub peer: DomId,
    /// Our link generation (XenStore `generation`).
    pub generation: u32,
    /// The peer's generation, once attached.
    pub peer_generation: Option<u32>,
    /// Both control rings are mapped.
    pub up: bool,
    /// Connections on the link.
    pub connections: usize,
    /// Control frames waiting for ring space.
    pub pending_frames: usize,
    /// Both sides keep rings across connections (`feature-ring-reuse`).
    pub ring_reuse: bool,
    /// Our idle receive rings, kept granted for the next connections.
    pub pooled_rings: usize,
    /// Our receive rings of closed connections the peer may still write.
    pub lent_rings: usize,
    /// Peer rings we keep mapped for the next connections.
    pub kept_mappings: usize,
}

/// A connection, as reported by [`Transport::status`].
#[derive(Debug, Clone)]
pub struct ConnStatus {
    /// Local connection id.
    pub id: u32,
    /// Local address.
    pub local: SockAddrXen,
    /// Peer address.
    pub peer: SockAddrXen,
    /// Phase.
    pub phase: ConnPhase,
    /// Bytes waiting in the receive ring / receive ring size.
    pub rx_fill: (u32, u32),
    /// Bytes unconsumed in the send ring / send ring size.
    pub tx_fill: (u32, u32),
    /// Bytes read.
    pub bytes_in: u64,
    /// Bytes written.
    pub bytes_out: u64,
    /// Which carrier moves the bytes.
    pub carrier: Carrier,
}

impl Status {
    /// The status as records for programs (`xensock status --json`): one
    /// line per record, `transport`, `legs`, `link` or `connection`, then
    /// `key=value` fields; a value's spaces, `%` and newlines are written
    /// `%20`, `%25` and `%0A` ([`decode_field`]).
    pub fn render_fields(&self) -> String {
        use std::fmt::Write;
        fn enc(v: impl std::fmt::Display) -> String {
            v.to_string()
                .replace('%', "%25")
                .replace(' ', "%20")
                .replace('\n', "%0A")
        }
        let mut o = String::new();
        let _ = writeln!(
            o,
            "transport domid={} backend={} links={} connections={} listeners={} resets_sent={} resets_received={} ring_errors={} links_lost={} refused={}",
            self.domid,
            self.backend.token(),
            self.links.len(),
            self.connections.len(),
            self.listeners.len(),
            self.resets_sent,
            self.resets_received,
            self.ring_errors,
            self.links_lost,
            self.rejected
        );
        if let Some(ep) = self.tcp_endpoint {
            let l = &self.legs;
            let _ = writeln!(
                o,
                "legs endpoint={ep} accepted={} bad_cookie={} unknown_conn={} malformed={} timed_out={}",
                l.accepted, l.bad_cookie, l.unknown_conn, l.malformed, l.timed_out
            );
        }
        for l in &self.links {
            let _ = writeln!(
                o,
                "link peer={} up={} connections={} pending_frames={} ring_reuse={} pooled_rings={} lent_rings={} kept_mappings={}",
                l.peer, l.up, l.connections, l.pending_frames, l.ring_reuse, l.pooled_rings, l.lent_rings, l.kept_mappings
            );
        }
        for c in &self.connections {
            let _ = write!(
                o,
                "connection id={} local={} peer={} phase={} rx_fill={} rx_size={} tx_fill={} tx_size={} bytes_in={} bytes_out={}",
                c.id,
                enc(c.local),
                enc(c.peer),
                enc(format!("{:?}", c.phase)),
                c.rx_fill.0,
                c.rx_fill.1,
                c.tx_fill.0,
                c.tx_fill.1,
                c.bytes_in,
                c.bytes_out
            );
            match &c.carrier {
                Carrier::Ring => {
                    let _ = writeln!(o, " carrier=ring");
                }
                Carrier::Switched {
                    tx,
                    rx,
                    tx_to_tcp,
                    tx_to_ring,
                    rx_to_ring,
                    legs_up,
                    failure,
                } => {
                    let _ = write!(
                        o,
                        " carrier=switched tx={tx} rx={rx} tx_to_tcp={tx_to_tcp} tx_to_ring={tx_to_ring} rx_to_ring={rx_to_ring} legs_up={legs_up}"
                    );
                    if let Some(why) = failure {
                        let _ = write!(o, " failure={}", enc(why));
                    }
                    let _ = writeln!(o);
                }
            }
        }
        o
    }

    /// The status as `xensock status` prints it.
    pub fn render(&self) -> String {
        use std::fmt::Write;
        let mut o = String::new();
        let _ = writeln!(
            o,
            "domain {} ({:?}): {} links, {} connections, {} listeners; resets sent {} received {}; ring errors {}; links lost {}; refused {}",
            self.domid,
            self.backend,
            self.links.len(),
            self.connections.len(),
            self.listeners.len(),
            self.resets_sent,
            self.resets_received,
            self.ring_errors,
            self.links_lost,
            self.rejected
        );
        match self.tcp_endpoint {
            Some(ep) => {
                let l = &self.legs;
                let _ = writeln!(
                    o,
                    "  TCP carrier at {ep}: legs accepted {}, refused: bad cookie {}, unknown connection {}, malformed {}, timed out {}",
                    l.accepted, l.bad_cookie, l.unknown_conn, l.malformed, l.timed_out
                );
            }
            None => {
                let _ = writeln!(o, "  no TCP carrier (connections cannot survive a move)");
            }
        }
        for l in &self.links {
            let _ = writeln!(
                o,
                "  link to domain {}: {}, {} connections, {} frames queued; ring reuse {}: {} rings pooled, {} lent, {} peer rings kept mapped",
                l.peer,
                if l.up { "up" } else { "offered" },
                l.connections,
                l.pending_frames,
                if l.ring_reuse { "on" } else { "off" },
                l.pooled_rings,
                l.lent_rings,
                l.kept_mappings
            );
        }
        for c in &self.connections {
            let _ = writeln!(
                o,
                "  {} -> {} {:?} rx {}/{} tx {}/{} in {} out {}; carrier: {}",
                c.local,
                c.peer,
                c.phase,
                c.rx_fill.0,
                c.rx_fill.1,
                c.tx_fill.0,
                c.tx_fill.1,
                c.bytes_in,
                c.bytes_out,
                c.carrier
            );
        }
        o
    }
}

/// A connection's carrier, as [`Transport::status`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Carrier {
    /// The transport's ring fast path (never switched).
    Ring,
    /// The connection's switch carries it (it left its first rings at
    /// least once).
    Switched {
        /// Sending direction: `ring`, `frozen` or `tcp`.
        tx: &'static str,
        /// Receiving direction: `ring`, `draining`, `tcp` or `offered`.
        rx: &'static str,
        /// Times our sending direction moved to TCP.
        tx_to_tcp: u64,
        /// Times our sending direction moved onto a new ring.
        tx_to_ring: u64,
        /// Times our receiving direction moved onto a new ring.
        rx_to_ring: u64,
        /// Both TCP legs are up.
        legs_up: bool,
        /// Why the connection failed, if it did.
        failure: Option<String>,
    },
}

impl Carrier {
    /// Carrier switches so far (both directions).
    pub fn switches(&self) -> u64 {
        match self {
            Carrier::Ring => 0,
            Carrier::Switched {
                tx_to_tcp,
                tx_to_ring,
                rx_to_ring,
                ..
            } => tx_to_tcp + tx_to_ring + rx_to_ring,
        }
    }
}

impl std::fmt::Display for Carrier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Carrier::Ring => f.write_str("ring"),
            Carrier::Switched {
                tx,
                rx,
                tx_to_tcp,
                tx_to_ring,
                rx_to_ring,
                legs_up,
                failure,
            } => {
                write!(
                    f,
                    "tx {tx} rx {rx}, switches: tx to tcp {tx_to_tcp}, tx to ring {tx_to_ring}, rx to ring {rx_to_ring}; legs {}",
                    if *legs_up { "up" } else { "down" }
                )?;
                if let Some(why) = failure {
                    write!(f, "; failed: {why}")?;
                }
                Ok(())
            }
        }
    }
}

/// The TCP legs refused or accepted by this transport's leg listener.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LegCounters {
    /// Legs authenticated and handed to their connection.
    pub accepted: u64,
    /// Refused: a registered connection, the wrong cookie.
    pub bad_cookie: u64,
    /// Refused: no such connection (by the hello deadline).
    pub unknown_conn: u64,
    /// Refused: not a well-formed hello.
    pub malformed: u64,
    /// Refused: no hello in time (or too many unauthenticated legs).
    pub timed_out: u64,
}

/// What [`Transport::status`] returns.
#[derive(Debug, Clone)]
pub struct Status {
    /// This domain.
    pub domid: DomId,
    /// Backend in use.
    pub backend: BackendKind,
    /// Links.
    pub links: Vec<LinkStatus>,
    /// Connections.
    pub connections: Vec<ConnStatus>,
    /// Listening ports.
    pub listeners: Vec<u32>,
    /// Reset frames sent.
    pub resets_sent: u64,
    /// Reset frames received.
    pub resets_received: u64,
    /// Ring violations by peers.
    pub ring_errors: u64,
    /// Links lost (peer died or left).
    pub links_lost: u64,
    /// Connection requests refused.
    pub rejected: u64,
    /// XenStore paths the transport watches (sorted).
    pub watched: Vec<String>,
    /// Where peers reach our TCP carrier (`None`: no TCP fallback).
    pub tcp_endpoint: Option<std::net::SocketAddr>,
    /// Legs our leg listener took or refused.
    pub legs: LegCounters,
}

impl Inner {
    pub(super) fn status(&self) -> Status {
        let st = self.state();
        let links = st
            .links
            .values()
            .map(|l| LinkStatus {
                peer: l.peer,
                generation: l.gen,
                peer_generation: l.peer_half.map(|h| h.generation),
                up: l.tx.is_some(),
                connections: l.conns.len(),
                pending_frames: l.pending.len(),
                ring_reuse: l.reuse,
                pooled_rings: l.rings.pool.values().map(Vec::len).sum(),
                lent_rings: l.rings.lent.len(),
                kept_mappings: l.rings.mapped.len(),
            })
            .collect();
        let mut connections: Vec<ConnStatus> = st
            .conns
            .values()
            .map(|c| {
                let mut moved = None;
                let carrier = match c.switch() {
                    None => Carrier::Ring,
                    Some(e) => {
                        use xensock_proto::switch::{RxState, TxState};
                        let s = e.status();
                        moved = Some((s.delivered, s.sent));
                        Carrier::Switched {
                            tx: match s.tx {
                                TxState::Ring { .. } => "ring",
                                TxState::Frozen { .. } => "frozen",
                                TxState::Tcp => "tcp",
                            },
                            rx: match s.rx {
                                RxState::Ring { .. } => "ring",
                                RxState::Tcp => "tcp",
                                _ => "offered",
                            },
                            tx_to_tcp: s.tx_to_tcp,
                            tx_to_ring: s.tx_to_ring,
                            rx_to_ring: s.rx_to_ring,
                            legs_up: s.legs_up,
                            failure: s.failure,
                        }
                    }
                };
                let mut io = c.io();
                let rx_fill = io
                    .rx
                    .as_ref()
                    .map_or((0, 0), |r| (r.c.readable().unwrap_or(0), r.c.capacity()));
                let tx_fill = io
                    .tx
                    .as_mut()
                    .map_or((0, 0), |t| (t.p.unconsumed().unwrap_or(0), t.p.capacity()));
                ConnStatus {
                    id: c.id,
                    local: SockAddrXen::new(u32::from(self.domid()), c.local_port),
                    peer: SockAddrXen::new(u32::from(c.peer()), c.peer_port),
                    phase: io.phase,
                    rx_fill,
                    tx_fill,
                    bytes_in: moved.map_or(io.bytes_in, |m| m.0),
                    bytes_out: moved.map_or(io.bytes_out, |m| m.1),
                    carrier,
                }
            })
            .collect();
        connections.sort_by_key(|c| c.id);
        let mut listeners: Vec<u32> = st.listeners.keys().copied().collect();
        listeners.sort_unstable();
        Status {
            domid: self.domid(),
            backend: self.kind,
            links,
            connections,
            listeners,
            resets_sent: self.counters.resets_sent.load(Ordering::Relaxed),
            resets_received: self.counters.resets_received.load(Ordering::Relaxed),
            ring_errors: self.counters.ring_errors.load(Ordering::Relaxed),
            links_lost: self.counters.links_lost.load(Ordering::Relaxed),
            rejected: self.counters.rejected.load(Ordering::Relaxed),
            watched: {
                let mut v: Vec<String> = lock(&self.watches).by_path.keys().cloned().collect();
                v.sort();
                v
            },
            tcp_endpoint: socket_addr_of(&self.leg_endpoint),
            legs: self.legs.as_ref().map_or_else(LegCounters::default, |l| {
                let LegStats {
                    accepted,
                    bad_cookie,
                    unknown_conn,
                    malformed,
                    timed_out,
                } = l.stats();
                LegCounters {
                    accepted,
                    bad_cookie,
                    unknown_conn,
                    malformed,
                    timed_out,
                }
            }),
        }
    }
}

/// A field's value as [`Status::render_fields`] wrote it, decoded.
pub fn decode_field(v: &str) -> String {
    v.replace("%20", " ")
        .replace("%0A", "\n")
        .replace("%25", "%")
}
