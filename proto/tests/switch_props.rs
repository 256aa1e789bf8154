// SPDX-License-Identifier: MIT OR Apache-2.0
//! Carrier switching: for random sequences of moves (either end, both at
//! once, during an upgrade, after shutdown), partial writes and reads, the
//! stream each side delivers equals the stream the other side sent.
//!
//! The harness is a small host of the protocol: real proto rings in test
//! memory, the TCP leg as two ordered byte pipes per direction carrying
//! frames encoded with proto's codec, and a link queue that loses its
//! messages whenever a domain moves.

mod common;

use std::collections::VecDeque;
use std::rc::Rc;

use common::{pattern, pattern_bytes, Region};
use proptest::prelude::*;
use xensock_proto::ctrl::{decode, Channel, DecodeError, Message, MAX_DATA_PAYLOAD};
use xensock_proto::mem::RawRing;
use xensock_proto::ring::{Consumer, Producer};
use xensock_proto::switch::{
    ConsumedOutcome, Phase, RingFromOutcome, RxPath, RxState, TxPath, TxState,
};

/// An ordered byte pipe carrying encoded frames (one TCP stream).
#[derive(Default)]
struct Pipe {
    bytes: Vec<u8>,
    pos: usize,
}

impl Pipe {
    fn push(&mut self, msg: Message<'_>) {
        let mut buf = vec![0u8; msg.encoded_len()];
        msg.encode(&mut buf).unwrap();
        self.bytes.extend_from_slice(&buf);
    }
    fn peek(&self) -> Option<(Message<'_>, usize)> {
        match decode(&self.bytes[self.pos..], Channel::Tcp) {
            Ok(v) => Some(v),
            Err(DecodeError::Incomplete { .. }) => None,
            Err(e) => panic!("bad frame in pipe: {e}"),
        }
    }
    fn advance(&mut self, n: usize) {
        self.pos += n;
    }
    fn is_empty(&self) -> bool {
        self.pos == self.bytes.len()
    }
}

/// One direction of the connection: sender X, receiver Y.
struct Direction {
    tx: TxPath,
    producer: Option<Producer<RawRing>>,
    /// The sender's copy of the frozen ring's unconsumed bytes.
    resend: Vec<u8>,
    rx: RxPath,
    consumer: Option<Consumer<RawRing>>,
    /// The ring the receiver offered and the sender has not yet taken.
    offered: Option<RawRing>,
    /// Receiver's rings, kept alive while anyone may still map them.
    regions: Vec<Rc<Region>>,
    /// Sender -> receiver TCP stream (data, markers, freeze notices, FIN).
    fwd: Pipe,
    /// Receiver -> sender TCP stream (Consumed).
    back: Pipe,
    /// Link messages (ring offers) receiver -> sender; lost on any move.
    link: VecDeque<(u32, RawRing)>,
    /// Bytes the receiving application has read.
    delivered: u64,
    order: u32,
}

impl Direction {
    fn new(order: u32) -> Self {
        let region = Rc::new(Region::new(order, 0));
        let ring = region.ring;
        Direction {
            tx: TxPath::on_ring(),
            producer: Some(Producer::new(ring)),
            resend: Vec::new(),
            rx: RxPath::on_ring(),
            consumer: Some(Consumer::new(ring)),
            offered: None,
            regions: vec![region],
            fwd: Pipe::default(),
            back: Pipe::default(),
            link: VecDeque::new(),
            delivered: 0,
            order,
        }
    }

    fn app_write(&mut self, len: usize) {
        if !self.tx.writable() {
            return;
        }
        let from = self.tx.sent();
        let data = pattern_bytes(from, len);
        match self.tx.state() {
            TxState::Ring { .. } => {
                let p = self.producer.as_mut().unwrap();
                let n = p.write(&data).unwrap();
                self.tx.record_sent(n as u64).unwrap();
            }
            TxState::Tcp => {
                for (k, chunk) in data.chunks(MAX_DATA_PAYLOAD).enumerate() {
                    let offset = from + (k * MAX_DATA_PAYLOAD) as u64;
                    self.fwd.push(Message::Data {
                        conn_id: 1,
                        offset,
                        payload: chunk,
                    });
                }
                self.tx.record_sent(len as u64).unwrap();
            }
            TxState::Frozen { .. } => unreachable!(),
        }
    }

    fn app_shutdown(&mut self) {
        if self.tx.is_finished() {
            return;
        }
        self.tx.finish();
        match self.tx.state() {
            TxState::Ring { .. } => self.producer.as_mut().unwrap().finish(),
            TxState::Tcp => self.fwd.push(Message::Fin {
                conn_id: 1,
                offset: self.tx.sent(),
            }),
            TxState::Frozen { .. } => {} // sent after the resend
        }
    }

    /// The sender freezes its ring (it moves, or learned the ring is dead):
    /// copy the unconsumed bytes back out, drop the mapping, tell the peer.
    fn tx_freeze(&mut self) {
        let unconsumed = match (&self.tx.state(), self.producer.as_mut()) {
            (TxState::Ring { .. }, Some(p)) => {
                p.freeze();
                let mut buf = vec![0u8; p.capacity() as usize];
                let n = p.read_back(&mut buf).unwrap();
                buf.truncate(n);
                self.resend = buf;
                n as u64
            }
            _ => 0,
        };
        let notice = self.tx.freeze(unconsumed).unwrap();
        self.producer = None;
        self.fwd.push(Message::TxFreeze {
            conn_id: 1,
            epoch: notice.epoch,
            offset: notice.offset,
        });
    }

    /// The receiver moves: it trusts nothing in its ring beyond what it took.
    fn rx_move(&mut self) {
        if let Some(c) = self.rx.freeze_local() {
            self.back.push(Message::Consumed {
                conn_id: 1,
                epoch: c.epoch,
                offset: c.offset,
            });
        }
        if !self.rx.reads_ring() {
            self.consumer = None;
        }
        if matches!(self.rx.state(), RxState::Tcp) {
            self.offered = None;
        }
    }

    /// The receiver stayed and learned the sender is gone from the link
    /// (before any TxFreeze arrived): its ring is final.
    fn rx_peer_gone(&mut self) {
        // Only meaningful once the sender really stopped writing.
        if !matches!(self.tx.state(), TxState::Frozen { .. }) {
            return;
        }
        if let RxState::Ring { epoch, .. } = self.rx.state() {
            let readable = self.consumer.as_ref().unwrap().readable().unwrap() as u64;
            if let Some(c) = self.rx.on_tx_freeze(epoch, None, readable).unwrap() {
                self.back.push(Message::Consumed {
                    conn_id: 1,
                    epoch: c.epoch,
                    offset: c.offset,
                });
            }
            if !self.rx.reads_ring() {
                self.consumer = None;
            }
        }
    }

    fn rx_offer(&mut self) {
        if !matches!(self.rx.state(), RxState::Tcp) {
            return;
        }
        let epoch = self.rx.offer_ring().unwrap();
        let region = Rc::new(Region::new(self.order, 0));
        self.offered = Some(region.ring);
        self.link.push_back((epoch, region.ring));
        self.regions.push(region);
    }

    /// Sender handles link messages (ring offers).
    fn tx_link(&mut self) {
        while let Some((epoch, ring)) = self.link.pop_front() {
            if let Some(marker) = self.tx.on_ring_offer(epoch).unwrap() {
                self.fwd.push(Message::RingFrom {
                    conn_id: 1,
                    epoch,
                    offset: marker,
                });
                self.producer = Some(Producer::new(ring));
            }
        }
    }

    /// Sender handles the receiver's TCP frames.
    fn tx_back(&mut self) {
        while let Some((msg, n)) = self.back.peek() {
            let Message::Consumed { epoch, offset, .. } = msg else {
                panic!("unexpected {msg:?} on the back pipe")
            };
            self.back.advance(n);
            let mut outcome = self.tx.on_consumed(epoch, offset).unwrap();
            if outcome == ConsumedOutcome::FreezeFirst {
                self.tx_freeze();
                outcome = self.tx.on_consumed(epoch, offset).unwrap();
            }
            if let ConsumedOutcome::Resend(r) = outcome {
                let copy = std::mem::take(&mut self.resend);
                let bytes = &copy[r.skip as usize..(r.skip + r.len) as usize];
                for (k, chunk) in bytes.chunks(MAX_DATA_PAYLOAD).enumerate() {
                    self.fwd.push(Message::Data {
                        conn_id: 1,
                        offset: r.from + (k * MAX_DATA_PAYLOAD) as u64,
                        payload: chunk,
                    });
                }
                if self.tx.is_finished() {
                    self.fwd.push(Message::Fin {
                        conn_id: 1,
                        offset: self.tx.sent(),
                    });
                }
            }
        }
    }

    fn check(&mut self, bytes: &[u8]) {
        for (k, b) in bytes.iter().enumerate() {
            assert_eq!(
                *b,
                pattern(self.delivered + k as u64),
                "stream offset {}",
                self.delivered + k as u64
            );
        }
        self.delivered += bytes.len() as u64;
    }

    /// The receiving application reads up to `budget` bytes; the host
    /// handles whatever frames come in the way.
    fn app_read(&mut self, mut budget: usize) {
        loop {
            if self.rx.reads_ring() {
                let c = self.consumer.as_mut().unwrap();
                let mut limit = budget;
                if let RxState::Draining { .. } = self.rx.state() {
                    limit = limit.min(self.rx.ring_remaining() as usize);
                }
                let mut buf = vec![0u8; limit.min(c.capacity() as usize)];
                let n = c.read(&mut buf).unwrap();
                if n > 0 {
                    self.rx.record_ring_taken(n as u64).unwrap();
                    self.check(&buf[..n]);
                    budget -= n;
                }
                if matches!(self.rx.state(), RxState::Ring { .. }) {
                    let c = self.consumer.as_ref().unwrap();
                    let end = c.peer_end().unwrap();
                    if end.fin && c.readable().unwrap() == 0 {
                        self.rx.on_fin(self.rx.taken()).unwrap();
                    }
                }
                if !self.rx.reads_ring() {
                    self.consumer = None; // drained: release the old ring
                }
                if budget == 0 {
                    return;
                }
            }
            // Frames on the TCP leg: control always, data when takeable.
            let Some((msg, n)) = self.fwd.peek() else {
                return;
            };
            match msg {
                Message::Data {
                    offset, payload, ..
                } => {
                    if !self.rx.tcp_data_takeable() || payload.len() > budget {
                        return;
                    }
                    let payload = payload.to_vec();
                    self.fwd.advance(n);
                    self.rx.on_data(offset, payload.len() as u64).unwrap();
                    self.check(&payload);
                    budget -= payload.len();
                }
                Message::TxFreeze { epoch, offset, .. } => {
                    let readable = match (self.rx.state(), &self.consumer) {
                        (RxState::Ring { .. }, Some(c)) => c.readable().unwrap() as u64,
                        _ => 0,
                    };
                    self.fwd.advance(n);
                    if let Some(c) = self.rx.on_tx_freeze(epoch, Some(offset), readable).unwrap() {
                        self.back.push(Message::Consumed {
                            conn_id: 1,
                            epoch: c.epoch,
                            offset: c.offset,
                        });
                    }
                    if !self.rx.reads_ring() {
                        self.consumer = None;
                        if matches!(self.rx.state(), RxState::Tcp) {
                            self.offered = None;
                        }
                    }
                }
                Message::RingFrom { epoch, offset, .. } => {
                    if !self.rx.tcp_data_takeable() {
                        return;
                    }
                    self.fwd.advance(n);
                    if self.rx.on_ring_from(epoch, offset).unwrap() == RingFromOutcome::Switch {
                        let ring = self.offered.take().unwrap();
                        self.consumer = Some(Consumer::new(ring));
                    }
                }
                Message::Fin { offset, .. } => {
                    if !self.rx.tcp_data_takeable() {
                        return;
                    }
                    self.fwd.advance(n);
                    self.rx.on_fin(offset).unwrap();
                }
                other => panic!("unexpected {other:?} on the forward pipe"),
            }
        }
    }

    fn quiescent(&self) -> bool {
        self.fwd.is_empty() && self.back.is_empty() && self.link.is_empty()
    }
}

#[derive(Clone, Copy, Debug)]
enum Who {
    A,
    B,
    Both,
}

#[derive(Clone, Debug)]
enum Op {
    Write { ab: bool, len: usize },
    Read { ab: bool, len: usize },
    Move(Who),
    PeerGoneNoticed { ab: bool },
    PeerBack,
    Pump { ab: bool },
    Shutdown { ab: bool },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (any::<bool>(), 0usize..6000).prop_map(|(ab, len)| Op::Write { ab, len }),
        6 => (any::<bool>(), 0usize..6000).prop_map(|(ab, len)| Op::Read { ab, len }),
        2 => prop_oneof![Just(Who::A), Just(Who::B), Just(Who::Both)].prop_map(Op::Move),
        1 => any::<bool>().prop_map(|ab| Op::PeerGoneNoticed { ab }),
        2 => Just(Op::PeerBack),
        3 => any::<bool>().prop_map(|ab| Op::Pump { ab }),
        1 => any::<bool>().prop_map(|ab| Op::Shutdown { ab }),
    ]
}

struct World {
    /// A -> B
    ab: Direction,
    /// B -> A
    ba: Direction,
}

impl World {
    fn dir(&mut self, ab: bool) -> &mut Direction {
        if ab {
            &mut self.ab
        } else {
            &mut self.ba
        }
    }

    /// `mover_sends_ab`: whether the mover is A (sender of ab, receiver of ba).
    fn move_one(&mut self, a: bool) {
        let (sending, receiving) = if a {
            (&mut self.ab, &mut self.ba)
        } else {
            (&mut self.ba, &mut self.ab)
        };
        sending.tx_freeze();
        receiving.rx_move();
        // The peer that stayed loses the link too: an offer it has out can
        // no longer be taken, and it abandons it (as both hosts do).
        if matches!(sending.rx.state(), RxState::Offered { .. }) {
            sending.rx_move();
        }
        // The link dies with the move: queued offers are lost.
        self.ab.link.clear();
        self.ba.link.clear();
    }

    fn apply(&mut self, op: &Op) {
        match *op {
            Op::Write { ab, len } => self.dir(ab).app_write(len),
            Op::Read { ab, len } => self.dir(ab).app_read(len),
            Op::Move(Who::A) => self.move_one(true),
            Op::Move(Who::B) => self.move_one(false),
            Op::Move(Who::Both) => {
                self.move_one(true);
                self.move_one(false);
            }
            Op::PeerGoneNoticed { ab } => self.dir(ab).rx_peer_gone(),
            Op::PeerBack => {
                self.ab.rx_offer();
                self.ba.rx_offer();
            }
            Op::Pump { ab } => {
                let d = self.dir(ab);
                d.tx_back();
                d.tx_link();
            }
            Op::Shutdown { ab } => self.dir(ab).app_shutdown(),
        }
    }

    /// No more moves: let both sides run until everything sent is read.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            for d in [&mut self.ab, &mut self.ba] {
                d.tx_back();
                d.tx_link();
                d.app_read(usize::MAX / 2);
            }
            let done = |d: &Direction| {
                d.quiescent()
                    && d.delivered == d.tx.sent()
                    && !matches!(d.tx.state(), TxState::Frozen { .. })
            };
            if done(&self.ab) && done(&self.ba) {
                return;
            }
        }
        panic!(
            "did not settle: ab {:?}/{:?}, ba {:?}/{:?}",
            self.ab.tx.state(),
            self.ab.rx.state(),
            self.ba.tx.state(),
            self.ba.rx.state()
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn delivered_stream_equals_sent_stream_through_any_moves(
        order in 11u32..=13,
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let mut w = World { ab: Direction::new(order), ba: Direction::new(order) };
        for op in &ops {
            w.apply(op);
        }
        w.settle();
        for d in [&w.ab, &w.ba] {
            prop_assert_eq!(d.delivered, d.tx.sent());
            prop_assert_eq!(d.rx.taken(), d.tx.sent());
            if d.tx.is_finished() {
                prop_assert_eq!(d.rx.eof_at(), Some(d.tx.sent()));
            }
        }
        // After a final return to co-residency, both directions are back on a ring.
        w.apply(&Op::PeerBack);
        w.apply(&Op::Pump { ab: true });
        w.apply(&Op::Pump { ab: false });
        w.settle();
        let phase = xensock_proto::switch::Connection { tx: w.ab.tx.clone(), rx: w.ba.rx.clone() }.phase();
        let finished = w.ab.tx.is_finished() || w.ba.tx.is_finished();
        if !finished {
            prop_assert_eq!(phase, Phase::Ring);
        }
    }
}
