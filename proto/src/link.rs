// SPDX-License-Identifier: MIT OR Apache-2.0
//! The link handshake in XenStore (`docs/protocol.md` 6.1): where each
//! domain's half of a link lives, its node names and states, and what a
//! half read back from XenStore means. Both hosts (the kernel module and
//! the user-space transport) decide with these.

use core::fmt;

use super::ctrl::{decode_header, Channel, HEADER_LEN, MAX_CONTROL_FRAME};
use super::ring::{Consumer, Producer, RingError, RingMemory};

/// Whether a peer's [`super::store::peer_node::ADDRS`] value lists `ip` (an
/// IPv4-mapped IPv6 address matches its IPv4 address). Entries that are
/// not addresses are skipped.
pub fn addrs_list(addrs: &[u8], ip: core::net::IpAddr) -> bool {
    let ip = match ip {
        core::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, core::net::IpAddr::V4),
        v4 => v4,
    };
    addrs
        .split(|b| b.is_ascii_whitespace())
        .filter_map(|w| core::str::from_utf8(w).ok())
        .filter_map(|w| w.parse::<core::net::IpAddr>().ok())
        .any(|a| a == ip)
}

/// The names of the values in a half's directory.
pub mod node {
    /// The half's protocol version (`"1"`).
    pub const VERSION: &str = "version";
    /// Grant reference of the owner's control receive page.
    pub const RING_REF: &str = "ring-ref";
    /// The port the owner allocated unbound for the peer.
    pub const EVENT_CHANNEL: &str = "event-channel";
    /// Random non-zero u32 naming this instance of the half (optional).
    pub const GENERATION: &str = "generation";
    /// The peer's generation this half answered, 0 when it offered first.
    pub const PEER_GENERATION: &str = "peer-generation";
    /// `1`: the owner keeps data rings across connections (6.6).
    pub const FEATURE_RING_REUSE: &str = "feature-ring-reuse";
    /// The half's [`super::LinkState`].
    pub const STATE: &str = "state";
}

/// The version a half writes in [`node::VERSION`].
pub const LINK_VERSION: &str = "1";

/// A half's `state` (Xenbus states, as split drivers use them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// Being set up.
    Initialising,
    /// Waiting for the other end.
    InitWait,
    /// Advertised: the page is granted and the port allocated.
    Initialised,
    /// The owner mapped the peer's page and bound its port.
    Connected,
    /// Going away.
    Closing,
    /// Withdrawn (in a directory dom0 made, which the owner does not remove).
    Closed,
}

impl LinkState {
    /// The state a `state` value names, if any.
    pub fn from_value(v: u32) -> Option<LinkState> {
        Some(match v {
            1 => LinkState::Initialising,
            2 => LinkState::InitWait,
            3 => LinkState::Initialised,
            4 => LinkState::Connected,
            5 => LinkState::Closing,
            6 => LinkState::Closed,
            _ => return None,
        })
    }

    /// The value written to `state`.
    pub fn value(self) -> u32 {
        match self {
            LinkState::Initialising => 1,
            LinkState::InitWait => 2,
            LinkState::Initialised => 3,
            LinkState::Connected => 4,
            LinkState::Closing => 5,
            LinkState::Closed => 6,
        }
    }

    /// The value as XenStore holds it.
    pub fn as_str(self) -> &'static str {
        match self {
            LinkState::Initialising => "1",
            LinkState::InitWait => "2",
            LinkState::Initialised => "3",
            LinkState::Connected => "4",
            LinkState::Closing => "5",
            LinkState::Closed => "6",
        }
    }

    /// Whether a half in this state can be attached to: advertised or
    /// connected.
    pub fn is_offered(self) -> bool {
        matches!(self, LinkState::Initialised | LinkState::Connected)
    }
}

/// The absolute path of `owner`'s half of its link with `peer`:
/// `/local/domain/<owner>/data/xensock/link/<peer>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HalfPath {
    /// The domain whose home holds the half.
    pub owner: u32,
    /// The other end of the link.
    pub peer: u32,
}

impl fmt::Display for HalfPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            super::store::InHome {
                domid: self.owner,
                rel: super::store::LINK_DIR
            },
            self.peer
        )
    }
}

/// A peer's half as read back, each value `None` when missing or not a
/// number.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HalfValues {
    /// [`node::RING_REF`].
    pub ring_ref: Option<u32>,
    /// [`node::EVENT_CHANNEL`].
    pub event_channel: Option<u32>,
    /// [`node::STATE`].
    pub state: Option<u32>,
    /// [`node::GENERATION`].
    pub generation: Option<u32>,
    /// [`node::PEER_GENERATION`].
    pub peer_generation: Option<u32>,
    /// [`node::FEATURE_RING_REUSE`].
    pub ring_reuse: Option<u32>,
}

/// A peer's half that can be attached to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHalf {
    /// Its generation: written, or derived from its ring-ref and port for
    /// a host that writes none (a restart changes those).
    pub generation: u32,
    /// Whether the half wrote its generation. A derived one does not name
    /// an instance of the half: the kernel module keeps its control page
    /// (and so its ring-ref and port) when it takes its half back and
    /// offers it again, so a derived generation seen dead can come back
    /// alive.
    pub generation_written: bool,
    /// Its control page's grant reference.
    pub ring_ref: u32,
    /// Its port, for us to bind.
    pub event_channel: u32,
    /// Our generation it answered (0: it offered first).
    pub peer_generation: u32,
    /// It keeps data rings across connections.
    pub ring_reuse: bool,
}

impl HalfValues {
    /// The half, if it is offered or connected and complete.
    pub fn offered(&self) -> Option<PeerHalf> {
        let (ring_ref, event_channel) = (self.ring_ref?, self.event_channel?);
        if !LinkState::from_value(self.state?).is_some_and(LinkState::is_offered) {
            return None;
        }
        Some(PeerHalf {
            generation: self
                .generation
                .unwrap_or_else(|| derived_generation(ring_ref, event_channel)),
            generation_written: self.generation.is_some(),
            ring_ref,
            event_channel,
            peer_generation: self.peer_generation.unwrap_or(0),
            ring_reuse: self.ring_reuse == Some(1),
        })
    }

    /// Whether the half is kept by a live user-space transport: only it
    /// writes a generation, and it is not withdrawn. (The kernel module
    /// refuses to load beside one: both would own the domain's halves.)
    pub fn held_by_user_space(&self) -> bool {
        self.generation.is_some()
            && self.state.and_then(LinkState::from_value).is_some_and(|s| {
                matches!(
                    s,
                    LinkState::Initialising
                        | LinkState::InitWait
                        | LinkState::Initialised
                        | LinkState::Connected
                )
            })
    }
}

/// Our producer on a peer's control ring, once we attached to its half.
///
/// A half outlives the other side's links: the kernel module keeps its
/// control page (and the consumer position in it) while the other guest's
/// processes come and go, each with its own link. A producer that started
/// at 0 over a consumer standing at N would find the ring overrun at its
/// first frame; it goes on from where the consumer stands instead (a fresh
/// ring's consumer stands at 0).
pub fn control_producer<M: RingMemory>(ring: M) -> Producer<M> {
    Producer::resume_at_consumer(ring)
}

/// What taking the next frame off a link's control ring gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlFrame {
    /// Less than a whole frame is readable: wait for the peer's kick.
    Incomplete,
    /// A whole frame of this many bytes, copied out and consumed. Its body
    /// may still not decode ([`super::ctrl::decode`]): that frame alone is
    /// dropped, the stream's framing is intact.
    Whole(usize),
    /// A header that does not decode, or names a frame longer than any
    /// control frame: the framing is lost. This many bytes (all that were
    /// readable) were dropped; a producer publishes whole frames, so the
    /// next frame starts where the producer stands. The link stays up: a
    /// peer that writes garbage loses only its own frames.
    Garbage(u32),
}

/// Takes the next control frame off our receive ring into `buf`.
///
/// An `Err` is a ring whose producer index is corrupt (more readable than
/// the ring holds): nothing can be read from it again, and the host takes
/// the link down, as when the peer goes (its connections on TCP legs go
/// on there, the others end).
pub fn take_control_frame<M: RingMemory>(
    rx: &mut Consumer<M>,
    buf: &mut [u8; MAX_CONTROL_FRAME],
) -> Result<ControlFrame, RingError> {
    let readable = rx.readable()?;
    if (readable as usize) < HEADER_LEN {
        return Ok(ControlFrame::Incomplete);
    }
    // copied once into `buf`, validated there
    rx.peek(&mut buf[..HEADER_LEN])?;
    let len = match decode_header(&buf[..HEADER_LEN], Channel::Link) {
        Ok(h) if h.frame_len() <= MAX_CONTROL_FRAME => h.frame_len(),
        _ => return Ok(ControlFrame::Garbage(rx.skip(readable)?)),
    };
    if (readable as usize) < len {
        return Ok(ControlFrame::Incomplete);
    }
    rx.peek(&mut buf[..len])?;
    rx.skip(len as u32)?;
    Ok(ControlFrame::Whole(len))
}

/// The generation of a half that writes none, from its ring-ref and port.
fn derived_generation(ring_ref: u32, event_channel: u32) -> u32 {
    (ring_ref.rotate_left(16) ^ event_channel ^ 0x5853_0000) | 1
}

#[cfg(test)]
#[allow(unsafe_code)] // tests build rings over their own buffers
mod tests {
    use super::*;
    use crate::ctrl::{decode, Message};
    use crate::layout::{RingGeometry, RingIdentity, LINK_RING_MAGIC};
    use crate::mem::RawRing;
    use core::ptr::NonNull;

    #[repr(C, align(4096))]
    struct Pages([u8; 2 * 4096]);

    /// A link's control ring (order 11) in `mem`.
    fn control_ring(mem: &mut Pages) -> RawRing {
        let g = RingGeometry::new(11).unwrap();
        let base = NonNull::new(mem.0.as_mut_ptr()).unwrap();
        // SAFETY: mem outlives the ring in each test and is used only through it.
        let r = unsafe { RawRing::from_region(base, mem.0.len(), g) }.unwrap();
        r.header().init(&RingIdentity {
            magic: LINK_RING_MAGIC,
            order: 11,
            owner_domid: 1,
            peer_domid: 2,
            conn_id: 0,
            epoch: 0,
        });
        r
    }

    fn frame(m: &Message<'_>) -> ([u8; MAX_CONTROL_FRAME], usize) {
        let mut b = [0u8; MAX_CONTROL_FRAME];
        let n = m.encode(&mut b).unwrap();
        (b, n)
    }

    #[test]
    fn control_frames_come_whole_and_garbage_costs_only_what_was_readable() {
        let mut mem = Pages([0; 2 * 4096]);
        let ring = control_ring(&mut mem);
        let mut tx = control_producer(ring);
        let mut rx = Consumer::new(ring);
        let mut buf = [0u8; MAX_CONTROL_FRAME];
        let close = Message::Close { conn_id: 9 };
        let (bytes, n) = frame(&close);

        assert_eq!(
            take_control_frame(&mut rx, &mut buf),
            Ok(ControlFrame::Incomplete)
        );
        // a frame published in two parts is taken once whole
        tx.write(&bytes[..n - 1]).unwrap();
        tx.flush();
        assert_eq!(
            take_control_frame(&mut rx, &mut buf),
            Ok(ControlFrame::Incomplete)
        );
        tx.write(&bytes[n - 1..n]).unwrap();
        tx.flush();
        assert_eq!(
            take_control_frame(&mut rx, &mut buf),
            Ok(ControlFrame::Whole(n))
        );
        assert_eq!(decode(&buf[..n], Channel::Link).unwrap().0, close);

        // garbage, then a good frame once the producer has moved on
        tx.write(&[0xee; 11]).unwrap();
        tx.flush();
        assert_eq!(
            take_control_frame(&mut rx, &mut buf),
            Ok(ControlFrame::Garbage(11))
        );
        assert_eq!(
            take_control_frame(&mut rx, &mut buf),
            Ok(ControlFrame::Incomplete)
        );
        tx.write(&bytes[..n]).unwrap();
        tx.flush();
        assert_eq!(
            take_control_frame(&mut rx, &mut buf),
            Ok(ControlFrame::Whole(n))
        );

        // a producer index past what the ring holds: an error, nothing read
        use core::sync::atomic::Ordering::Relaxed;
        let cons = ring.header().consumer.cons.load(Relaxed);
        ring.header()
            .producer
            .prod
            .store(cons.wrapping_add(1 << 20), Relaxed);
        assert!(take_control_frame(&mut rx, &mut buf).is_err());
    }

    #[test]
    fn a_peers_addresses_are_matched_by_value() {
        let v4: core::net::IpAddr = "10.0.0.11".parse().unwrap();
        let v6: core::net::IpAddr = "fd00::11".parse().unwrap();
        let list = b"10.0.0.11  fd00::11\tjunk 300.1.1.1";
        assert!(addrs_list(list, v4));
        assert!(addrs_list(list, v6));
        assert!(addrs_list(list, "::ffff:10.0.0.11".parse().unwrap()));
        assert!(!addrs_list(list, "10.0.0.1".parse().unwrap()));
        assert!(!addrs_list(b"", v4));
        assert!(!addrs_list(b"10.0.0.110", v4));
    }

    #[test]
    fn states_round_trip_and_only_offered_ones_attach() {
        for v in 1..=6 {
            let s = LinkState::from_value(v).unwrap();
            assert_eq!(s.value(), v);
            assert_eq!(s.as_str().parse::<u32>().unwrap(), v);
            assert_eq!(s.is_offered(), v == 3 || v == 4);
        }
        assert_eq!(LinkState::from_value(0), None);
        assert_eq!(LinkState::from_value(7), None);
    }

    #[test]
    fn a_half_is_attached_to_only_when_complete_and_offered() {
        let full = HalfValues {
            ring_ref: Some(8),
            event_channel: Some(9),
            state: Some(3),
            generation: Some(77),
            peer_generation: None,
            ring_reuse: Some(1),
        };
        assert_eq!(
            full.offered(),
            Some(PeerHalf {
                generation: 77,
                generation_written: true,
                ring_ref: 8,
                event_channel: 9,
                peer_generation: 0,
                ring_reuse: true,
            })
        );
        for broken in [
            HalfValues {
                ring_ref: None,
                ..full
            },
            HalfValues {
                event_channel: None,
                ..full
            },
            HalfValues {
                state: None,
                ..full
            },
            HalfValues {
                state: Some(6),
                ..full
            },
            HalfValues {
                state: Some(99),
                ..full
            },
        ] {
            assert_eq!(broken.offered(), None, "{broken:?}");
        }
        // A host that writes no generation: derived, odd, and changed by a
        // restart (new ring-ref or port).
        let kernel = HalfValues {
            generation: None,
            ..full
        };
        let g = kernel.offered().unwrap().generation;
        assert_eq!(g & 1, 1);
        // ... which names no instance of the half
        assert!(!kernel.offered().unwrap().generation_written);
        let restarted = HalfValues {
            ring_ref: Some(10),
            ..kernel
        };
        assert_ne!(restarted.offered().unwrap().generation, g);
    }

    #[test]
    fn only_a_live_user_space_half_is_held() {
        let h = HalfValues {
            generation: Some(5),
            state: Some(4),
            ..HalfValues::default()
        };
        assert!(h.held_by_user_space());
        assert!(!HalfValues {
            generation: None,
            ..h
        }
        .held_by_user_space());
        assert!(!HalfValues {
            state: Some(6),
            ..h
        }
        .held_by_user_space());
    }

    #[test]
    fn half_paths_name_the_owner_then_the_peer() {
        extern crate std;
        use std::string::ToString;
        assert_eq!(
            HalfPath { owner: 3, peer: 7 }.to_string(),
            "/local/domain/3/data/xensock/link/7"
        );
    }
}
