// SPDX-License-Identifier: MIT OR Apache-2.0
//! Deterministic simulation of the carrier protocol between two hosts.
//!
//! Two domains, A and B, hold one stream connection (a direction each
//! way). Each direction runs proto's machines as a host does: the sender's
//! `TxPath` over a real proto ring in test memory, the receiver's `RxPath`
//! and its `OfferClock`, its control frames taken in `RxControlOrder`'s
//! order. Around them a simulated world: a clock in milliseconds, the TCP
//! legs as the hosts use them (protocol version 2: each direction's bytes
//! raw on one leg, its control frames on the way back of the other, two
//! connections with delays of their own), the link (delayed, and losing
//! what is in flight when it goes down), and moves
//! (save + restore of either domain, the agent sending a domain away and
//! back, both at once), offers the sender cannot map, and shutdowns. A
//! seeded scheduler picks what happens next, so every run is one
//! reproducible interleaving.
//!
//! Both hosts follow the same rules (the kernel module and the user-space
//! transport decide with the same proto machines), so the two domains run
//! the same code.
//!
//! A second run of seeds (`saves_without_the_hook_...`) also saves a
//! domain that still holds its rings, as a guest whose toolstack does not
//! run the user-space suspend hook is saved (when both directions are on
//! their rings and no other move is under way): the stayer keeps what its
//! own ring holds (`RxPath::freeze_salvaged`), the restored side has no
//! mapping left and resends nothing.
//!
//! Checked at every step: every byte a reader takes is the byte sent at
//! that offset (a receiver that moves and reads on from its ring reads a
//! torn copy, the bytes its peer wrote through its mapping zeroed, as a
//! guest restored from a live migration may, so trusting them shows), and
//! every control frame is in order (proto's `RxControlError` fails the
//! run). Checked at the end, after the world has been quiet for a bounded time: every byte
//! sent was delivered, both directions are back on a ring (unless shut
//! down), nothing is left in flight and no offer is outstanding.
//!
//! `XENSOCK_SIM_SEEDS=N` runs N seeds (default 300; CI runs more in a
//! release build, `scripts/test`), from `XENSOCK_SIM_FIRST` (0);
//! `XENSOCK_SIM_SEED=S` replays one, `XENSOCK_SIM_TRACE=1` with every
//! step. A failing seed prints how to replay it; fixed seeds that once
//! failed are in `REGRESSIONS`.

mod common;

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::rc::Rc;

use common::{pattern, pattern_bytes, Region};
use xensock_proto::control_stream::{decode_frame, LegControl};
use xensock_proto::ctrl::Message;
use xensock_proto::mem::RawRing;
use xensock_proto::offer::{OfferClock, OfferStep};
use xensock_proto::ring::{Consumer, Producer};
use xensock_proto::switch::{
    ConsumedOutcome, RingFromOutcome, RxControl, RxControlOrder, RxControlQueue, RxControlTaken,
    RxPath, RxState, TxPath, TxState,
};

/// How long after the last move (and the link's return) everything must
/// have settled and both directions be back on a ring: the offer clock's
/// bounds (an offer the sender could not map waits out one timeout, a
/// second may cross a freeze) and a minute to spare. A number of its own,
/// not computed from the clock's, so a clock that waits too long fails.
const QUIET_BOUND_MS: u64 = 2 * 15_000 + 2_000 + 60_000;

/// Seeds that once failed (each a regression test): 143, a receiver that
/// drained the ring its peer left (the agent's away) and was then saved
/// and restored read zeros from its torn copy, before a receiver kept
/// only what it took; 0, a direction whose offer could not be mapped
/// stayed on TCP for good without the offer timeout; 105367 and 17069,
/// two offers withdrawn before the sender's freeze of the first came, which
/// nobody answered (the sender stayed frozen).
const REGRESSIONS: &[u64] = &[0, 143, 17069, 105367];

/// splitmix64: small, seedable, the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }
}

/// A delayed, ordered stream: an item can be taken once its time came and
/// everything before it was taken.
struct Stream<T> {
    items: VecDeque<(u64, T)>,
}

impl<T> Stream<T> {
    fn new() -> Self {
        Stream {
            items: VecDeque::new(),
        }
    }
    fn push(&mut self, at: u64, item: T) {
        let at = self.items.back().map_or(at, |(last, _)| at.max(*last));
        self.items.push_back((at, item));
    }
    fn front(&self, now: u64) -> Option<&T> {
        self.items
            .front()
            .filter(|(at, _)| *at <= now)
            .map(|(_, v)| v)
    }
    fn pop(&mut self) -> Option<T> {
        self.items.pop_front().map(|(_, v)| v)
    }
    fn next_at(&self) -> Option<u64> {
        self.items.front().map(|(at, _)| *at)
    }
    fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The sender's leg, raw (protocol version 2, `docs/protocol.md` 5.4):
/// the stream's bytes only, which offsets they are the control frames say.
struct RawLeg {
    chunks: Stream<Vec<u8>>,
    /// bytes of the front chunk already read
    pos: usize,
}

impl RawLeg {
    fn new() -> Self {
        RawLeg {
            chunks: Stream::new(),
            pos: 0,
        }
    }
    /// Up to `max` bytes that have arrived by `now`.
    fn read(&mut self, now: u64, max: usize) -> Vec<u8> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(chunk) = self.chunks.front(now) else {
                break;
            };
            let n = (chunk.len() - self.pos).min(max - out.len());
            out.extend_from_slice(&chunk[self.pos..self.pos + n]);
            self.pos += n;
            if self.pos == chunk.len() {
                self.chunks.pop();
                self.pos = 0;
            }
        }
        out
    }
    fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }
}

/// The connection id the frames on the legs carry (the recipient's; both
/// ends use one here).
const CONN: u32 = 7;

/// A control frame as it travels on a leg: encoded, as a host sends it.
fn wire(frame: RxControl) -> Vec<u8> {
    let m = match frame {
        RxControl::RawFrom { offset } => Message::RawFrom {
            conn_id: CONN,
            offset,
        },
        RxControl::RingFrom { epoch, offset } => Message::RingFrom {
            conn_id: CONN,
            epoch,
            offset,
        },
        RxControl::TxFreeze { epoch, offset } => Message::TxFreeze {
            conn_id: CONN,
            epoch,
            offset,
        },
        RxControl::Fin { offset } => Message::Fin {
            conn_id: CONN,
            offset,
        },
    };
    encode(&m)
}

fn encode(m: &Message<'_>) -> Vec<u8> {
    let mut b = vec![0u8; m.encoded_len()];
    m.encode(&mut b).expect("a control frame encodes");
    b
}

/// A frame off a leg's control stream, read by proto's rule as a host
/// reads it.
fn unwire(bytes: &[u8]) -> Result<LegControl, String> {
    decode_frame(bytes, CONN).map_err(|e| e.to_string())
}

/// One direction: sender S, receiver R.
struct Direction {
    name: &'static str,
    order: u32,
    // the sender
    tx: TxPath,
    producer: Option<Producer<RawRing>>,
    /// the receiver's pages the producer writes (mapped: they stay while
    /// the sender holds them)
    mapped: Option<Rc<Region>>,
    /// the frozen ring's bytes the receiver had not consumed
    resend: Vec<u8>,
    /// an offer that came before the `Consumed` it waits for
    kept_offer: Option<(u32, Rc<Region>)>,
    /// the next offer taken cannot be mapped
    map_fails: bool,
    // the receiver
    rx: RxPath,
    consumer: Option<Rc<Region>>,
    reader: Option<Consumer<RawRing>>,
    offered: Option<Rc<Region>>,
    clock: OfferClock,
    /// the sender's control frames as they came, taken in proto's order
    rx_ctl: RxControlQueue,
    ctl_order: RxControlOrder,
    // the wires
    /// S -> R: the stream's bytes, raw
    raw: RawLeg,
    /// S -> R: control (RawFrom, RingFrom, TxFreeze, Fin), on the way back
    /// of R's leg
    ctl: Stream<Vec<u8>>,
    /// R -> S: `Consumed{epoch, offset}`, encoded
    back: Stream<Vec<u8>>,
    /// R -> S on the link: ring offers
    link: Stream<(u32, Rc<Region>)>,
    /// the legs are two TCP connections: each adds its own delay to the
    /// common one (ms)
    raw_extra: u64,
    ctl_extra: u64,
    delivered: u64,
}

impl Direction {
    fn new(name: &'static str, order: u32, raw_extra: u64, ctl_extra: u64) -> Self {
        let region = Rc::new(Region::new(order, 0));
        Direction {
            name,
            order,
            tx: TxPath::on_ring(),
            producer: Some(Producer::new(region.ring)),
            mapped: Some(region.clone()),
            resend: Vec::new(),
            kept_offer: None,
            map_fails: false,
            rx: RxPath::on_ring(),
            reader: Some(Consumer::new(region.ring)),
            consumer: Some(region),
            offered: None,
            clock: OfferClock::new(),
            rx_ctl: RxControlQueue::new(),
            ctl_order: RxControlOrder::new(),
            raw: RawLeg::new(),
            ctl: Stream::new(),
            back: Stream::new(),
            link: Stream::new(),
            raw_extra,
            ctl_extra,
            delivered: 0,
        }
    }

    fn release_rx_ring(&mut self) {
        if !self.rx.reads_ring() {
            self.reader = None;
            self.consumer = None;
        }
    }

    // ---- sender ----

    fn write(&mut self, now: u64, lat: u64, len: usize) -> Result<(), String> {
        if !self.tx.writable() {
            return Ok(());
        }
        let from = self.tx.sent();
        let data = pattern_bytes(from, len);
        match self.tx.state() {
            TxState::Ring { .. } => {
                let p = self.producer.as_mut().ok_or("ring without a producer")?;
                let n = p.write(&data).map_err(|e| format!("write: {e:?}"))?;
                self.tx.record_sent(n as u64).map_err(|e| e.to_string())?;
            }
            TxState::Tcp => {
                if !data.is_empty() {
                    self.raw.chunks.push(now + lat + self.raw_extra, data);
                }
                self.tx.record_sent(len as u64).map_err(|e| e.to_string())?;
            }
            TxState::Frozen { .. } => unreachable!("writable while frozen"),
        }
        Ok(())
    }

    fn shutdown(&mut self, now: u64, lat: u64) {
        if self.tx.is_finished() {
            return;
        }
        self.tx.finish();
        match self.tx.state() {
            TxState::Ring { .. } => {
                if let Some(p) = self.producer.as_mut() {
                    p.finish();
                }
            }
            TxState::Tcp => self.ctl.push(
                now + lat + self.ctl_extra,
                wire(RxControl::Fin {
                    offset: self.tx.sent(),
                }),
            ),
            // after the resend
            TxState::Frozen { .. } => {}
        }
    }

    /// The sender leaves its ring (it moves, or its peer is gone): copies
    /// what the receiver has not consumed back out, tells the receiver.
    /// Without `ring_mapped` (it runs again after a save that found it
    /// holding the ring, with no suspend hook: its mapping is gone) nothing
    /// is read back and nothing can be resent; a `Consumed` below what it
    /// wrote is then proto's `BadOffset`, which fails the run.
    fn freeze_tx(&mut self, now: u64, lat: u64, ring_mapped: bool) -> Result<(), String> {
        let unconsumed = match (self.tx.state(), self.producer.as_mut(), ring_mapped) {
            (TxState::Ring { .. }, Some(p), true) => {
                p.freeze();
                let mut buf = vec![0u8; p.capacity() as usize];
                let n = p
                    .read_back(&mut buf)
                    .map_err(|e| format!("read_back: {e:?}"))?;
                buf.truncate(n);
                self.resend = buf;
                n as u64
            }
            _ => 0,
        };
        let notice = self.tx.freeze(unconsumed).map_err(|e| e.to_string())?;
        self.producer = None;
        self.mapped = None;
        self.ctl.push(
            now + lat + self.ctl_extra,
            wire(RxControl::TxFreeze {
                epoch: notice.epoch,
                offset: notice.offset,
            }),
        );
        Ok(())
    }

    fn take_offer(
        &mut self,
        now: u64,
        lat: u64,
        epoch: u32,
        ring: Rc<Region>,
    ) -> Result<(), String> {
        if self.tx.offer_waits_for_consumed(epoch) {
            if !matches!(&self.kept_offer, Some((e, _)) if *e >= epoch) {
                self.kept_offer = Some((epoch, ring));
            }
            return Ok(());
        }
        if self.tx.is_finished() {
            return Ok(());
        }
        if std::mem::take(&mut self.map_fails) {
            // the host's "cannot be mapped; staying on TCP"
            return Ok(());
        }
        if let Some(m) = self.tx.on_ring_offer(epoch).map_err(|e| e.to_string())? {
            // ends the run at m: nothing after it goes on the leg
            self.ctl.push(
                now + lat + self.ctl_extra,
                wire(RxControl::RingFrom { epoch, offset: m }),
            );
            self.producer = Some(Producer::new(ring.ring));
            self.mapped = Some(ring);
        }
        Ok(())
    }

    /// The sender takes what reached it: `Consumed` on its leg's way back,
    /// offers on the link.
    fn pump_tx(&mut self, now: u64, lat: u64) -> Result<(), String> {
        while self.back.front(now).is_some() {
            let Some(bytes) = self.back.pop() else {
                break;
            };
            let LegControl::Consumed { epoch, offset } = unwire(&bytes)? else {
                return Err("a frame for the receiving direction on the sender's way back".into());
            };
            let mut outcome = self
                .tx
                .on_consumed(epoch, offset)
                .map_err(|e| e.to_string())?;
            if outcome == ConsumedOutcome::FreezeFirst {
                self.freeze_tx(now, lat, true)?;
                outcome = self
                    .tx
                    .on_consumed(epoch, offset)
                    .map_err(|e| e.to_string())?;
            }
            if let ConsumedOutcome::Resend(r) = outcome {
                let copy = std::mem::take(&mut self.resend);
                let bytes = copy
                    .get(r.skip as usize..(r.skip + r.len) as usize)
                    .ok_or("resend beyond the copy")?;
                // a new run: where its raw bytes start, then the bytes
                self.ctl.push(
                    now + lat + self.ctl_extra,
                    wire(RxControl::RawFrom { offset: r.from }),
                );
                if !bytes.is_empty() {
                    self.raw
                        .chunks
                        .push(now + lat + self.raw_extra, bytes.to_vec());
                }
                if self.tx.is_finished() {
                    self.ctl.push(
                        now + lat + self.ctl_extra,
                        wire(RxControl::Fin {
                            offset: self.tx.sent(),
                        }),
                    );
                }
            }
            if let Some((epoch, ring)) = self.kept_offer.take() {
                self.take_offer(now, lat, epoch, ring)?;
            }
        }
        while self.link.front(now).is_some() {
            let Some((epoch, ring)) = self.link.pop() else {
                break;
            };
            self.take_offer(now, lat, epoch, ring)?;
        }
        Ok(())
    }

    // ---- receiver ----

    fn consumed(&mut self, now: u64, lat: u64, epoch: u32, offset: u64) {
        self.back.push(
            now + lat,
            encode(&Message::Consumed {
                conn_id: CONN,
                epoch,
                offset,
            }),
        );
    }

    /// The receiver moves: its ring pages are not to be trusted.
    fn rx_local_move(&mut self, now: u64, lat: u64) {
        let was_ring = matches!(self.rx.state(), RxState::Ring { .. });
        if let Some(c) = self.rx.freeze_local() {
            self.consumed(now, lat, c.epoch, c.offset);
            if was_ring {
                self.clock.left_ring(c.epoch, now);
            }
        }
        self.release_rx_ring();
        // a ring it still reads is its restored copy, torn: the bytes the
        // sender wrote through its mapping are lost (its mapping still
        // holds the pages)
        if let (Some(region), Some(reader)) = (&self.consumer, &self.reader) {
            let copy = Rc::new(region.torn_copy());
            self.reader = Some(Consumer::resume(copy.ring, reader.position()));
            self.consumer = Some(copy);
        }
        if !matches!(self.rx.state(), RxState::Offered { .. }) {
            self.offered = None;
            self.clock.settled();
        }
    }

    /// The receiver stayed and its peer is gone from the link: it leaves
    /// the ring as if it moved (both hosts).
    fn rx_peer_gone(&mut self, now: u64, lat: u64) {
        let was_ring = matches!(self.rx.state(), RxState::Ring { .. });
        if was_ring {
            if let Some(c) = self.rx.freeze_local() {
                self.consumed(now, lat, c.epoch, c.offset);
                self.clock.left_ring(c.epoch, now);
            }
        }
        self.release_rx_ring();
    }

    /// The receiver stayed and the link died under its ring while its
    /// peer held it (saved without the suspend hook): it copies every byte
    /// its own ring holds out at once (`RxPath::freeze_salvaged`; the
    /// user-space transport's rule), here delivered and checked at once.
    fn rx_salvage(&mut self, now: u64, lat: u64) -> Result<(), String> {
        if !matches!(self.rx.state(), RxState::Ring { .. }) {
            self.rx_peer_gone(now, lat);
            return Ok(());
        }
        let c = self.reader.as_mut().ok_or("ring without a reader")?;
        let mut buf = vec![0u8; c.capacity() as usize];
        let n = c.read(&mut buf).map_err(|e| format!("salvage: {e:?}"))?;
        let fin = c.peer_end().map_err(|e| format!("peer_end: {e:?}"))?.fin;
        self.check(&buf[..n])?;
        if fin {
            let end = self.rx.taken() + n as u64;
            self.rx.on_fin(end).map_err(|e| e.to_string())?;
        }
        if let Some(c) = self.rx.freeze_salvaged(n as u64) {
            self.consumed(now, lat, c.epoch, c.offset);
            self.clock.left_ring(c.epoch, now);
        }
        self.release_rx_ring();
        Ok(())
    }

    /// The link an outstanding offer went over died: it is abandoned,
    /// with the `Consumed` that says so.
    fn rx_link_down(&mut self, now: u64, lat: u64) {
        let RxState::Offered { .. } = self.rx.state() else {
            return;
        };
        if let Some(c) = self.rx.freeze_local() {
            self.consumed(now, lat, c.epoch, c.offset);
        }
        self.offered = None;
        self.clock.settled();
    }

    /// The offer clock's turn.
    fn rx_clock(&mut self, link_up: bool, now: u64, lat: u64) {
        match self.clock.step(&self.rx, link_up, true, now) {
            OfferStep::Idle | OfferStep::WaitUntil(_) => {}
            OfferStep::Abandon => {
                if let Some(c) = self.rx.freeze_local() {
                    self.consumed(now, lat, c.epoch, c.offset);
                }
                self.offered = None;
                self.clock.settled();
            }
            OfferStep::Offer => {
                let Ok(epoch) = self.rx.offer_ring() else {
                    return;
                };
                let region = Rc::new(Region::new(self.order, 0));
                self.offered = Some(region.clone());
                self.link.push(now + lat, (epoch, region));
                self.clock.offered(now);
            }
        }
    }

    fn check(&mut self, bytes: &[u8]) -> Result<(), String> {
        for (k, b) in bytes.iter().enumerate() {
            let at = self.delivered + k as u64;
            if *b != pattern(at) {
                return Err(format!(
                    "{}: byte {:#04x} at offset {at}, sent {:#04x}",
                    self.name,
                    b,
                    pattern(at)
                ));
            }
        }
        self.delivered += bytes.len() as u64;
        Ok(())
    }

    /// The control frames that came, taken in proto's order as far as
    /// they can be now (a host's `pump_rx` / `take_rx_ctl`).
    fn take_control(&mut self, now: u64, lat: u64) -> Result<(), String> {
        while self.ctl.front(now).is_some() {
            let Some(bytes) = self.ctl.pop() else {
                break;
            };
            let LegControl::Receiving(f) = unwire(&bytes)? else {
                return Err(
                    "an answer for the sending direction on the receiver's way back".into(),
                );
            };
            self.rx_ctl
                .push(f)
                .map_err(|e| format!("control queue: {e}"))?;
        }
        while let Some(frame) = self.rx_ctl.front() {
            let Some(taken) = self
                .ctl_order
                .take(&mut self.rx, frame)
                .map_err(|e| format!("{}: control {frame:?}: {e}", self.name))?
            else {
                return Ok(());
            };
            match taken {
                RxControlTaken::Run | RxControlTaken::Fin => {}
                RxControlTaken::RingFrom { outcome, .. } => {
                    if outcome == RingFromOutcome::Switch {
                        let ring = self.offered.take().ok_or("RingFrom without an offer")?;
                        self.reader = Some(Consumer::new(ring.ring));
                        self.consumer = Some(ring);
                        self.clock.settled();
                    }
                }
                RxControlTaken::TxFreeze {
                    epoch, consumed, ..
                } => {
                    self.clock.saw_freeze(epoch);
                    if let Some(c) = consumed {
                        self.consumed(now, lat, c.epoch, c.offset);
                    }
                    self.release_rx_ring();
                    if matches!(self.rx.state(), RxState::Tcp) {
                        self.offered = None;
                        self.clock.settled();
                    }
                }
            }
            self.rx_ctl.pop();
        }
        Ok(())
    }

    /// The receiving application reads up to `budget` bytes; the host
    /// takes the control frames that came on the way.
    fn read(&mut self, now: u64, lat: u64, mut budget: usize) -> Result<(), String> {
        loop {
            self.take_control(now, lat)?;
            if budget == 0 {
                return Ok(());
            }
            if self.rx.reads_ring() {
                let c = self.reader.as_mut().ok_or("ring without a reader")?;
                let mut buf = vec![0u8; budget.min(c.capacity() as usize)];
                let n = c.read(&mut buf).map_err(|e| format!("read: {e:?}"))?;
                let fin = {
                    let end = c.peer_end().map_err(|e| format!("peer_end: {e:?}"))?;
                    end.fin && c.readable().map_err(|e| format!("{e:?}"))? == 0
                };
                if n > 0 {
                    self.rx
                        .record_ring_taken(n as u64)
                        .map_err(|e| e.to_string())?;
                    self.check(&buf[..n])?;
                    budget -= n;
                }
                if fin && matches!(self.rx.state(), RxState::Ring { .. }) {
                    self.rx.on_fin(self.rx.taken()).map_err(|e| e.to_string())?;
                }
                self.release_rx_ring();
                if n == 0 {
                    return Ok(());
                }
                continue;
            }
            // the raw leg, while a run is open (a host's `read_run`): never
            // past the end of stream or a queued RingFrom's offset
            if !self.ctl_order.run_open() || !self.rx.tcp_data_takeable() {
                return Ok(());
            }
            let taken = self.rx.taken();
            let mut limit = budget as u64;
            if let Some(eof) = self.rx.eof_at() {
                limit = limit.min(eof.saturating_sub(taken));
            }
            if let Some(end) = self.rx_ctl.run_end() {
                limit = limit.min(end.saturating_sub(taken));
            }
            if limit == 0 {
                return Ok(());
            }
            let bytes = self.raw.read(now, limit as usize);
            if bytes.is_empty() {
                return Ok(());
            }
            self.rx
                .on_data(taken, bytes.len() as u64)
                .map_err(|e| e.to_string())?;
            self.check(&bytes)?;
            budget -= bytes.len();
        }
    }

    fn next_at(&self) -> Option<u64> {
        [
            self.raw.chunks.next_at(),
            self.ctl.next_at(),
            self.back.next_at(),
            self.link.next_at(),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    fn settled(&self) -> bool {
        self.raw.is_empty()
            && self.ctl.is_empty()
            && self.rx_ctl.is_empty()
            && self.back.is_empty()
            && self.link.is_empty()
            && self.delivered == self.tx.sent()
            && !matches!(self.tx.state(), TxState::Frozen { .. })
    }

    fn state(&self) -> String {
        format!(
            "{}: tx {:?} sent {}, rx {:?} taken {} delivered {}, run open {}, in flight raw {} ctl {}+{} back {} link {}",
            self.name,
            self.tx.state(),
            self.tx.sent(),
            self.rx.state(),
            self.rx.taken(),
            self.delivered,
            self.ctl_order.run_open(),
            self.raw.chunks.items.len(),
            self.ctl.items.len(),
            self.rx_ctl.len(),
            self.back.items.len(),
            self.link.items.len()
        )
    }
}

/// A and B and the wires between them.
struct World {
    rng: Rng,
    now: u64,
    /// A -> B, B -> A
    dirs: [Direction; 2],
    link_up: bool,
    /// when the link comes up again
    link_back_at: Option<u64>,
    /// each domain's pending "peer gone" notice (the agent's away)
    gone_at: [Option<u64>; 2],
    lat_tcp: u64,
    lat_link: u64,
    /// Some saves run without the suspend hook (the user-space transport
    /// in a guest whose toolstack does not call it), drawn from `unhooked`
    /// so that the other draws stay those of the seed's schedule.
    unhooked: Option<Rng>,
    trace: String,
}

impl World {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let order = 11 + rng.below(3) as u32;
        // two draws kept in the stream, so that every seed (REGRESSIONS
        // among them) replays the schedule it was found with
        let _ = [rng.chance(500), rng.chance(500)];
        let lat_tcp = 1 + rng.below(200);
        let lat_link = 1 + rng.below(200);
        World {
            rng,
            now: 0,
            dirs: {
                // from a second generator, so that a seed's schedule stays
                // what it was before the legs had delays of their own
                let mut legs = Rng(seed ^ 0x5853_4c45_4753);
                let mut extra = || legs.below(300);
                [
                    Direction::new("A->B", order, extra(), extra()),
                    Direction::new("B->A", order, extra(), extra()),
                ]
            },
            link_up: true,
            link_back_at: None,
            gone_at: [None, None],
            lat_tcp,
            lat_link,
            unhooked: None,
            trace: format!("order {order}, latency tcp {lat_tcp} link {lat_link} ms\n"),
        }
    }

    /// With `XENSOCK_SIM_TRACE=1`, every step goes into the trace.
    fn detail(&mut self, what: impl FnOnce() -> String) {
        if std::env::var_os("XENSOCK_SIM_TRACE").is_some() {
            let what = what();
            self.note(&what);
        }
    }

    fn note(&mut self, what: &str) {
        let _ = writeln!(self.trace, "{:>8} ms  {what}", self.now);
    }

    /// Domain `d` (0 = A) is saved and restored: it freezes both
    /// directions as a host does in its suspend path; the link goes down
    /// until it is back.
    fn save_restore(&mut self, d: usize, down_ms: u64) -> Result<(), String> {
        self.note(&format!("save+restore of {} ({down_ms} ms)", ["A", "B"][d]));
        let (now, lat) = (self.now, self.lat_tcp);
        self.dirs[d].freeze_tx(now, lat, true)?;
        self.dirs[1 - d].rx_local_move(now, lat);
        self.link_down(down_ms);
        Ok(())
    }

    /// Both directions on a ring, the link up, no notice pending.
    fn on_rings_and_quiet(&self) -> bool {
        self.link_up
            && self.gone_at.iter().all(Option::is_none)
            && self.dirs.iter().all(|d| {
                matches!(d.tx.state(), TxState::Ring { .. })
                    && matches!(d.rx.state(), RxState::Ring { .. })
                    && d.offered.is_none()
                    && d.kept_offer.is_none()
            })
    }

    /// Domain `d` is saved holding its rings (no suspend hook) and
    /// restored: the other sees the link die while `d` is away and leaves
    /// its rings (its sending direction reads back through its mapping,
    /// which keeps the pages; its receiving one keeps what its own ring
    /// holds); `d`, running again, has no mapping left (it resends
    /// nothing) and a torn copy of its own ring (it keeps what it took).
    fn save_restore_unhooked(&mut self, d: usize, down_ms: u64) -> Result<(), String> {
        self.note(&format!(
            "save+restore of {} without the hook ({down_ms} ms)",
            ["A", "B"][d]
        ));
        let (now, lat) = (self.now, self.lat_tcp);
        let stayer = 1 - d;
        self.dirs[stayer].freeze_tx(now, lat, true)?;
        self.dirs[d].rx_salvage(now, lat)?;
        self.link_down(down_ms);
        self.dirs[d].freeze_tx(now, lat, false)?;
        self.dirs[stayer].rx_local_move(now, lat);
        Ok(())
    }

    /// The agent says domain `d` left (it stays, as in the lab's drill):
    /// both notice the peer gone, each in its own time.
    fn away_back(&mut self, d: usize, down_ms: u64) {
        self.note(&format!("{} away and back ({down_ms} ms)", ["A", "B"][d]));
        let now = self.now;
        for k in 0..2 {
            let at = now + self.rng.below(300);
            self.gone_at[k] = Some(self.gone_at[k].map_or(at, |t| t.min(at)));
        }
        self.link_down(down_ms);
    }

    fn link_down(&mut self, down_ms: u64) {
        let (now, lat) = (self.now, self.lat_tcp);
        if self.link_up {
            self.link_up = false;
            for d in 0..2 {
                self.dirs[d].link.items.clear();
                self.dirs[d].kept_offer = None;
                self.dirs[d].rx_link_down(now, lat);
            }
        }
        let back = now + down_ms;
        self.link_back_at = Some(self.link_back_at.map_or(back, |t| t.max(back)));
    }

    /// Domain `d`'s turn: notices, its senders' input, its offer clock.
    fn tick(&mut self, d: usize) -> Result<(), String> {
        let (now, lat) = (self.now, self.lat_tcp);
        if self.gone_at[d].is_some_and(|t| t <= now) {
            self.gone_at[d] = None;
            self.note(&format!("{} notices its peer gone", ["A", "B"][d]));
            self.dirs[d].freeze_tx(now, lat, true)?;
            self.dirs[1 - d].rx_peer_gone(now, lat);
        }
        self.dirs[d].pump_tx(now, lat)?;
        let link_up = self.link_up;
        let lat_link = self.lat_link;
        self.dirs[1 - d].rx_clock(link_up, now, lat_link);
        Ok(())
    }

    fn read(&mut self, dir: usize, budget: usize) -> Result<(), String> {
        let (now, lat) = (self.now, self.lat_tcp);
        self.dirs[dir].read(now, lat, budget)
    }

    fn advance(&mut self, ms: u64) {
        self.now += ms;
        if self.link_back_at.is_some_and(|t| t <= self.now) {
            self.link_back_at = None;
            self.link_up = true;
            self.note("link up");
        }
    }

    /// One step of the busy world.
    fn step(&mut self, moves: bool) -> Result<(), String> {
        let r = self.rng.below(1000);
        let dir = self.rng.below(2) as usize;
        let states = format!("{} | {}", self.dirs[0].state(), self.dirs[1].state());
        self.detail(|| format!("step {r} dir {dir}: {states}"));
        match r {
            0..=299 => {
                let len = self.rng.below(9000) as usize;
                let (now, lat) = (self.now, self.lat_tcp);
                self.dirs[dir].write(now, lat, len)?;
            }
            300..=599 => {
                let budget = 1 + self.rng.below(9000) as usize;
                self.read(dir, budget)?;
            }
            600..=799 => self.tick(dir)?,
            800..=969 => {
                let ms = 1 + self.rng.below(400);
                self.advance(ms);
            }
            970..=984 if moves => {
                let down = self.rng.below(40_000);
                if self.rng.chance(500) {
                    // Only on rings, out of any other move: a stayer that
                    // is away itself, left the ring on an earlier notice
                    // while the mover kept writing, or had offered a new
                    // ring the mover had already taken, has not kept all
                    // the bytes, and the connection fails (loudly, as
                    // proto's `BadOffset`): not what this run checks.
                    let unhooked = self.unhooked.as_mut().is_some_and(|u| u.chance(500));
                    if unhooked && self.on_rings_and_quiet() {
                        self.save_restore_unhooked(dir, down)?;
                    } else {
                        self.save_restore(dir, down)?;
                    }
                } else {
                    self.away_back(dir, down);
                }
                if self.rng.chance(150) {
                    self.note("the other at once");
                    self.save_restore(1 - dir, down)?;
                }
            }
            985..=994 if moves => {
                self.note(&format!(
                    "{}: next offer cannot be mapped",
                    self.dirs[dir].name
                ));
                self.dirs[dir].map_fails = true;
            }
            995..=999 if moves && self.rng.chance(100) => {
                self.note(&format!("{}: shutdown", self.dirs[dir].name));
                let (now, lat) = (self.now, self.lat_tcp);
                self.dirs[dir].shutdown(now, lat);
            }
            _ => {}
        }
        Ok(())
    }

    /// The world goes quiet: no more moves; everything must settle, and
    /// both directions be back on a ring, within a bounded time.
    fn quiesce(&mut self) -> Result<(), String> {
        let bound =
            self.now + self.link_back_at.map_or(0, |t| t.saturating_sub(self.now)) + QUIET_BOUND_MS;
        while self.now <= bound {
            for d in 0..2 {
                self.tick(d)?;
                self.read(d, usize::MAX / 2)?;
            }
            let done = self.dirs.iter().all(|d| {
                d.settled()
                    && (d.tx.is_finished() || matches!(d.tx.state(), TxState::Ring { .. }))
                    && (d.tx.is_finished() || matches!(d.rx.state(), RxState::Ring { .. }))
            }) && self.link_back_at.is_none()
                && self.gone_at.iter().all(Option::is_none);
            if done {
                return Ok(());
            }
            let next = self
                .dirs
                .iter()
                .filter_map(Direction::next_at)
                .chain(self.link_back_at)
                .chain(self.gone_at.iter().flatten().copied())
                .filter(|t| *t > self.now)
                .min()
                .unwrap_or(self.now + 100)
                .min(self.now + 100);
            self.advance(next - self.now);
        }
        Err(format!(
            "stalled: not settled {QUIET_BOUND_MS} ms after the world went quiet"
        ))
    }

    fn check_end(&self) -> Result<(), String> {
        for d in &self.dirs {
            if d.delivered != d.tx.sent() || d.rx.taken() != d.tx.sent() {
                return Err(format!("{}: bytes missing", d.name));
            }
            if d.tx.is_finished() && d.rx.eof_at() != Some(d.tx.sent()) {
                return Err(format!("{}: end of stream not seen", d.name));
            }
            if !d.tx.is_finished() && (d.offered.is_some() || d.kept_offer.is_some()) {
                return Err(format!("{}: an offer left outstanding", d.name));
            }
            if !d.resend.is_empty() {
                return Err(format!("{}: a resend copy left", d.name));
            }
        }
        Ok(())
    }
}

/// One seed: a busy world, then a quiet one. Err: what went wrong, with
/// the trace of moves.
fn run(seed: u64) -> Result<(), String> {
    run_world(World::new(seed))
}

/// One seed whose saves run without the suspend hook half of the time.
fn run_unhooked(seed: u64) -> Result<(), String> {
    let mut w = World::new(seed);
    w.unhooked = Some(Rng(seed ^ 0x554e_484f_4f4b));
    run_world(w)
}

fn run_world(mut w: World) -> Result<(), String> {
    let steps = 500 + w.rng.below(3000);
    let result = (|| {
        for _ in 0..steps {
            w.step(true)?;
        }
        w.quiesce()?;
        w.check_end()
    })();
    result.map_err(|e| {
        let states: Vec<String> = w.dirs.iter().map(Direction::state).collect();
        format!("{e}\n{}\n{}", states.join("\n"), w.trace)
    })
}

fn seeds() -> Vec<u64> {
    if let Some(s) = std::env::var("XENSOCK_SIM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        return vec![s];
    }
    let n: u64 = std::env::var("XENSOCK_SIM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let first: u64 = std::env::var("XENSOCK_SIM_FIRST")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    (first..first + n).collect()
}

#[test]
fn every_byte_once_in_order_and_back_on_a_ring_once_quiet() {
    let seeds: Vec<u64> = REGRESSIONS.iter().copied().chain(seeds()).collect();
    run_seeds(&seeds, run, "every_byte_once");
}

/// The same with saves that find a guest holding its rings: the stayer
/// keeps its own ring's bytes and the restored side resends nothing, and
/// still every byte arrives once, in order.
#[test]
fn saves_without_the_hook_lose_nothing_when_the_stayer_keeps_its_ring() {
    run_seeds(&seeds(), run_unhooked, "saves_without_the_hook");
}

fn run_seeds(seeds: &[u64], run: fn(u64) -> Result<(), String>, test: &str) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut failed: Vec<(u64, String)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|k| {
                s.spawn(move || {
                    seeds
                        .iter()
                        .skip(k)
                        .step_by(threads)
                        .filter_map(|&seed| run(seed).err().map(|e| (seed, e)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("a simulation thread panicked"))
            .collect()
    });
    failed.sort_by_key(|(seed, _)| *seed);
    eprintln!("{} schedules, {} failed", seeds.len(), failed.len());
    if let Some((seed, e)) = failed.first() {
        eprintln!("seed {seed} failed: {e}");
        let list: Vec<u64> = failed.iter().take(20).map(|(s, _)| *s).collect();
        panic!(
            "failing seeds {list:?}; replay one: XENSOCK_SIM_SEED={seed} XENSOCK_SIM_TRACE=1 cargo test -p xensock-proto --test simulation {test} -- --nocapture"
        );
    }
}
