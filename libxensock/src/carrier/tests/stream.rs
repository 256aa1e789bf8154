// SPDX-License-Identifier: MIT OR Apache-2.0
//! The carrier switch with real rings and real TCP legs: a checksummed
//! bidirectional stream survives freezes and returns to the ring injected
//! at random points, by either side or both at once, with full rings and
//! during FIN. `XENSOCK_CARRIER_CASES` sets the number of cases (default
//! 48; runs of 2000 and 1500 cases passed in release builds).

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use super::support::*;
use crate::carrier::testbed::*;
use crate::carrier::{Switch, Trigger};
use proptest::prelude::*;
use xensock_proto::switch::{RxState, TxState};

#[derive(Clone, Copy, Debug)]
enum Event {
    /// A moves (suspend/resume): freezes both its directions.
    MoveA,
    MoveB,
    /// Both move at the same moment.
    MoveBoth,
    /// B moves and A learns it from the link at once (before B's
    /// TxFreeze arrives): A leaves its ring, keeping what it took.
    MoveBNoticedByA,
    MoveANoticedByB,
    /// A notices B gone later (a no-op unless A still reads a ring B
    /// stopped writing).
    PeerGoneA,
    /// Co-resident again: each receiver offers a ring, the sender takes it.
    Back,
    /// B offers a ring, then A moves before the offer is delivered; the
    /// stale offer arrives afterwards.
    BackStale,
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        3 => Just(Event::MoveA),
        3 => Just(Event::MoveB),
        2 => Just(Event::MoveBoth),
        2 => Just(Event::MoveBNoticedByA),
        2 => Just(Event::MoveANoticedByB),
        1 => Just(Event::PeerGoneA),
        4 => Just(Event::Back),
        1 => Just(Event::BackStale),
    ]
}

fn offer(from: &Switch, to: &Switch) {
    if let Ok(Some((epoch, ring))) = from.offer_ring() {
        to.accept_ring_offer(epoch, ring).unwrap();
    }
}

/// `x` noticed its peer `y` gone: only once `y` no longer writes a ring.
fn peer_gone(x: &Switch, y: &Switch) {
    if !matches!(y.status().tx, TxState::Ring { .. }) {
        x.freeze(Trigger::PeerGone).unwrap();
    }
}

fn apply(p: &Pair, ev: Event) {
    match ev {
        Event::MoveA => p.a.freeze(Trigger::LocalMove).unwrap(),
        Event::MoveB => p.b.freeze(Trigger::LocalMove).unwrap(),
        Event::MoveBoth => {
            let b = p.b.clone();
            let t = std::thread::spawn(move || b.freeze(Trigger::LocalMove).unwrap());
            p.a.freeze(Trigger::LocalMove).unwrap();
            t.join().unwrap();
        }
        Event::MoveBNoticedByA => {
            p.b.freeze(Trigger::LocalMove).unwrap();
            peer_gone(&p.a, &p.b);
        }
        Event::MoveANoticedByB => {
            p.a.freeze(Trigger::LocalMove).unwrap();
            peer_gone(&p.b, &p.a);
        }
        Event::PeerGoneA => peer_gone(&p.a, &p.b),
        Event::Back => {
            offer(&p.a, &p.b);
            offer(&p.b, &p.a);
        }
        Event::BackStale => {
            let stale = p.b.offer_ring().unwrap();
            p.a.freeze(Trigger::LocalMove).unwrap();
            if let Some((epoch, ring)) = stale {
                p.a.accept_ring_offer(epoch, ring).unwrap();
            }
        }
    }
}

struct Case {
    order: u32,
    len_ab: u64,
    len_ba: u64,
    max_chunk: u64,
    seed: u64,
    events: Vec<(u64, Event)>,
    ipv6: bool,
}

fn run(case: &Case) -> Result<(), String> {
    let opts = PairOptions {
        order: case.order,
        ip: if case.ipv6 {
            "::1".parse().unwrap()
        } else {
            "127.0.0.1".parse().unwrap()
        },
        ..PairOptions::default()
    };
    let p = pair(&opts).map_err(|e| e.to_string())?;
    let (done_tx, done_rx) = mpsc::channel::<(&'static str, Result<(u64, u64), String>)>();
    let spawn_writer = |e: Arc<Switch>, name: &'static str, seed: u64, len: u64| {
        let done = done_tx.clone();
        let (s, mc) = (case.seed, case.max_chunk);
        std::thread::spawn(move || {
            let r = write_stream(&e, seed, len, s ^ 0x77, mc)
                .map(|sum| (len, sum))
                .map_err(|e| e.to_string());
            let _ = done.send((name, r));
        })
    };
    let spawn_reader = |e: Arc<Switch>, name: &'static str, seed: u64| {
        let done = done_tx.clone();
        let (s, mc) = (case.seed, case.max_chunk);
        std::thread::spawn(move || {
            let r = read_stream(&e, seed, s ^ 0x99, mc).map_err(|e| e.to_string());
            let _ = done.send((name, r));
        })
    };
    let (seed_ab, seed_ba) = (case.seed, !case.seed);
    let threads = vec![
        spawn_writer(p.a.clone(), "write ab", seed_ab, case.len_ab),
        spawn_writer(p.b.clone(), "write ba", seed_ba, case.len_ba),
        spawn_reader(p.b.clone(), "read ab", seed_ab),
        spawn_reader(p.a.clone(), "read ba", seed_ba),
    ];
    drop(done_tx);
    for (delay_us, ev) in &case.events {
        std::thread::sleep(Duration::from_micros(*delay_us));
        apply(&p, *ev);
    }
    // Liveness: everything completes long before this (generous) bound.
    let mut results = std::collections::HashMap::new();
    for _ in 0..4 {
        match done_rx.recv_timeout(Duration::from_secs(60)) {
            Ok((name, r)) => {
                results.insert(name, r?);
            }
            Err(_) => {
                return Err(format!(
                    "stream stalled: finished {:?}; A {:?}; B {:?}",
                    results.keys().collect::<Vec<_>>(),
                    p.a.status(),
                    p.b.status()
                ))
            }
        }
    }
    for t in threads {
        t.join().map_err(|_| "thread panicked".to_string())?;
    }
    for (w, r) in [("write ab", "read ab"), ("write ba", "read ba")] {
        if results[w] != results[r] {
            return Err(format!("{w} {:?} != {r} {:?}", results[w], results[r]));
        }
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("XENSOCK_CARRIER_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(48)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 20, ..ProptestConfig::default() })]

    #[test]
    fn stream_survives_random_switches(
        order in 11u32..=13,
        len_ab in 0u64..400_000,
        len_ba in 0u64..400_000,
        max_chunk in prop_oneof![Just(64u64), Just(4096), Just(70_000)],
        seed in any::<u64>(),
        events in proptest::collection::vec((0u64..3000, event()), 0..12),
        ipv6 in proptest::bool::weighted(0.2),
    ) {
        let case = Case { order, len_ab, len_ba, max_chunk, seed, events, ipv6 };
        if let Err(e) = run(&case) {
            prop_assert!(false, "{}", e);
        }
    }
}

fn write_range(e: &Switch, seed: u64, from: u64, to: u64, sum: &mut u64) {
    for start in (from..to).step_by(5000) {
        let buf: Vec<u8> = (start..(start + 5000).min(to))
            .map(|i| pattern(seed, i))
            .collect();
        let mut done = 0;
        while done < buf.len() {
            done += e
                .write(&buf[done..])
                .unwrap_or_else(|err| panic!("{err}: {:?}", e.status()));
        }
        *sum = fnv(*sum, &buf);
    }
}

/// The switches also start on TCP (peers not co-resident at connect) and
/// move onto rings when offered.
#[test]
fn starts_on_tcp_then_moves_to_rings() {
    let p = pair(&PairOptions {
        on_ring: false,
        ..PairOptions::default()
    })
    .unwrap();
    let b = p.b.clone();
    let reader = std::thread::spawn(move || read_stream(&b, 5, 9, 5000).unwrap());
    let mut sum = FNV_START;
    write_range(&p.a, 5, 0, 1_000_000, &mut sum);
    offer(&p.b, &p.a);
    write_range(&p.a, 5, 1_000_000, 2_000_000, &mut sum);
    p.a.shutdown_write().unwrap();
    assert_eq!(reader.join().unwrap(), (2_000_000, sum));
    let s = p.a.status();
    assert_eq!(s.tx_to_ring, 1, "{s:?}");
    assert!(matches!(s.tx, TxState::Ring { epoch: 1, .. }), "{s:?}");
    assert_eq!(p.b.status().rx_to_ring, 1);
}

/// A fixed schedule that is sure to switch: each move takes both
/// directions to TCP, each return brings them back to a new ring, and the
/// stream stays intact through it.
#[test]
fn moves_switch_carriers_and_back() {
    let p = pair(&PairOptions::default()).unwrap();
    let b = p.b.clone();
    let reader = std::thread::spawn(move || read_stream(&b, 7, 1, 3000).unwrap());
    let mut sum = FNV_START;
    let mut at = 0;
    for round in 0..3u64 {
        write_range(&p.a, 7, at, at + 300_000, &mut sum);
        at += 300_000;
        if round % 2 == 0 {
            p.a.freeze(Trigger::LocalMove).unwrap();
        } else {
            p.b.freeze(Trigger::LocalMove).unwrap();
        }
        write_range(&p.a, 7, at, at + 300_000, &mut sum);
        at += 300_000;
        // Offers are only made on TCP: wait for the receiver to get there.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !matches!(p.a.status().tx, TxState::Tcp)
            || p.b
                .offer_ring()
                .unwrap()
                .map(|(e, r)| p.a.accept_ring_offer(e, r).unwrap())
                != Some(true)
        {
            assert!(
                std::time::Instant::now() < deadline,
                "no return to the ring: {:?}",
                p.a.status()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    write_range(&p.a, 7, at, at + 100_000, &mut sum);
    p.a.shutdown_write().unwrap();
    assert_eq!(reader.join().unwrap(), (at + 100_000, sum));
    let s = p.a.status();
    assert_eq!((s.tx_to_tcp, s.tx_to_ring), (3, 3), "{s:?}");
    assert!(matches!(s.tx, TxState::Ring { epoch: 3, .. }), "{s:?}");
}

fn read_all(e: &Switch, seed: u64) -> u64 {
    let (len, _) = read_stream(e, seed, 3, 7000).unwrap();
    len
}

/// Half-close on every carrier: a FIN set on the ring and still unread
/// when the sender moves, a FIN given while frozen, a FIN on TCP; the
/// other direction keeps flowing after each.
#[test]
fn half_close_travels_on_whichever_carrier_is_current() {
    for (case, mover_is_receiver) in [(0u64, false), (1, true)] {
        let p = pair(&PairOptions {
            order: 14,
            ..PairOptions::default()
        })
        .unwrap();
        // FIN on the ring, unread, then a move.
        let mut sum = FNV_START;
        write_range(&p.a, case, 0, 10_000, &mut sum);
        p.a.shutdown_write().unwrap();
        if mover_is_receiver {
            p.b.freeze(Trigger::LocalMove).unwrap();
        } else {
            p.a.freeze(Trigger::LocalMove).unwrap();
        }
        assert_eq!(read_all(&p.b, case), 10_000);
        // The other direction, after the half-close and the move.
        let a = p.a.clone();
        let reader = std::thread::spawn(move || read_all(&a, 99));
        let mut sum = FNV_START;
        write_range(&p.b, 99, 0, 50_000, &mut sum);
        // FIN given while B's direction may still be frozen.
        p.b.freeze(Trigger::LocalMove).unwrap();
        p.b.shutdown_write().unwrap();
        assert_eq!(reader.join().unwrap(), 50_000);
        assert_eq!(
            p.b.write(b"late").unwrap_err().raw_os_error(),
            Some(libc::EPIPE)
        );
    }
    // FIN on TCP.
    let p = pair(&PairOptions {
        on_ring: false,
        ..PairOptions::default()
    })
    .unwrap();
    let mut sum = FNV_START;
    write_range(&p.a, 4, 0, 20_000, &mut sum);
    p.a.shutdown_write().unwrap();
    assert_eq!(read_all(&p.b, 4), 20_000);
    // Reading past the end stays at end of stream.
    let mut b = [0u8; 8];
    assert_eq!(p.b.read(&mut b).unwrap(), 0);
}

/// Brings every direction that is on TCP back onto a new ring (offers both
/// ways), waiting as long as a direction is still frozen.
fn return_to_rings(p: &Pair) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let mut on_ring = 0;
        for (rx_side, tx_side) in [(&p.b, &p.a), (&p.a, &p.b)] {
            // Back only once the receiver took the RingFrom too (its
            // reader is reading): a move before that is a move during an
            // upgrade, which the property test covers.
            let receiving = matches!(rx_side.status().rx, RxState::Ring { .. });
            match tx_side.status().tx {
                TxState::Ring { .. } if receiving => on_ring += 1,
                TxState::Tcp => offer(rx_side, tx_side),
                _ => {}
            }
        }
        if on_ring == 2 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no return to the rings: A {:?}, B {:?}",
            p.a.status(),
            p.b.status()
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Zero bytes lost over 100 moves: a bidirectional stream
/// through 100 moves (A, B or both), each followed by a return to the ring.
#[test]
fn hundred_moves_lose_nothing() {
    let p = pair(&PairOptions {
        order: 12,
        ..PairOptions::default()
    })
    .unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // B -> A streams until told to stop.
    let ba_writer = {
        let (b, stop) = (p.b.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut sum = FNV_START;
            let mut at = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                write_range(&b, 21, at, at + 7000, &mut sum);
                at += 7000;
            }
            b.shutdown_write().unwrap();
            (at, sum)
        })
    };
    let ba_reader = {
        let a = p.a.clone();
        std::thread::spawn(move || read_stream(&a, 21, 5, 9000).unwrap())
    };
    let ab_reader = {
        let b = p.b.clone();
        std::thread::spawn(move || read_stream(&b, 20, 6, 9000).unwrap())
    };
    let mut sum = FNV_START;
    let mut at = 0;
    for round in 0..100u64 {
        write_range(&p.a, 20, at, at + 10_000, &mut sum);
        at += 10_000;
        match round % 3 {
            0 => p.a.freeze(Trigger::LocalMove).unwrap(),
            1 => p.b.freeze(Trigger::LocalMove).unwrap(),
            _ => {
                let b = p.b.clone();
                let t = std::thread::spawn(move || b.freeze(Trigger::LocalMove).unwrap());
                p.a.freeze(Trigger::LocalMove).unwrap();
                t.join().unwrap();
            }
        }
        write_range(&p.a, 20, at, at + 10_000, &mut sum);
        at += 10_000;
        return_to_rings(&p);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    p.a.shutdown_write().unwrap();
    assert_eq!(ab_reader.join().unwrap(), (at, sum));
    assert_eq!(ba_reader.join().unwrap(), ba_writer.join().unwrap());
    // Every move took each direction to TCP and every return brought it
    // back. When both ends move at once the sender can give two freeze
    // notices for one ring; one that arrives after the receiver's next
    // offer voids that offer (proto cannot tell it from a later move), so
    // a direction may make an extra round trip: more switches, never a
    // byte lost.
    for e in [&p.a, &p.b] {
        let s = e.status();
        assert!(s.tx_to_tcp >= 100, "{s:?}");
        assert_eq!(s.tx_to_tcp, s.tx_to_ring, "{s:?}");
        assert!(matches!(s.tx, TxState::Ring { .. }), "{s:?}");
    }
}

/// A close lingers until what was written is on its way, also right after
/// the sending side switched to a ring while its `RingFrom` (which tells
/// the receiver where TCP ends and the ring begins) still waits behind a
/// full leg. Closing the legs then lost the marker: the receiver read an
/// end of file in the middle of the stream (tokio-xensock's
/// `echo_through_moves` hit it once under load).
#[test]
fn close_right_after_a_switch_to_a_ring_loses_nothing() {
    let p = pair(&PairOptions {
        on_ring: false,
        ..PairOptions::default()
    })
    .unwrap();
    let seed = 21;
    let mut sum = FNV_START;
    // B does not read yet: fill A's leg until it takes no more.
    let mut at = 0u64;
    let mut chunk = Vec::new();
    loop {
        chunk.clear();
        chunk.extend((at..at + 65_536).map(|i| pattern(seed, i)));
        match p.a.try_write(&chunk) {
            Ok(n) => {
                sum = fnv(sum, &chunk[..n]);
                at += n as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    offer(&p.b, &p.a);
    assert!(
        matches!(p.a.status().tx, TxState::Ring { .. }),
        "{:?}",
        p.a.status()
    );
    // Less than the ring holds: nobody reads it yet.
    write_range(&p.a, seed, at, at + 1_000, &mut sum);
    p.a.shutdown_write().unwrap();
    // The transport's close: linger, then drop the switch (legs closed).
    let Pair {
        a,
        b,
        la: _la,
        lb: _lb,
    } = p;
    let closer = std::thread::spawn(move || {
        a.linger(Duration::from_secs(20));
        drop(a);
    });
    let got = read_stream(&b, seed, 3, 70_000);
    assert_eq!(
        got.as_ref().ok(),
        Some(&(at + 1_000, sum)),
        "{got:?} {:?}",
        b.status()
    );
    closer.join().unwrap();
}

/// The peer closes first with the connection on TCP: what it wrote
/// arrives, then the end of stream, and a write after that fails with
/// `EPIPE` (or `ECONNRESET`, as TCP's after the peer's reset) rather than
/// being taken forever. The kernel carrier's counterpart is
/// kmod-migrate's close-first test.
#[test]
fn a_write_after_the_peer_closed_on_tcp_fails() {
    let p = pair(&PairOptions {
        on_ring: false,
        ..PairOptions::default()
    })
    .unwrap();
    let mut sum = FNV_START;
    write_range(&p.a, 5, 0, 30_000, &mut sum);
    p.a.shutdown_write().unwrap();
    // The transport's close: linger, then drop the switch (legs closed).
    let Pair {
        a,
        b,
        la: _la,
        lb: _lb,
    } = p;
    a.linger(Duration::from_secs(20));
    drop(a);
    assert_eq!(read_all(&b, 5), 30_000);
    let give_up = std::time::Instant::now() + Duration::from_secs(30);
    let err = loop {
        match b.try_write(&[7u8; 4096]) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => break e,
            Ok(_) => {}
        }
        assert!(
            std::time::Instant::now() < give_up,
            "writes still taken 30 s after the peer closed: {:?}",
            b.status()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(
        matches!(err.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)),
        "{err:?}"
    );
}
