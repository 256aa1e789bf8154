// SPDX-License-Identifier: MIT OR Apache-2.0
//! A hostile or broken peer can only break its own connection: a ring index
//! out of range, or an offset out of range in a control frame, resets the
//! connection (ECONNRESET) instead of hanging, panicking or delivering
//! wrong bytes. Also the raw leg's one race a reader can lose (it reads on
//! past a run's end before the run's `RingFrom` came), played by hand: the
//! random switches of `stream.rs` never produced it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::support::*;
use crate::carrier::testbed::MemfdRing;
use crate::carrier::testbed::*;
use crate::carrier::{Doorbell, InitialRings, RingAlloc, Switch, SwitchConfig, Trigger};
use xensock_proto::ctrl::Message;

fn no_alloc() -> RingAlloc {
    Box::new(|_| Err(std::io::ErrorKind::Unsupported.into()))
}

#[test]
fn corrupt_ring_index_resets_the_connection() {
    let rx = MemfdRing::new_ring(11, identity(1, 2, 71, 0)).unwrap();
    let tx = MemfdRing::new_ring(11, identity(2, 1, 72, 0)).unwrap();
    // The peer's view of the ring we read: it claims more bytes than fit.
    let peer_view = rx.for_peer.clone();
    let la = listener("127.0.0.1".parse().unwrap());
    let e = Switch::start(
        SwitchConfig::new(71, 72, COOKIE, None),
        Some(InitialRings {
            rx: rx.local,
            tx: tx.for_peer,
        }),
        la,
        Doorbell::new().unwrap(),
        Arc::new(|| {}),
        no_alloc(),
    )
    .unwrap();
    let ring = peer_view.ring();
    ring.header()
        .producer
        .prod
        .store(2048 + 100, Ordering::Release);
    let mut b = [0u8; 16];
    assert_reset(&e, e.read(&mut b).unwrap_err(), "ring");
    // The driver tells the peer: RESET on the ring we write.
    let peer_rx = tx.local.ring();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while peer_rx.header().producer.flags.load(Ordering::Acquire)
        & xensock_proto::layout::PROD_FLAG_RESET
        == 0
    {
        assert!(std::time::Instant::now() < deadline, "no RESET flag");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn consumed_beyond_what_was_sent_resets_the_connection() {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let la = listener("127.0.0.1".parse().unwrap());
    let e = lone_engine(
        81,
        82,
        Some(fake.local_addr().unwrap()),
        la.clone(),
        true,
        Duration::from_secs(20),
    );
    assert_eq!(e.write(b"0123456789").unwrap(), 10);
    e.freeze(Trigger::LocalMove).unwrap();
    // The switch's leg (its stream's way, our control frames' way back):
    // only its hello so far.
    let (mut leg, _) = fake.accept().unwrap();
    let mut hello = [0u8; 16];
    leg.read_exact(&mut hello).unwrap();
    // Our leg to it, where its control frames come: the TxFreeze{epoch 0,
    // offset 10}, then the Consumed for its receiving ring.
    let mut back = TcpStream::connect(la.local_addr()).unwrap();
    back.write_all(&frame(&Message::TcpHello {
        conn_id: 81,
        cookie: COOKIE,
    }))
    .unwrap();
    back.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let freeze = Message::TxFreeze {
        conn_id: 82,
        epoch: 0,
        offset: 10,
    };
    let consumed = Message::Consumed {
        conn_id: 82,
        epoch: 0,
        offset: 0,
    };
    let mut want = vec![0u8; freeze.encoded_len() + consumed.encoded_len()];
    let n = freeze.encode(&mut want).unwrap();
    consumed.encode(&mut want[n..]).unwrap();
    let mut first = vec![0u8; want.len()];
    back.read_exact(&mut first).unwrap();
    assert_eq!(first, want);
    let bad = Message::Consumed {
        conn_id: 81,
        epoch: 0,
        offset: 1 << 40,
    };
    let mut buf = vec![0u8; bad.encoded_len()];
    bad.encode(&mut buf).unwrap();
    leg.write_all(&buf).unwrap();
    // The writer is frozen until a valid Consumed: it gets the reset.
    assert_reset(&e, e.write(b"more").unwrap_err(), "outside");
    // And the peer is told, on the control stream.
    let mut reset = [0u8; 12];
    back.read_exact(&mut reset).unwrap();
    assert_eq!(reset[1], 5, "a Reset frame");
}

/// The raw leg's one case where a reader reads past a run's end before the
/// run's `RingFrom` reached it (`docs/protocol.md` 5.4): the receiver
/// abandoned a ring offer the sender had already taken at offset 100, the
/// sender resent from 100, and those bytes came before its `RingFrom`. The
/// test plays the sender; `next_run` is where its next `RawFrom` says the
/// resend starts.
fn read_past_a_run_end(local: u32, next_run: u64) -> (Switch, Vec<u8>, std::io::Result<usize>) {
    let peer = local + 1;
    let HandPeer {
        switch: e,
        mut control_to_engine,
        mut stream_to_engine,
    } = hand_peer(
        local,
        listener("127.0.0.1".parse().unwrap()),
        Duration::from_secs(20),
    );
    let stream: Vec<u8> = (0..300u32).map(|i| pattern(7, u64::from(i))).collect();
    let mut got = vec![0u8; 300];
    let read_to = |e: &Switch, end: usize, got: &mut Vec<u8>, at: &mut usize| {
        while *at < end {
            let n = e.read(&mut got[*at..end]).unwrap();
            assert!(n > 0, "end of stream at {at}");
            *at += n;
        }
    };
    let mut at = 0;
    control_to_engine
        .write_all(&frame(&Message::RawFrom {
            conn_id: local,
            offset: 0,
        }))
        .unwrap();
    stream_to_engine.write_all(&stream[..100]).unwrap();
    read_to(&e, 100, &mut got, &mut at);
    // The switch offers ring 1 and gives the offer up: its Consumed{1, 100}
    // comes back to us (after its own RawFrom{0}).
    let (epoch, _ring) = e.offer_ring().unwrap().unwrap();
    assert_eq!(epoch, 1);
    assert!(e.abandon_offer(1));
    stream_to_engine
        .set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    let mut control_from_engine = vec![0u8; 16 + 24];
    stream_to_engine
        .read_exact(&mut control_from_engine)
        .unwrap();
    assert_eq!(
        control_from_engine[16..],
        frame(&Message::Consumed {
            conn_id: peer,
            epoch: 1,
            offset: 100
        })[..]
    );
    // We had moved onto ring 1 at 100: the resend from 100 is on its way
    // before our RingFrom, and the switch reads it as the run's.
    stream_to_engine.write_all(&stream[100..150]).unwrap();
    read_to(&e, 150, &mut got, &mut at);
    for m in [
        Message::RingFrom {
            conn_id: local,
            epoch: 1,
            offset: 100,
        },
        Message::TxFreeze {
            conn_id: local,
            epoch: 1,
            offset: 150,
        },
        Message::RawFrom {
            conn_id: local,
            offset: next_run,
        },
    ] {
        control_to_engine.write_all(&frame(&m)).unwrap();
    }
    if next_run != 100 {
        // A run that does not continue where the reader is: the switch
        // resets the connection once it reads that RawFrom. The bytes after
        // it wait until then, or a reader could take them before the
        // RawFrom was read (both orders are legal on two TCP streams).
        let end = std::time::Instant::now() + Duration::from_secs(20);
        while e.status().failure.is_none() && std::time::Instant::now() < end {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    stream_to_engine.write_all(&stream[150..]).unwrap();
    let mut rest = [0u8; 150];
    let mut last = Ok(0);
    let mut n = 0;
    while n < rest.len() {
        last = e.read(&mut rest[n..]);
        match last {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    got[150..150 + n].copy_from_slice(&rest[..n]);
    got.truncate(150 + n);
    assert_eq!(got[..], stream[..got.len()]);
    (e, got, last)
}

#[test]
fn a_resend_that_continues_a_run_read_past_its_end_is_taken_whole() {
    let (e, got, last) = read_past_a_run_end(101, 100);
    assert_eq!(got.len(), 300, "{last:?}");
    assert!(e.status().failure.is_none());
}

#[test]
fn a_run_that_does_not_continue_where_the_reader_went_past_resets() {
    let (e, got, last) = read_past_a_run_end(111, 120);
    assert_eq!(got.len(), 150);
    // Which check sees the bad run first depends on whether the switch
    // reads the next RawFrom before or after the reader went past the
    // run's end (a busy machine makes either likely): both reset.
    let why = e.status().failure.unwrap_or_default();
    let reason = if why.contains("RawFrom inside a run") {
        "RawFrom inside a run"
    } else {
        "past a run's end"
    };
    assert_reset(&e, last.unwrap_err(), reason);
}

/// A run the peer opens anywhere but where the reader stands resets the
/// connection.
#[test]
fn a_run_opened_away_from_where_the_reader_stands_resets() {
    let mut p = hand_peer(
        121,
        listener("127.0.0.1".parse().unwrap()),
        Duration::from_secs(20),
    );
    p.control_to_engine
        .write_all(&frame(&Message::RawFrom {
            conn_id: 121,
            offset: 5,
        }))
        .unwrap();
    p.stream_to_engine.write_all(b"abc").unwrap();
    let mut b = [0u8; 8];
    assert_reset(
        &p.switch,
        p.switch.read(&mut b).unwrap_err(),
        "carrier switch",
    );
}

/// A peer that piles up control frames for the receiving direction behind
/// a `RingFrom` that waits for bytes it never sends is in breach: the
/// connection resets instead of queueing without bound.
#[test]
fn control_frames_piled_up_behind_a_waiting_ring_from_reset() {
    let mut p = hand_peer(
        131,
        listener("127.0.0.1".parse().unwrap()),
        Duration::from_secs(20),
    );
    let mut flood = frame(&Message::RawFrom {
        conn_id: 131,
        offset: 0,
    });
    flood.extend(frame(&Message::RingFrom {
        conn_id: 131,
        epoch: 1,
        offset: 1 << 20,
    }));
    for _ in 0..100 {
        flood.extend(frame(&Message::Fin {
            conn_id: 131,
            offset: 1 << 20,
        }));
    }
    p.control_to_engine.write_all(&flood).unwrap();
    // Not a blocking read: without the bound the reader would wait for
    // the run's bytes for ever.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut b = [0u8; 8];
    let err = loop {
        match p.switch.try_read(&mut b) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                assert!(std::time::Instant::now() < deadline, "no reset within 20 s");
                std::thread::sleep(Duration::from_millis(1));
            }
            other => break other.unwrap_err(),
        }
    };
    assert_reset(&p.switch, err, "pile up");
}
