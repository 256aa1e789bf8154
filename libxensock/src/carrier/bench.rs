// SPDX-License-Identifier: MIT OR Apache-2.0
//! Benchmark of the carrier switch's targets, reported as
//! ratios against a plain loopback TCP stream measured in the same run:
//!
//! * TCP-carrier throughput: one direction streamed over the switch's TCP
//!   leg vs. a plain `TcpStream` pair, same write/read sizes.
//! * Added pause at a switch: while A streams to B over the ring, A (or B)
//!   moves (`freeze`) and the pair later returns to a ring; the longest
//!   write call and the longest gap between reads in the 100 ms after each
//!   event, minus the same in the 100 ms before it.
//!
//! `cargo bench -p libxensock --features internals --bench carrier [-- MiB switches]`;
//! `-- plain N` / `-- leg N` stream N MiB once (for profilers), `-- pingpong
//! N` times N one-byte round trips over the TCP legs (e.g. under `strace -f
//! -c`: a round trip is a `poll` and a `recvfrom` per read, a `writev` per
//! write).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::carrier::testbed::{pair, PairOptions};
use crate::carrier::{Switch, Trigger};
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

fn engine_stream(a: Arc<Switch>, b: Arc<Switch>, total: usize) -> f64 {
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

/// `n` one-byte round trips A -> B -> A; the mean round trip in us.
fn engine_pingpong(a: Arc<Switch>, b: Arc<Switch>, n: usize) -> f64 {
    let echo = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..n {
            assert_eq!(b.read(&mut buf).unwrap(), 1);
            assert_eq!(b.write(&buf[..1]).unwrap(), 1);
        }
    });
    let mut buf = [0u8; 64];
    let t0 = Instant::now();
    for _ in 0..n {
        assert_eq!(a.write(b"p").unwrap(), 1);
        assert_eq!(a.read(&mut buf).unwrap(), 1);
    }
    let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
    echo.join().unwrap();
    us
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

use crate::sys::cpu_time;

/// Runs `f` (returning MB/s) and also reports the CPU it cost per MiB.
fn measured(total: usize, f: impl FnOnce() -> f64) -> (f64, f64) {
    let c0 = cpu_time();
    let rate = f();
    let cpu = (cpu_time() - c0).as_secs_f64() * 1e6 / (total >> 20) as f64;
    (rate, cpu)
}

/// Rounds alternate plain TCP, the switch's TCP leg and its ring, and the
/// ratios are taken per round: on a shared machine the load drifts more
/// between rounds than within one. CPU per MiB (user + system, both ends)
/// is much less sensitive to other load than wall-clock throughput.
fn throughput(total: usize, rounds: usize) {
    let mut plain = Vec::new();
    let mut tcp_ratio = Vec::new();
    let mut ring_ratio = Vec::new();
    let mut cpu_plain = Vec::new();
    let mut cpu_ratio = Vec::new();
    for _ in 0..rounds {
        let (base, base_cpu) = measured(total, || plain_tcp(total));
        plain.push(base);
        cpu_plain.push(base_cpu);
        let p = pair(&PairOptions {
            on_ring: false,
            ..PairOptions::default()
        })
        .unwrap();
        let (rate, cpu) = measured(total, || engine_stream(p.a.clone(), p.b.clone(), total));
        tcp_ratio.push(rate / base);
        cpu_ratio.push(cpu / base_cpu);
        let p = pair(&PairOptions {
            order: 20,
            ..PairOptions::default()
        })
        .unwrap();
        ring_ratio.push(engine_stream(p.a.clone(), p.b.clone(), total) / base);
    }
    let spread = |v: &Vec<f64>| {
        let mut v = v.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        (v[0], v[v.len() - 1])
    };
    let (tlo, thi) = spread(&tcp_ratio);
    println!(
        "throughput, {} MiB x {rounds} rounds: plain loopback TCP median {:.0} MB/s; switch on its TCP leg / plain: median {:.2} (min {tlo:.2}, max {thi:.2}); switch on a 1 MiB ring / plain: median {:.2}",
        total >> 20,
        median(plain),
        median(tcp_ratio.clone()),
        median(ring_ratio),
    );
    println!(
        "CPU per MiB moved (user + system, both ends): plain TCP median {:.0} us; switch on its TCP leg / plain: median {:.2}",
        median(cpu_plain),
        median(cpu_ratio),
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
        // B offers once it is on TCP and has seen A's freeze notice.
        let (e, r) = loop {
            if let Some(offer) = p.b.offer_ring().unwrap() {
                break offer;
            }
            std::thread::sleep(Duration::from_micros(100));
        };
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

/// The benchmark's `main`: `args` as its command line has them, without
/// the program name (`--bench`, which cargo adds, is ignored).
pub fn main(args: Vec<String>) {
    // `plain N` / `leg N`: one stream of N MiB only, for profilers;
    // `pingpong N`: N one-byte round trips over the TCP legs.
    let mode: Vec<String> = args.into_iter().filter(|a| a != "--bench").collect();
    if let [m, n] = &mode[..] {
        if let ("pingpong", Ok(n)) = (m.as_str(), n.parse::<usize>()) {
            let p = pair(&PairOptions {
                on_ring: false,
                ..PairOptions::default()
            })
            .unwrap();
            let us = engine_pingpong(p.a.clone(), p.b.clone(), n);
            println!("pingpong on the TCP legs: {us:.1} us per round trip");
            return;
        }
        if let (m @ ("plain" | "leg"), Ok(mib)) = (m.as_str(), n.parse::<usize>()) {
            let total = mib << 20;
            let rate = if m == "plain" {
                plain_tcp(total)
            } else {
                let p = pair(&PairOptions {
                    on_ring: false,
                    ..PairOptions::default()
                })
                .unwrap();
                engine_stream(p.a.clone(), p.b.clone(), total)
            };
            println!("{m}: {rate:.0} MB/s");
            return;
        }
    }
    let args: Vec<usize> = mode.iter().filter_map(|a| a.parse().ok()).collect();
    let mib = args.first().copied().unwrap_or(256);
    let switches = args.get(1).copied().unwrap_or(20);
    throughput(mib << 20, 9);
    // (0: the throughput part only; there is no pause to take a median of)
    if switches > 0 {
        switch_pause(switches);
    }
}
