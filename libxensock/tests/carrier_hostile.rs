//! A hostile or broken peer can only break its own connection: a ring index
//! out of range, or an offset out of range in a control frame, resets the
//! connection (ECONNRESET) instead of hanging, panicking or delivering
//! wrong bytes.

#[allow(dead_code)]
#[path = "../src/evfd.rs"]
mod evfd;

#[allow(dead_code, unused_imports)]
#[path = "../src/carrier/mod.rs"]
mod carrier;

mod carrier_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use carrier::{Doorbell, Engine, EngineConfig, InitialRings, MemfdRing, RingAlloc, Trigger};
use carrier_common::*;
use xensock_proto::ctrl::Message;

fn hello_frame(conn_id: u32, cookie: u64) -> Vec<u8> {
    let msg = Message::TcpHello { conn_id, cookie };
    let mut buf = vec![0u8; msg.encoded_len()];
    msg.encode(&mut buf).unwrap();
    buf
}

fn no_alloc() -> RingAlloc {
    Box::new(|_| Err(std::io::ErrorKind::Unsupported.into()))
}

#[test]
fn corrupt_ring_index_resets_the_connection() {
    let rx = MemfdRing::pair(11, identity(1, 2, 71, 0)).unwrap();
    let tx = MemfdRing::pair(11, identity(2, 1, 72, 0)).unwrap();
    // The peer's view of the ring we read: it claims more bytes than fit.
    let peer_view = rx.for_peer.clone();
    let la = listener("127.0.0.1".parse().unwrap());
    let e = Engine::start(
        EngineConfig::new(71, 72, COOKIE, None),
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
    assert_eq!(
        e.read(&mut b).unwrap_err().raw_os_error(),
        Some(libc::ECONNRESET)
    );
    assert!(e.status().failure.is_some_and(|f| f.contains("ring")));
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
    // The engine's leg (its stream's way, our control frames' way back):
    // only its hello so far.
    let (mut leg, _) = fake.accept().unwrap();
    let mut hello = [0u8; 16];
    leg.read_exact(&mut hello).unwrap();
    // Our leg to it, where its control frames come: the TxFreeze{epoch 0,
    // offset 10}, then the Consumed for its receiving ring.
    let mut back = TcpStream::connect(la.local_addr()).unwrap();
    back.write_all(&hello_frame(81, COOKIE)).unwrap();
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
    assert_eq!(
        e.write(b"more").unwrap_err().raw_os_error(),
        Some(libc::ECONNRESET)
    );
    assert!(e.status().failure.is_some_and(|f| f.contains("outside")));
    // And the peer is told, on the control stream.
    let mut reset = [0u8; 12];
    back.read_exact(&mut reset).unwrap();
    assert_eq!(reset[1], 5, "a Reset frame");
}
