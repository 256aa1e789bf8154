// SPDX-License-Identifier: MIT OR Apache-2.0
//! Fuzz bodies: one function per structure read from a peer, shared by the
//! `cargo fuzz` targets in `fuzz/` and by the tests that replay the corpus
//! and random inputs under `cargo test`. Each panics only when an invariant
//! of this crate is broken; input errors are expected and fine.
//!
//! Enabled by the `arbitrary` feature.

use std::vec;
use std::vec::Vec;

use arbitrary::{Arbitrary, Result, Unstructured};

use crate::ctrl::{
    decode, decode_data_prefix, decode_header, Channel, DecodeError, Message, DATA_PREFIX_LEN,
};
use crate::layout::{GrantDirectory, RingGeometry, RingHeader, RingIdentity, PAGE_SIZE};
use crate::mem::RawRing;
use crate::record::{self, Next, RECORD_FLAG_EOR, RECORD_HEADER_SIZE};
use crate::ring::{Consumer, Producer};
use crate::switch::{RxPath, TxPath};

/// Decodes arbitrary bytes as a frame on both channels. A frame that
/// decodes must re-encode to exactly the bytes it came from (strict,
/// canonical decoding) and never claim more bytes than it was given; a
/// `Data` prefix decoded alone must say what the whole frame says.
pub fn decode_frame(data: &[u8]) {
    for channel in [Channel::Link, Channel::Tcp] {
        let _ = decode_header(data, channel);
        let prefix = decode_data_prefix(data, channel);
        if let Ok((
            Message::Data {
                conn_id,
                offset,
                payload,
            },
            used,
        )) = decode(data, channel)
        {
            let (hdr, at) = prefix.expect("a whole Data frame has a decodable prefix");
            assert_eq!((hdr.conn_id, at, hdr.frame_len()), (conn_id, offset, used));
            assert_eq!(used - DATA_PREFIX_LEN, payload.len());
        }
        match decode(data, channel) {
            Ok((msg, used)) => {
                assert!(used <= data.len());
                assert_eq!(msg.encoded_len(), used);
                let mut out = vec![0u8; used];
                assert_eq!(msg.encode(&mut out), Ok(used));
                assert_eq!(&out[..], &data[..used], "decoding must be canonical");
            }
            Err(DecodeError::Incomplete { needed }) => assert!(needed > data.len()),
            Err(_) => {}
        }
    }
}

/// Encodes an arbitrary message; if it decodes, it must be the same message.
pub fn message_round_trip(u: &mut Unstructured<'_>) -> Result<()> {
    let msg = Message::arbitrary(u)?;
    let mut buf = vec![0u8; msg.encoded_len()];
    if msg.encode(&mut buf).is_err() {
        return Ok(()); // oversized payload
    }
    for channel in [Channel::Link, Channel::Tcp] {
        if let Ok((back, used)) = decode(&buf, channel) {
            assert_eq!(back, msg);
            assert_eq!(used, buf.len());
        }
    }
    Ok(())
}

#[repr(C, align(4096))]
struct Page([u8; PAGE_SIZE]);

/// Page-aligned scratch memory for a ring of up to 64 KiB.
struct Scratch {
    pages: Vec<Page>,
}

impl Scratch {
    fn new(pages: usize) -> Self {
        let mut v = Vec::with_capacity(pages);
        for _ in 0..pages {
            v.push(Page([0; PAGE_SIZE]));
        }
        Scratch { pages: v }
    }

    /// Page-aligned memory for a ring of `geometry`, its base (for writes
    /// that play the peer, with the ring's own provenance) and the ring over
    /// it. Both point into the returned `Scratch`'s heap pages (moving the
    /// `Scratch` does not move them): keep it alive while they are used.
    fn ring(geometry: RingGeometry) -> Result<(Scratch, core::ptr::NonNull<u8>, RawRing)> {
        let mut scratch = Scratch::new(geometry.region_size() / PAGE_SIZE);
        let base = core::ptr::NonNull::new(scratch.pages.as_mut_ptr().cast::<u8>())
            .ok_or(arbitrary::Error::IncorrectFormat)?;
        // SAFETY: the pages are page aligned, region_size bytes long, on the
        // heap, and live as long as the Scratch the caller keeps with the ring.
        let ring = unsafe { RawRing::from_region(base, geometry.region_size(), geometry) }
            .map_err(|_| arbitrary::Error::IncorrectFormat)?;
        Ok((scratch, base, ring))
    }
}

#[derive(Arbitrary, Debug)]
enum RingStep {
    PeerSetProd(u32),
    PeerSetCons(u32),
    PeerSetProdFlags(u32),
    PeerSetConsFlags(u32),
    PeerSetEvents(u32, u32),
    PeerScribble(u16, u8),
    Write(u16),
    Read(u16),
    Peek(u16),
    ReadBack,
    WaitData,
    WaitSpace(u32),
    Flush,
}

/// Our producer and consumer on a ring whose peer-written fields a hostile
/// peer sets at will. Every call must return a sane value or an error.
pub fn ring_with_hostile_peer(u: &mut Unstructured<'_>) -> Result<()> {
    let order = u.int_in_range(11..=16u32)?;
    let geometry = RingGeometry::new(order).map_err(|_| arbitrary::Error::IncorrectFormat)?;
    let (scratch, base, ring) = Scratch::ring(geometry)?;
    let mut tx = Producer::new(ring);
    let mut rx = Consumer::new(ring);
    let cap = geometry.data_size();
    let mut buf = vec![0u8; cap * 2];
    let h = ring.header();
    use core::sync::atomic::Ordering::Relaxed;
    for _ in 0..u.int_in_range(1..=64usize)? {
        match RingStep::arbitrary(u)? {
            RingStep::PeerSetProd(v) => h.producer.prod.store(v, Relaxed),
            RingStep::PeerSetCons(v) => h.consumer.cons.store(v, Relaxed),
            RingStep::PeerSetProdFlags(v) => h.producer.flags.store(v, Relaxed),
            RingStep::PeerSetConsFlags(v) => h.consumer.flags.store(v, Relaxed),
            RingStep::PeerSetEvents(a, b) => {
                h.producer.space_event.store(a, Relaxed);
                h.consumer.data_event.store(b, Relaxed);
            }
            RingStep::PeerScribble(at, byte) => {
                let idx = at as usize % cap;
                // SAFETY: idx < data_size, inside the data area of scratch.
                unsafe { base.as_ptr().add(geometry.data_offset() + idx).write(byte) };
            }
            RingStep::Write(n) => {
                let n = n as usize % (cap * 2);
                if let Ok(w) = tx.write(&buf[..n]) {
                    assert!(w <= n.min(cap));
                }
            }
            RingStep::Read(n) => {
                let n = n as usize % (cap * 2);
                if let Ok(r) = rx.read(&mut buf[..n]) {
                    assert!(r <= n.min(cap));
                }
            }
            RingStep::Peek(n) => {
                let n = n as usize % (cap * 2);
                if let Ok(r) = rx.peek(&mut buf[..n]) {
                    assert!(r <= n.min(cap));
                }
            }
            RingStep::ReadBack => {
                if let Ok(r) = tx.read_back(&mut buf) {
                    assert!(r <= cap);
                }
            }
            RingStep::WaitData => {
                let _ = rx.prepare_wait();
            }
            RingStep::WaitSpace(want) => {
                let _ = tx.prepare_wait(want);
            }
            RingStep::Flush => {
                let _ = tx.flush();
                let _ = rx.flush();
            }
        }
        if let Ok(free) = tx.free_space() {
            assert!(free as usize <= cap);
        }
        if let Ok(readable) = rx.readable() {
            assert!(readable as usize <= cap);
        }
    }
    drop(scratch);
    Ok(())
}

/// A header page and a grant directory page filled with arbitrary bytes,
/// checked against an arbitrary announced identity and read once.
pub fn header_and_directory(u: &mut Unstructured<'_>) -> Result<()> {
    let expected = RingIdentity::arbitrary(u)?;
    let mut pages = Scratch::new(2);
    for page in pages.pages.iter_mut() {
        for b in page.0.iter_mut() {
            *b = u8::arbitrary(u).unwrap_or(0);
        }
    }
    let header_ptr = pages.pages[0].0.as_ptr().cast::<RingHeader>();
    let dir_ptr = pages.pages[1].0.as_ptr().cast::<GrantDirectory>();
    // SAFETY: both pages are 4096-aligned, fully initialised, and the types
    // consist of atomics only, valid for every bit pattern.
    let (header, dir) = unsafe { (&*header_ptr, &*dir_ptr) };
    if header.verify(&expected).is_ok() {
        assert_eq!(
            header
                .identity
                .magic
                .load(core::sync::atomic::Ordering::Relaxed),
            expected.magic
        );
    }
    let count = u.int_in_range(0..=1100usize)?;
    let mut refs = vec![0u32; count];
    let _ = dir.read_refs(&mut refs);
    Ok(())
}

#[derive(Arbitrary, Debug)]
enum PeerFrame {
    Consumed(u32, u64),
    TxFreeze(u32, Option<u64>),
    Data(u64, u64),
    RingFrom(u32, u64),
    Fin(u64),
    Offer(u32),
    LocalWrite(u64),
    LocalRingTaken(u64),
    LocalFreeze(u64),
    LocalMove,
    LocalOffer,
}

/// The carrier state machine fed hostile frames and arbitrary local
/// events: errors are fine, panics and inconsistent offsets are not.
pub fn switch_with_hostile_peer(u: &mut Unstructured<'_>) -> Result<()> {
    let mut tx = if bool::arbitrary(u)? {
        TxPath::on_ring()
    } else {
        TxPath::on_tcp()
    };
    let mut rx = if bool::arbitrary(u)? {
        RxPath::on_ring()
    } else {
        RxPath::on_tcp()
    };
    for _ in 0..u.int_in_range(1..=64usize)? {
        let before = tx.sent();
        match PeerFrame::arbitrary(u)? {
            PeerFrame::Consumed(e, o) => {
                if let Ok(crate::switch::ConsumedOutcome::Resend(r)) = tx.on_consumed(e, o) {
                    assert_eq!(r.from + r.len, tx.sent());
                }
            }
            PeerFrame::TxFreeze(e, sent) => {
                let _ = rx.on_tx_freeze(e, sent);
            }
            PeerFrame::Data(o, len) => {
                let _ = rx.on_data(o, len % (1 << 16));
            }
            PeerFrame::RingFrom(e, o) => {
                let _ = rx.on_ring_from(e, o);
            }
            PeerFrame::Fin(o) => {
                let _ = rx.on_fin(o);
            }
            PeerFrame::Offer(e) => {
                let _ = tx.on_ring_offer(e);
            }
            PeerFrame::LocalWrite(n) => {
                let _ = tx.record_sent(n % (1 << 20));
            }
            PeerFrame::LocalRingTaken(n) => {
                let _ = rx.record_ring_taken(n % (1 << 20));
            }
            PeerFrame::LocalFreeze(n) => {
                let _ = tx.freeze(n);
            }
            PeerFrame::LocalMove => {
                let _ = rx.freeze_local();
            }
            PeerFrame::LocalOffer => {
                let _ = rx.offer_ring();
            }
        }
        assert!(tx.sent() >= before, "the send offset never goes back");
    }
    Ok(())
}

#[derive(Arbitrary, Debug)]
enum RecordStep {
    /// The peer publishes these bytes as they are (any header, any split).
    PeerWrite(Vec<u8>),
    /// The peer sends an honest record of this size.
    PeerRecord(u16, bool),
    /// The peer scribbles on a data byte.
    PeerScribble(u16, u8),
    /// We look at the next record and read up to this many payload bytes.
    Recv(u16, bool),
    /// We wait for what `next_record` asked for.
    Wait,
}

/// Our record reader on a ring a hostile peer writes: records it accepts
/// are within the ring and whole; bad headers are errors, not panics.
pub fn records_from_hostile_peer(u: &mut Unstructured<'_>) -> Result<()> {
    let order = u.int_in_range(11..=14u32)?;
    let geometry = RingGeometry::new(order).map_err(|_| arbitrary::Error::IncorrectFormat)?;
    let (scratch, base, ring) = Scratch::ring(geometry)?;
    let mut peer = Producer::new(ring);
    let mut rx = Consumer::new(ring);
    let cap = geometry.data_size() as u32;
    let mut buf = vec![0u8; cap as usize];
    let mut need = RECORD_HEADER_SIZE;
    for _ in 0..u.int_in_range(1..=64usize)? {
        match RecordStep::arbitrary(u)? {
            RecordStep::PeerWrite(bytes) => {
                let _ = peer.write(&bytes);
            }
            RecordStep::PeerRecord(n, eor) => {
                let n = (n as usize).min(buf.len());
                let flags = if eor { RECORD_FLAG_EOR } else { 0 };
                let _ = record::write_record(&mut peer, flags, &buf[..n]);
            }
            RecordStep::PeerScribble(at, byte) => {
                let idx = at as usize % cap as usize;
                // SAFETY: idx < data_size, inside the data area of scratch.
                unsafe { base.as_ptr().add(geometry.data_offset() + idx).write(byte) };
            }
            RecordStep::Recv(room, consume) => match record::next_record(&rx) {
                Ok(Next::Ready(h)) => {
                    assert!(h.len <= record::max_payload(cap));
                    assert!(rx.readable().is_ok_and(|r| r >= h.total()));
                    let room = (room as usize).min(buf.len());
                    if let Ok(got) = record::read_payload(&rx, &h, 0, &mut buf[..room]) {
                        assert_eq!(got, room.min(h.len as usize));
                    }
                    if consume {
                        assert!(record::consume(&mut rx, &h).is_ok());
                    }
                }
                Ok(Next::Incomplete { need: n }) => {
                    assert!((RECORD_HEADER_SIZE..=cap).contains(&n));
                    need = n;
                }
                Err(_) => return Ok(()),
            },
            RecordStep::Wait => {
                let _ = rx.prepare_wait_for(need);
                let _ = peer.flush();
            }
        }
    }
    drop(scratch);
    Ok(())
}
