// SPDX-License-Identifier: MIT OR Apache-2.0
//! Properties of the byte ring: bytes read equal bytes written for any ring
//! size and any interleaving of partial writes and reads, notifications are
//! never lost and are batched, and a hostile peer only ever produces errors.

mod common;

use std::sync::atomic::Ordering::Relaxed;

use common::{pattern, pattern_bytes, Region};
use proptest::prelude::*;
use xensock_proto::layout::{MAX_RING_ORDER, MIN_RING_ORDER, PROD_FLAGS_KNOWN};
use xensock_proto::ring::{
    has_unread, peer_line, Consumer, Field, PeerEnd, Producer, Received, RingError, Sent,
};

#[derive(Clone, Debug)]
enum Op {
    Write(usize),
    Read(usize),
    Peek(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..9000).prop_map(Op::Write),
        (0usize..9000).prop_map(Op::Read),
        (0usize..64).prop_map(Op::Peek),
    ]
}

/// Counter start values near and across the 2^32 wrap.
fn start() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(u32::MAX - 100), any::<u32>()]
}

proptest! {
    #[test]
    fn interleaved_partial_writes_and_reads_preserve_the_stream(
        order in MIN_RING_ORDER..=14u32,
        start in start(),
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let region = Region::new(order, start);
        let mut tx = Producer::resume(region.ring, start);
        let mut rx = Consumer::resume(region.ring, start);
        let cap = tx.capacity() as u64;
        let (mut written, mut read) = (0u64, 0u64);
        for op in ops {
            match op {
                Op::Write(len) => {
                    let n = tx.write(&pattern_bytes(written, len)).unwrap() as u64;
                    prop_assert_eq!(n, (len as u64).min(cap - (written - read)));
                    written += n;
                }
                Op::Read(len) => {
                    let mut buf = vec![0u8; len];
                    let n = rx.read(&mut buf).unwrap();
                    prop_assert_eq!(n as u64, (len as u64).min(written - read));
                    prop_assert_eq!(&buf[..n], &pattern_bytes(read, n)[..]);
                    read += n as u64;
                }
                Op::Peek(len) => {
                    let mut buf = vec![0u8; len];
                    let n = rx.peek(&mut buf).unwrap();
                    prop_assert_eq!(&buf[..n], &pattern_bytes(read, n)[..]);
                    // peek consumes nothing
                    prop_assert_eq!(rx.readable().unwrap() as u64, written - read);
                }
            }
            prop_assert_eq!(tx.free_space().unwrap() as u64 + rx.readable().unwrap() as u64, cap);
        }
    }

    #[test]
    fn read_back_returns_exactly_the_unconsumed_bytes(
        order in MIN_RING_ORDER..=13u32,
        start in start(),
        w1 in 0usize..9000, r1 in 0usize..9000, w2 in 0usize..9000,
    ) {
        let region = Region::new(order, start);
        let mut tx = Producer::resume(region.ring, start);
        let mut rx = Consumer::resume(region.ring, start);
        let a = tx.write(&pattern_bytes(0, w1)).unwrap() as u64;
        let mut sink = vec![0u8; r1];
        let r = rx.read(&mut sink).unwrap() as u64;
        let b = tx.write(&pattern_bytes(a, w2)).unwrap() as u64;
        let mut back = vec![0u8; tx.capacity() as usize];
        let n = tx.read_back(&mut back).unwrap() as u64;
        prop_assert_eq!(n, a + b - r);
        prop_assert_eq!(&back[..n as usize], &pattern_bytes(r, n as usize)[..]);
    }

    /// Whatever a hostile peer writes into its fields, every call returns
    /// either a sane value or an error, never panics, and never returns more
    /// bytes than asked or than the ring holds.
    #[test]
    fn hostile_peer_values_yield_errors_not_panics(
        order in MIN_RING_ORDER..=12u32,
        scribbles in proptest::collection::vec((0u8..4, any::<u32>(), 0usize..5000), 1..60),
    ) {
        let region = Region::new(order, 0);
        let mut tx = Producer::new(region.ring);
        let mut rx = Consumer::new(region.ring);
        let cap = tx.capacity() as usize;
        let h = region.ring.header();
        for (what, value, len) in scribbles {
            match what {
                0 => h.producer.prod.store(value, Relaxed),
                1 => h.consumer.cons.store(value, Relaxed),
                2 => h.producer.flags.store(value, Relaxed),
                _ => h.consumer.flags.store(value, Relaxed),
            }
            let mut buf = vec![0u8; len];
            if let Ok(n) = rx.read(&mut buf) { prop_assert!(n <= len.min(cap)); }
            if let Ok(n) = rx.peek(&mut buf) { prop_assert!(n <= len.min(cap)); }
            if let Ok(n) = tx.write(&buf) { prop_assert!(n <= len.min(cap)); }
            if let Ok(free) = tx.free_space() { prop_assert!(free as usize <= cap); }
            let mut back = vec![0u8; cap];
            if let Ok(n) = tx.read_back(&mut back) { prop_assert!(n <= cap); }
            let _ = rx.prepare_wait();
            let _ = tx.prepare_wait(len as u32);
            match rx.peer_end() {
                Ok(_) => prop_assert_eq!(h.producer.flags.load(Relaxed) & !PROD_FLAGS_KNOWN, 0),
                Err(e) => prop_assert!(matches!(e, RingError::UnknownFlags(_))),
            }
            let _ = tx.flush();
            let _ = rx.flush();
        }
    }
}

#[test]
fn forged_producer_index_is_reported_as_corrupt() {
    let region = Region::new(12, 0);
    let rx = Consumer::new(region.ring);
    region.ring.header().producer.prod.store(4097, Relaxed);
    assert_eq!(
        rx.readable(),
        Err(RingError::Corrupt {
            field: Field::Prod,
            seen: 4097,
            ours: 0
        })
    );
}

#[test]
fn consumer_index_moving_backwards_or_past_prod_is_corrupt() {
    let region = Region::new(12, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    tx.write(&[1; 100]).unwrap();
    rx.read(&mut [0; 50]).unwrap();
    assert_eq!(tx.free_space(), Ok(4096 - 50));
    region.ring.header().consumer.cons.store(10, Relaxed);
    assert!(matches!(
        tx.free_space(),
        Err(RingError::Corrupt {
            field: Field::Cons,
            ..
        })
    ));
    region.ring.header().consumer.cons.store(101, Relaxed);
    assert!(matches!(
        tx.free_space(),
        Err(RingError::Corrupt {
            field: Field::Cons,
            ..
        })
    ));
}

#[test]
fn a_waiting_consumer_gets_one_kick_per_burst() {
    let region = Region::new(12, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    // A fresh ring's event index asks for a kick on the first byte.
    tx.write(b"a").unwrap();
    assert!(tx.flush());
    // Nobody waits any more: later writes need no kick.
    tx.write(b"b").unwrap();
    assert!(!tx.flush());
    rx.read(&mut [0; 2]).unwrap();
    // The consumer goes to sleep on an empty ring.
    assert!(rx.prepare_wait().unwrap());
    tx.write(b"bc").unwrap();
    tx.write(b"de").unwrap();
    assert!(tx.flush(), "the burst that crossed the event index kicks");
    tx.write(b"f").unwrap();
    assert!(
        !tx.flush(),
        "later writes in the same wait do not kick again"
    );
    // Data arriving between setting the event and sleeping is seen.
    let mut buf = [0u8; 8];
    rx.read(&mut buf).unwrap();
    tx.write(b"g").unwrap();
    assert!(
        !rx.prepare_wait().unwrap(),
        "re-check after setting the event sees the byte"
    );
}

#[test]
fn a_waiting_producer_is_kicked_once_enough_space_frees() {
    let region = Region::new(12, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    assert_eq!(tx.write(&[7; 5000]).unwrap(), 4096);
    assert!(tx.prepare_wait(1000).unwrap());
    rx.read(&mut [0; 500]).unwrap();
    assert!(
        !rx.flush(),
        "500 bytes free is not what the producer waits for"
    );
    rx.read(&mut [0; 500]).unwrap();
    assert!(rx.flush(), "1000 bytes free crosses the event index");
    assert_eq!(tx.free_space(), Ok(1000));
}

#[test]
fn flags_end_the_stream_and_stop_waiting() {
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    tx.write(b"last").unwrap();
    tx.finish();
    assert!(rx.peer_end().unwrap().fin);
    assert!(!rx.prepare_wait().unwrap());
    assert_eq!(rx.read(&mut [0; 8]).unwrap(), 4);
    assert_eq!(rx.readable(), Ok(0));
    rx.close();
    assert!(tx.reader_end().unwrap().closed);
    assert!(!tx.prepare_wait(1).unwrap());
}

/// Two threads, real atomics, random chunking: the stream arrives intact.
#[test]
fn two_threads_stream_through_every_ring_size() {
    for order in [MIN_RING_ORDER, 12, 16, MAX_RING_ORDER] {
        // The region outlives the writer thread: it is joined before drop.
        let region = Region::new(order, u32::MAX - 5000);
        let total: u64 = 3 << 20;
        let ring = region.ring;
        let writer = std::thread::spawn(move || {
            let mut tx = Producer::resume(ring, u32::MAX - 5000);
            let mut sent = 0u64;
            let mut chunk = 1usize;
            while sent < total {
                let len = chunk.min((total - sent) as usize);
                let n = tx.write(&pattern_bytes(sent, len)).unwrap();
                sent += n as u64;
                if n == 0 {
                    std::thread::yield_now();
                }
                tx.flush();
                chunk = chunk * 7 % 70_001 + 1;
            }
        });
        let mut rx = Consumer::resume(ring, u32::MAX - 5000);
        let mut got = 0u64;
        let mut buf = vec![0u8; 100_000];
        let mut chunk = 3usize;
        while got < total {
            let n = rx.read(&mut buf[..chunk]).unwrap();
            for (k, b) in buf[..n].iter().enumerate() {
                assert_eq!(
                    *b,
                    pattern(got + k as u64),
                    "order {order} offset {}",
                    got + k as u64
                );
            }
            got += n as u64;
            if n == 0 {
                std::thread::yield_now();
            }
            rx.flush();
            chunk = chunk * 13 % 99_991 + 1;
        }
        writer.join().unwrap();
        drop(region);
    }
}

/// A peer scribbling over the data area cannot make us read outside it: the
/// payload is garbage, the indices still validate, nothing panics.
#[test]
fn scribbled_payload_is_only_garbage() {
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    tx.write(&[1; 2048]).unwrap();
    // SAFETY: the data area is 2048 bytes and only this thread uses it.
    unsafe { std::ptr::write_bytes(region.data_ptr(), 0xEE, 2048) };
    let mut buf = [0u8; 4096];
    assert_eq!(rx.read(&mut buf).unwrap(), 2048);
    assert!(buf[..2048].iter().all(|b| *b == 0xEE));
}

#[test]
fn skip_then_read_never_reads_past_prod() {
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    tx.write(&pattern_bytes(0, 10)).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!(rx.read(&mut buf).unwrap(), 4);
    tx.write(&pattern_bytes(10, 10)).unwrap();
    assert_eq!(rx.skip(12).unwrap(), 12);
    let mut rest = [0u8; 64];
    assert_eq!(rx.read(&mut rest).unwrap(), 4);
    assert_eq!(&rest[..4], &pattern_bytes(16, 4)[..]);
    assert_eq!(rx.read(&mut rest).unwrap(), 0);
}

#[test]
fn a_send_step_reads_the_readers_flags_before_it_writes() {
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    // A fresh ring asks for a kick on the first byte.
    assert_eq!(tx.send(b"ab"), Ok(Sent::Bytes { n: 2, kick: true }));
    assert_eq!(tx.send(b"c"), Ok(Sent::Bytes { n: 1, kick: false }));
    assert_eq!(
        tx.send(&[0; 4096]),
        Ok(Sent::Bytes {
            n: 2045,
            kick: false
        })
    );
    assert_eq!(tx.send(b"d"), Ok(Sent::Full));
    rx.read(&mut [0; 16]).unwrap();
    rx.close();
    assert_eq!(
        tx.send(b"d"),
        Ok(Sent::ReaderClosed),
        "a closed reader gets nothing"
    );
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    rx.reset();
    assert_eq!(tx.send(b"x"), Ok(Sent::ReaderReset));
    assert_eq!(tx.unconsumed(), Ok(0));
}

#[test]
fn a_receive_step_reads_the_writers_flags_before_it_reads() {
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    assert_eq!(
        rx.receive(&mut [0; 8]),
        Ok(Received::Empty(PeerEnd::default()))
    );
    tx.write(b"abc").unwrap();
    let mut buf = [0u8; 2];
    // a fresh ring's producer hears of the first space
    assert_eq!(
        rx.receive(&mut buf),
        Ok(Received::Bytes { n: 2, kick: true })
    );
    assert_eq!(&buf, b"ab");
    tx.finish();
    assert_eq!(
        rx.receive(&mut buf),
        Ok(Received::Bytes { n: 1, kick: false })
    );
    match rx.receive(&mut buf) {
        Ok(Received::Empty(end)) => assert!(end.fin, "FIN, then empty: the end"),
        other => panic!("{other:?}"),
    }
    // a reset drops what is unread
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    tx.write(b"lost").unwrap();
    tx.reset();
    assert_eq!(rx.receive(&mut [0; 8]), Ok(Received::Reset));
    // a producer that waits for space is kicked once it is there
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    tx.write(&[7; 2048]).unwrap();
    assert!(tx.prepare_wait(1).unwrap());
    assert_eq!(
        rx.receive(&mut [0; 16]),
        Ok(Received::Bytes { n: 16, kick: true })
    );
}

#[test]
fn each_side_sees_the_other_waiting_and_an_interrupt_sees_moves() {
    let region = Region::new(11, 0);
    let mut tx = Producer::new(region.ring);
    let mut rx = Consumer::new(region.ring);
    // A fresh ring's consumer waits for the first byte.
    assert!(tx.consumer_waiting());
    tx.write(b"ab").unwrap();
    tx.flush();
    assert!(has_unread(&region.ring));
    let before = peer_line(&region.ring, true);
    tx.write(b"c").unwrap();
    assert_ne!(peer_line(&region.ring, true), before, "prod moved");
    rx.read(&mut [0; 8]).unwrap();
    assert!(!has_unread(&region.ring));
    assert!(!tx.consumer_waiting(), "it has not asked for more yet");
    assert!(rx.prepare_wait().unwrap());
    assert!(tx.consumer_waiting());
    // The producer waits for space once the ring is full.
    assert!(!rx.producer_waiting());
    tx.write(&[0; 4096]).unwrap();
    assert!(tx.prepare_wait(100).unwrap());
    assert!(rx.producer_waiting());
    let before = peer_line(&region.ring, false);
    rx.read(&mut [0; 16]).unwrap();
    rx.flush();
    assert_ne!(peer_line(&region.ring, false), before, "cons moved");
    // A producer that resumes at the consumer's position continues there.
    let again = Producer::resume_at_consumer(region.ring);
    assert_eq!(again.position(), rx.position());
}
