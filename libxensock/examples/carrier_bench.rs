//! Benchmark of the carrier engine (issue #7's targets), reported as
//! ratios against a plain loopback TCP stream measured in the same run:
//!
//! * TCP-carrier throughput: one direction streamed over the engine's TCP
//!   leg vs. a plain `TcpStream` pair, same write/read sizes.
//! * Added pause at a switch: while A streams to B over the ring, A (or B)
//!   moves (`freeze`) and the pair later returns to a ring; the longest
//!   write call and the longest gap between reads in the 100 ms after each
//!   event, minus the same in the 100 ms before it.
//!
//! `cargo run --release -p libxensock --example carrier_bench [-- MiB switches]`

#[allow(dead_code)]
#[path = "../src/evfd.rs"]
mod evfd;

#[allow(dead_code, unused_imports)]
#[path = "../src/carrier/mod.rs"]
mod carrier;

#[path = "../tests/carrier_common/mod.rs"]
mod carrier_common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use carrier::{Engine, Trigger};
use carrier_common::{pair, PairOptions};
use xensock_proto::switch::TxState;

const CHUNK: usize = 64 * 1024;

fn plain_tcp(total: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0;
        while got < total {
            let n = s.read(&mut buf).unwrap();
            assert!(n > 0);
            got += n;
        }
        Instant::now()
    });
    let mut w = TcpStream::connect(addr).unwrap();
    w.set_nodelay(true).unwrap();
    let buf = vec![7u8; CHUNK];
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < total {
        let n = (total - sent).min(CHUNK);
        w.write_all(&buf[..n]).unwrap();
        sent += n;
    }
    let end = reader.join().unwrap();
    total as f64 / (end - t0).as_secs_f64() / 1e6
}

fn engine_stream(a: Arc<Engine>, b: Arc<Engine>, total: usize) -> f64 {
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0;
        while got < total {
            let n = b.read(&mut buf).unwrap();
            assert!(n > 0);
            got += n;
        }
        Instant::now()
    });
    let buf = vec![7u8; CHUNK];
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < total {
        let n = (total - sent).min(CHUNK);
        sent += a.write(&buf[..n]).unwrap();
    }
    let end = reader.join().unwrap();
    total as f64 / (end - t0).as_secs_f64() / 1e6
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn throughput(total: usize, rounds: usize) {
    let mut plain = Vec::new();
    let mut tcp = Vec::new();
    let mut ring = Vec::new();
    for _ in 0..rounds {
        plain.push(plain_tcp(total));
        let p = pair(&PairOptions {
            on_ring: false,
            ..PairOptions::default()
        })
        .unwrap();
        tcp.push(engine_stream(p.a.clone(), p.b.clone(), total));
        let p = pair(&PairOptions {
            order: 20,
            ..PairOptions::default()
        })
        .unwrap();
        ring.push(engine_stream(p.a.clone(), p.b.clone(), total));
    }
    let (plain, tcp, ring) = (median(plain), median(tcp), median(ring));
    println!(
        "throughput, {} MiB x {rounds} rounds (median MB/s): plain TCP {plain:.0}, engine on TCP leg {tcp:.0} (ratio {:.2}), engine on 1 MiB ring {ring:.0} (ratio {:.2})",
        total >> 20,
        tcp / plain,
        ring / plain
    );
}

struct Log {
    /// (end of call, duration) of every write.
    writes: Vec<(Instant, Duration)>,
    /// End of every read.
    reads: Vec<Instant>,
}

fn worst_write(log: &Log, from: Instant, to: Instant) -> Duration {
    log.writes
        .iter()
        .filter(|(end, d)| *end > from && *end - *d < to)
        .map(|(_, d)| *d)
        .max()
        .unwrap_or_default()
}

fn worst_gap(log: &Log, from: Instant, to: Instant) -> Duration {
    log.reads
        .windows(2)
        .filter(|w| w[1] > from && w[0] < to)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

fn switch_pause(switches: usize) {
    let p = pair(&PairOptions {
        order: 16,
        ..PairOptions::default()
    })
    .unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let log = Arc::new(Mutex::new(Log {
        writes: Vec::new(),
        reads: Vec::new(),
    }));
    let writer = {
        let (a, stop, log) = (p.a.clone(), stop.clone(), log.clone());
        std::thread::spawn(move || {
            let buf = vec![7u8; 16 * 1024];
            let mut mine = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                a.write(&buf).unwrap();
                let end = Instant::now();
                mine.push((end, end - t));
            }
            a.shutdown_write().unwrap();
            log.lock().unwrap().writes = mine;
        })
    };
    let reader = {
        let (b, log) = (p.b.clone(), log.clone());
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            let mut mine = Vec::new();
            while b.read(&mut buf).unwrap() > 0 {
                mine.push(Instant::now());
            }
            log.lock().unwrap().reads = mine;
        })
    };
    let mut to_tcp = Vec::new();
    let mut to_ring = Vec::new();
    for i in 0..switches {
        std::thread::sleep(Duration::from_millis(120));
        to_tcp.push(Instant::now());
        if i % 2 == 0 {
            p.a.freeze(Trigger::LocalMove).unwrap();
        } else {
            p.b.freeze(Trigger::LocalMove).unwrap();
        }
        std::thread::sleep(Duration::from_millis(120));
        // Return: each receiver offers once its direction is on TCP.
        while !matches!(p.a.status().tx, TxState::Tcp) {
            std::thread::sleep(Duration::from_micros(100));
        }
        to_ring.push(Instant::now());
        let (e, r) = p.b.offer_ring().unwrap().expect("B receives on TCP");
        assert!(p.a.accept_ring_offer(e, r).unwrap());
        if let Some((e, r)) = p.a.offer_ring().unwrap() {
            p.b.accept_ring_offer(e, r).unwrap();
        }
    }
    std::thread::sleep(Duration::from_millis(120));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    reader.join().unwrap();
    let log = log.lock().unwrap();
    let w = Duration::from_millis(100);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    for (name, events) in [("ring -> TCP", &to_tcp), ("TCP -> ring", &to_ring)] {
        let mut write_added = Vec::new();
        let mut read_added = Vec::new();
        for &t in events.iter() {
            write_added.push(ms(worst_write(&log, t, t + w)) - ms(worst_write(&log, t - w, t)));
            read_added.push(ms(worst_gap(&log, t, t + w)) - ms(worst_gap(&log, t - w, t)));
        }
        let max = |v: &Vec<f64>| v.iter().cloned().fold(f64::MIN, f64::max);
        println!(
            "{name}, {} switches: added writer stall median {:.2} ms (max {:.2}); added reader gap median {:.2} ms (max {:.2})",
            events.len(),
            median(write_added.clone()),
            max(&write_added),
            median(read_added.clone()),
            max(&read_added),
        );
    }
    let s = p.a.status();
    println!(
        "A: {} bytes sent, {} switches to TCP, {} back to a ring",
        s.sent, s.tx_to_tcp, s.tx_to_ring
    );
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let mib = args.first().copied().unwrap_or(256);
    let switches = args.get(1).copied().unwrap_or(20);
    throughput(mib << 20, 5);
    switch_pause(switches);
}
