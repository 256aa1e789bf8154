// SPDX-License-Identifier: MIT OR Apache-2.0
//! What the carrier tests share beyond the testbed: checksummed streams,
//! a lone switch, hand-written frames and a peer played by hand.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use xensock_proto::ctrl::Message;

use crate::carrier::testbed::*;
use crate::carrier::{Doorbell, InitialRings, LegListener, Switch, SwitchConfig};

/// The byte at stream offset `i` of the stream seeded `seed`: position
/// dependent, so a lost, duplicated or reordered byte shows.
pub fn pattern(seed: u64, i: u64) -> u8 {
    let x = ((i / 8) ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> (8 * (i % 8))) as u8 ^ (i as u8)
}

/// A small deterministic generator for chunk sizes and pauses.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// FNV-1a, the stream checksum both ends compute.
pub fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

pub const FNV_START: u64 = 0xcbf2_9ce4_8422_2325;

/// Writes `len` pattern bytes in random chunks, then shuts down writing.
/// Returns the checksum of what was written.
pub fn write_stream(
    e: &Switch,
    seed: u64,
    len: u64,
    rng_seed: u64,
    max_chunk: u64,
) -> io::Result<u64> {
    let mut rng = Rng(rng_seed | 1);
    let mut off = 0u64;
    let mut sum = FNV_START;
    let mut buf = Vec::new();
    while off < len {
        let n = (1 + rng.below(max_chunk)).min(len - off);
        buf.clear();
        buf.extend((off..off + n).map(|i| pattern(seed, i)));
        let mut done = 0;
        while done < buf.len() {
            done += e.write(&buf[done..])?;
        }
        sum = fnv(sum, &buf);
        off += n;
    }
    e.shutdown_write()?;
    Ok(sum)
}

/// Reads to end of stream in random chunks with occasional pauses (so
/// rings fill up), checking every byte. Returns (length, checksum).
pub fn read_stream(e: &Switch, seed: u64, rng_seed: u64, max_chunk: u64) -> io::Result<(u64, u64)> {
    let mut rng = Rng(rng_seed | 1);
    let mut off = 0u64;
    let mut sum = FNV_START;
    let mut buf = vec![0u8; max_chunk as usize + 1];
    loop {
        let want = 1 + rng.below(max_chunk) as usize;
        let n = e.read(&mut buf[..want])?;
        if n == 0 {
            return Ok((off, sum));
        }
        for (k, b) in buf[..n].iter().enumerate() {
            let i = off + k as u64;
            if *b != pattern(seed, i) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("stream byte {i}: got {b:#x}, want {:#x}", pattern(seed, i)),
                ));
            }
        }
        sum = fnv(sum, &buf[..n]);
        off += n as u64;
        if rng.below(64) == 0 {
            std::thread::sleep(Duration::from_micros(rng.below(1500)));
        }
    }
}

/// A switch whose peer is not another switch: its rings are served by
/// nobody and its peer's leg listener is `peer`.
pub fn lone_engine(
    local: u32,
    peer_id: u32,
    peer: Option<std::net::SocketAddr>,
    listener: Arc<LegListener>,
    on_ring: bool,
    peer_lost_after: Duration,
) -> Switch {
    let rings = on_ring.then(|| {
        let rx = MemfdRing::new_ring(11, identity(1, 2, local, 0)).unwrap();
        let tx = MemfdRing::new_ring(11, identity(2, 1, peer_id, 0)).unwrap();
        InitialRings {
            rx: rx.local,
            tx: tx.for_peer,
        }
    });
    let mut cfg = SwitchConfig::new(local, peer_id, COOKIE, peer);
    cfg.peer_lost_after = peer_lost_after;
    Switch::start(
        cfg,
        rings,
        listener,
        Doorbell::new().unwrap(),
        Arc::new(|| {}),
        alloc(11, 1, 2, local),
    )
    .unwrap()
}

/// A frame as it goes on a leg.
pub fn frame(m: &Message<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; m.encoded_len()];
    m.encode(&mut buf).unwrap();
    buf
}

/// `err` is the connection's reset, and the switch's recorded failure
/// says `why`.
pub fn assert_reset(switch: &Switch, err: io::Error, why: &str) {
    assert_eq!(err.raw_os_error(), Some(libc::ECONNRESET), "{err}");
    let failure = switch.status().failure;
    assert!(
        failure.as_deref().is_some_and(|f| f.contains(why)),
        "failure {failure:?}, wanted one naming {why:?}"
    );
}

/// A switch on TCP (id `local`, its peer `local + 1`) whose peer is the
/// test, holding both of the switch's legs by hand.
pub struct HandPeer {
    pub switch: Switch,
    /// The switch's outbound leg, accepted and its hello read: the
    /// switch's stream comes in here, and the control frames for the
    /// switch's receiving direction go back on it.
    pub control_to_engine: TcpStream,
    /// The leg the test connected to `listener` with the switch's hello:
    /// the stream to the switch goes here, and its control frames come
    /// back on it.
    pub stream_to_engine: TcpStream,
}

pub fn hand_peer(local: u32, listener: Arc<LegListener>, peer_lost_after: Duration) -> HandPeer {
    let fake = TcpListener::bind("127.0.0.1:0").unwrap();
    let switch = lone_engine(
        local,
        local + 1,
        Some(fake.local_addr().unwrap()),
        listener.clone(),
        false,
        peer_lost_after,
    );
    // On TCP from the start: the switch connects its leg to us at once.
    let (mut control_to_engine, _) = fake.accept().unwrap();
    let mut hello = [0u8; 16];
    control_to_engine.read_exact(&mut hello).unwrap();
    assert_eq!(
        hello.to_vec(),
        frame(&Message::TcpHello {
            conn_id: local + 1,
            cookie: COOKIE
        }),
        "the switch's hello"
    );
    let mut stream_to_engine = TcpStream::connect(listener.local_addr()).unwrap();
    stream_to_engine
        .write_all(&frame(&Message::TcpHello {
            conn_id: local,
            cookie: COOKIE,
        }))
        .unwrap();
    HandPeer {
        switch,
        control_to_engine,
        stream_to_engine,
    }
}
