// SPDX-License-Identifier: MIT OR Apache-2.0
//! A peer saved while it held its rings, without the suspend hook: the side
//! that stayed sees the link die and keeps every byte its own ring holds
//! (`Trigger::PeerGone`); the restored side has no mapping of the stayer's
//! ring any more and resends nothing from it (`Trigger::Restored`). Both
//! streams go on over TCP and back onto rings with nothing lost; and where
//! the stayer kept less than the restored side wrote, the connection is
//! reset, never filled with a guess.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::support::*;
use crate::carrier::testbed::*;
use crate::carrier::{Switch, Trigger};
use xensock_proto::switch::TxState;

fn write_all(e: &Switch, seed: u64, from: u64, to: u64, sum: &mut u64) {
    let buf: Vec<u8> = (from..to).map(|i| pattern(seed, i)).collect();
    let mut done = 0;
    while done < buf.len() {
        done += e
            .write(&buf[done..])
            .unwrap_or_else(|err| panic!("{err}: {:?}", e.status()));
    }
    *sum = fnv(*sum, &buf);
}

/// Offers from `from` until `to` writes the new ring.
fn back_on_ring(from: &Switch, to: &Switch) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if matches!(to.status().tx, TxState::Ring { .. }) {
            return;
        }
        if matches!(to.status().tx, TxState::Tcp) {
            if let Ok(Some((epoch, ring))) = from.offer_ring() {
                to.accept_ring_offer(epoch, ring).unwrap();
            }
        }
        assert!(
            Instant::now() < deadline,
            "no return to a ring: {:?}",
            to.status()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn a_peer_restored_without_its_rings_loses_nothing_when_the_stayer_kept_its_ring() {
    let p = pair(&PairOptions {
        order: 14,
        ..PairOptions::default()
    })
    .unwrap();
    // Both write into the rings while nobody reads: the bytes in flight
    // are in the rings only.
    let (mut sum_ab, mut sum_ba) = (FNV_START, FNV_START);
    write_all(&p.a, 1, 0, 10_000, &mut sum_ab);
    write_all(&p.b, 2, 0, 8_000, &mut sum_ba);
    // B is saved with its rings mapped: A sees the link die and leaves its
    // rings, keeping the 8,000 bytes of B's in its own ring; B comes back
    // without its mapping of A's ring.
    p.a.freeze(Trigger::PeerGone).unwrap();
    p.b.freeze(Trigger::Restored).unwrap();
    // Both go on over TCP, then back onto rings.
    let (a, b) = (p.a.clone(), p.b.clone());
    let read_ab = std::thread::spawn(move || read_stream(&b, 1, 5, 9000));
    let read_ba = std::thread::spawn(move || read_stream(&a, 2, 6, 9000));
    write_all(&p.a, 1, 10_000, 200_000, &mut sum_ab);
    write_all(&p.b, 2, 8_000, 150_000, &mut sum_ba);
    back_on_ring(&p.b, &p.a);
    back_on_ring(&p.a, &p.b);
    write_all(&p.a, 1, 200_000, 300_000, &mut sum_ab);
    write_all(&p.b, 2, 150_000, 250_000, &mut sum_ba);
    p.a.shutdown_write().unwrap();
    p.b.shutdown_write().unwrap();
    assert_eq!(read_ab.join().unwrap().unwrap(), (300_000, sum_ab));
    assert_eq!(read_ba.join().unwrap().unwrap(), (250_000, sum_ba));
    // B resent nothing (it had no copy); A resent what B had not read.
    for s in [p.a.status(), p.b.status()] {
        assert_eq!(s.failure, None, "{s:?}");
        assert_eq!((s.tx_to_tcp, s.tx_to_ring), (1, 1), "{s:?}");
    }
}

#[test]
fn a_fin_in_the_kept_ring_ends_the_stream_there() {
    let p = pair(&PairOptions::default()).unwrap();
    let mut sum = FNV_START;
    write_all(&p.b, 3, 0, 1000, &mut sum);
    p.b.shutdown_write().unwrap();
    p.a.freeze(Trigger::PeerGone).unwrap();
    p.b.freeze(Trigger::Restored).unwrap();
    assert_eq!(read_stream(&p.a, 3, 7, 300).unwrap(), (1000, sum));
}

/// A pair where B wrote 1,000 bytes of `seed`'s pattern into A's ring
/// and was then saved holding its mapping of it (stale from now on);
/// returns the checksum of those bytes.
fn b_saved_with_1000_bytes_in_its_ring(seed: u64) -> (Pair, u64) {
    let suspended = Arc::new(AtomicBool::new(false));
    let p = pair(&PairOptions {
        b_suspended: Some(suspended.clone()),
        ..PairOptions::default()
    })
    .unwrap();
    let mut sum = FNV_START;
    write_all(&p.b, seed, 0, 1000, &mut sum);
    suspended.store(true, Ordering::Release);
    (p, sum)
}

/// B's mapping went stale with B's save, and B hears of it first from
/// A's `Consumed` (A saw the link die): B's freeze, however it comes,
/// reads nothing back, so with A keeping only what it took B has nothing
/// to resend and the connection resets; with A keeping its ring it goes
/// on.
#[test]
fn a_peer_restored_without_its_rings_is_reset_when_the_stayer_kept_only_what_it_read() {
    let (p, _) = b_saved_with_1000_bytes_in_its_ring(4);
    // A leaves the ring keeping only what it took (nothing): the 1,000
    // bytes are nowhere B could resend them from.
    p.a.freeze(Trigger::LocalMove).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.b.failed() {
        assert!(Instant::now() < deadline, "not reset: {:?}", p.b.status());
        std::thread::sleep(Duration::from_millis(1));
    }
    let err = p.b.write(b"more").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::ECONNRESET), "{err}");
    // A gets the reset, not bytes B never had.
    let mut buf = [0u8; 64];
    let err = match p.a.read(&mut buf) {
        Ok(0) => panic!("end of stream instead of a reset: {:?}", p.a.status()),
        Ok(n) => panic!("{n} bytes nobody could resend: {:?}", p.a.status()),
        Err(e) => e,
    };
    assert_eq!(err.raw_os_error(), Some(libc::ECONNRESET), "{err}");
}

#[test]
fn a_peer_that_learns_of_its_move_from_the_stayer_loses_nothing_when_the_stayer_kept_its_ring() {
    let (p, sum) = b_saved_with_1000_bytes_in_its_ring(5);
    p.a.freeze(Trigger::PeerGone).unwrap();
    // B writes again once it knows (what it wrote into the stale mapping
    // before that would be lost, and the connection reset)
    let deadline = Instant::now() + Duration::from_secs(20);
    while matches!(p.b.status().tx, TxState::Ring { .. }) {
        assert!(
            Instant::now() < deadline,
            "B never left: {:?}",
            p.b.status()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let b = p.b.clone();
    let writer = std::thread::spawn(move || {
        let mut sum = sum;
        write_all(&b, 5, 1000, 50_000, &mut sum);
        b.shutdown_write().unwrap();
        sum
    });
    let (n, got) = read_stream(&p.a, 5, 8, 3000).unwrap();
    assert_eq!((n, got), (50_000, writer.join().unwrap()));
    assert_eq!(p.b.status().failure, None);
}
