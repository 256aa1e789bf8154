// SPDX-License-Identifier: MIT OR Apache-2.0
//! The TCP leg: authentication, refusals, a listener that slow clients
//! cannot block, malformed frames, and a peer that never comes back.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use super::support::*;
use crate::carrier::testbed::*;
use crate::carrier::{LegListener, LegListenerConfig, LegStats, Trigger};
use xensock_proto::ctrl::Message;

fn hello(conn_id: u32, cookie: u64) -> Vec<u8> {
    let msg = Message::TcpHello { conn_id, cookie };
    let mut buf = vec![0u8; msg.encoded_len()];
    msg.encode(&mut buf).unwrap();
    buf
}

/// Waits (generously) until the listener's counters satisfy `ok`.
fn wait_stats(l: &LegListener, ok: impl Fn(&LegStats) -> bool) -> LegStats {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let s = l.stats();
        if ok(&s) {
            return s;
        }
        assert!(Instant::now() < deadline, "listener stats stuck at {s:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The peer closed the socket without handing it anywhere: read gives EOF
/// or a reset.
fn closed_by_peer(mut s: TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
    }
}

#[test]
fn listener_authenticates_refuses_and_counts() {
    let l = LegListener::bind(
        "127.0.0.1".parse().unwrap(),
        LegListenerConfig {
            hello_timeout: Duration::from_millis(300),
            max_pending: 16,
        },
    )
    .unwrap();
    let (got_tx, got_rx) = mpsc::channel();
    l.register(
        5,
        42,
        Arc::new(move |s: TcpStream| {
            let _ = got_tx.send(s);
        }),
    );
    let addr = l.local_addr();

    // A silent client holds a slot but does not block anyone.
    let silent = TcpStream::connect(addr).unwrap();
    // Half a hello, then nothing.
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(&hello(5, 42)[..7]).unwrap();

    let mut good = TcpStream::connect(addr).unwrap();
    good.write_all(&hello(5, 42)).unwrap();
    good.write_all(b"after").unwrap();
    let mut handed = got_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    handed.set_nonblocking(false).unwrap();
    let mut after = [0u8; 5];
    handed.read_exact(&mut after).unwrap();
    assert_eq!(&after, b"after", "nothing past the hello is consumed");

    let mut wrong_cookie = TcpStream::connect(addr).unwrap();
    wrong_cookie.write_all(&hello(5, 43)).unwrap();
    assert!(closed_by_peer(wrong_cookie));

    let mut unknown = TcpStream::connect(addr).unwrap();
    unknown.write_all(&hello(6, 42)).unwrap();
    assert!(closed_by_peer(unknown));

    let mut garbage = TcpStream::connect(addr).unwrap();
    let mut bad = hello(5, 42);
    bad[0] = 9; // version
    garbage.write_all(&bad).unwrap();
    assert!(closed_by_peer(garbage));

    let mut not_hello = TcpStream::connect(addr).unwrap();
    let fin = Message::Fin {
        conn_id: 5,
        offset: 0,
    };
    let mut buf = vec![0u8; fin.encoded_len()];
    fin.encode(&mut buf).unwrap();
    not_hello.write_all(&buf).unwrap();
    assert!(closed_by_peer(not_hello));

    let s = wait_stats(&l, |s| s.timed_out >= 2);
    assert_eq!(
        s,
        LegStats {
            accepted: 1,
            bad_cookie: 1,
            unknown_conn: 1,
            malformed: 2,
            timed_out: 2,
        }
    );
    assert!(closed_by_peer(silent));
    assert!(closed_by_peer(slow));
    assert!(
        got_rx.try_recv().is_err(),
        "only the good leg was handed over"
    );
}

#[test]
fn leg_registered_late_is_still_delivered() {
    let l = listener("::1".parse().unwrap());
    let mut early = TcpStream::connect(l.local_addr()).unwrap();
    early.write_all(&hello(9, 1)).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let (got_tx, got_rx) = mpsc::channel();
    l.register(
        9,
        1,
        Arc::new(move |s: TcpStream| {
            let _ = got_tx.send(s);
        }),
    );
    got_rx.recv_timeout(Duration::from_secs(20)).unwrap();
    assert_eq!(l.stats().accepted, 1);
}

/// After the ring died, a peer that cannot be reached on TCP (nothing
/// listens there) ends the connection with ECONNRESET within the bound,
/// for the blocked reader and for the writer.
#[test]
fn peer_never_reachable_resets_within_bound() {
    let closed_port = {
        let t = TcpListener::bind("127.0.0.1:0").unwrap();
        t.local_addr().unwrap()
    };
    let la = listener("127.0.0.1".parse().unwrap());
    let bound = Duration::from_millis(300);
    let e = Arc::new(lone_engine(41, 42, Some(closed_port), la, true, bound));
    assert_eq!(e.write(b"before").unwrap(), 6);
    let reader = {
        let e = e.clone();
        std::thread::spawn(move || {
            let mut b = [0u8; 16];
            e.read(&mut b)
        })
    };
    let t0 = Instant::now();
    e.freeze(Trigger::PeerGone).unwrap();
    let r = reader.join().unwrap();
    let elapsed = t0.elapsed();
    assert_eq!(r.unwrap_err().raw_os_error(), Some(libc::ECONNRESET));
    assert_eq!(
        e.write(b"x").unwrap_err().raw_os_error(),
        Some(libc::ECONNRESET)
    );
    // Liveness, generously: the bound plus scheduling slack.
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
    assert!(e.status().failure.is_some());
}

/// A peer whose host accepts TCP but whose switch never answers (no leg
/// back, no Consumed) is lost too.
#[test]
fn silent_peer_resets_within_bound() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let holder = std::thread::spawn(move || {
        // Accept and hold the leg without a word.
        let (s, _) = silent.accept().unwrap();
        std::thread::sleep(Duration::from_secs(2));
        drop(s);
    });
    let la = listener("127.0.0.1".parse().unwrap());
    let e = lone_engine(51, 52, Some(addr), la, true, Duration::from_millis(300));
    e.freeze(Trigger::LocalMove).unwrap();
    let mut b = [0u8; 4];
    let t0 = Instant::now();
    assert_eq!(
        e.read(&mut b).unwrap_err().raw_os_error(),
        Some(libc::ECONNRESET)
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    drop(e);
    holder.join().unwrap();
}

/// A malformed frame on a leg resets that connection only: another
/// connection on the same listeners keeps streaming.
#[test]
fn malformed_frame_resets_only_its_connection() {
    let la = listener("127.0.0.1".parse().unwrap());
    let lb = listener("127.0.0.1".parse().unwrap());
    let healthy = pair_on(
        &PairOptions {
            on_ring: false,
            ..PairOptions::default()
        },
        la.clone(),
        lb,
        A_ID,
        B_ID,
    )
    .unwrap();

    // The victim's "peer" is this test: it holds both of the victim's
    // legs and sends garbage on the victim's control stream.
    let HandPeer {
        switch: victim,
        control_to_engine: mut from_victim,
        stream_to_engine: _to_victim,
    } = hand_peer(61, la.clone(), Duration::from_secs(20));
    let bad = Message::RingFrom {
        conn_id: 61,
        epoch: 0,
        offset: 0,
    };
    let mut buf = vec![0u8; bad.encoded_len()];
    bad.encode(&mut buf).unwrap();
    buf[12] = 1; // a reserved byte
    from_victim.write_all(&buf).unwrap();
    let mut b = [0u8; 4];
    assert_eq!(
        victim.read(&mut b).unwrap_err().raw_os_error(),
        Some(libc::ECONNRESET)
    );
    assert!(victim
        .status()
        .failure
        .is_some_and(|f| f.contains("reserved")));

    // The other connection is untouched.
    let b_side = healthy.b.clone();
    let reader = std::thread::spawn(move || read_stream(&b_side, 3, 4, 4096).unwrap());
    let sum = write_stream(&healthy.a, 3, 200_000, 5, 4096).unwrap();
    assert_eq!(reader.join().unwrap(), (200_000, sum));
}

/// The peer's switch is gone (its process died) but its host still runs
/// the leg listener: the leg is parked, never claimed, and the connection
/// resets within the bound.
#[test]
fn vanished_peer_engine_resets_within_bound() {
    let p = pair(&PairOptions {
        peer_lost_after: Duration::from_millis(300),
        ..PairOptions::default()
    })
    .unwrap();
    assert_eq!(p.a.write(b"hello").unwrap(), 5);
    let Pair { a, b, la: _la, lb } = p;
    drop(b);
    let t0 = Instant::now();
    a.freeze(Trigger::PeerGone).unwrap();
    let mut buf = [0u8; 8];
    assert_eq!(
        a.read(&mut buf).unwrap_err().raw_os_error(),
        Some(libc::ECONNRESET)
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
    // Parked until its hello deadline, then refused as unknown.
    wait_stats(&lb, |s| s.unknown_conn == 1);
}
