// SPDX-License-Identifier: MIT OR Apache-2.0
//! The migration targets on the user-space transport over the simulated host,
//! as ratios and differences against the same run (never absolute
//! targets in tests):
//!
//! * **Added pause at a switch-over**: A streams to B (16 KiB writes, a
//!   256 KiB ring); every 150 ms one of them moves (the suspend hook, a
//!   same-host migration, the transport following its new domid, back to a
//!   ring on the new link). For each move: the longest gap between the
//!   reader's reads in the 300 ms from the move on, minus the longest gap
//!   in the 100 ms before it; and, for reference, how long the move itself
//!   took (hook + toolstack).
//! * **TCP-carrier throughput vs plain TCP**: B moves to another host, so
//!   the connection runs on its TCP leg; 64 KiB writes and reads, against a
//!   plain loopback `TcpStream` pair, wall clock and CPU per MiB.
//!
//! `cargo run --release -p xensock-benches --bin migration-bench [-- MiB moves]`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libxensock::{Config, Transport, XenStream};
use xensock_sim::{DomainConfig, MigrateTo, SimHost};

const CHUNK: usize = 64 * 1024;

fn cpu_now() -> Duration {
    // SAFETY: getrusage fills the struct we pass.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Streams `total` bytes from `w` to `r`; returns (seconds, CPU seconds).
fn stream<W: Write + Send + 'static, R: Read + Send + 'static>(
    mut w: W,
    mut r: R,
    total: usize,
) -> (f64, f64) {
    let cpu0 = cpu_now();
    let t0 = Instant::now();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; CHUNK];
        let mut got = 0;
        while got < total {
            let n = r.read(&mut buf).unwrap();
            assert!(n > 0);
            got += n;
        }
    });
    let buf = vec![7u8; CHUNK];
    let mut sent = 0;
    while sent < total {
        let n = (total - sent).min(CHUNK);
        w.write_all(&buf[..n]).unwrap();
        sent += n;
    }
    reader.join().unwrap();
    (t0.elapsed().as_secs_f64(), (cpu_now() - cpu0).as_secs_f64())
}

fn plain_tcp(total: usize) -> (f64, f64) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
    w.set_nodelay(true).unwrap();
    let (r, _) = l.accept().unwrap();
    stream(w, r, total)
}

struct World {
    host: SimHost,
    a: Transport,
    b: Transport,
}

fn world() -> World {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, Config::default()).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, Config::default()).unwrap();
    World { host, a, b }
}

fn pair(w: &World, port: u32) -> (XenStream, XenStream) {
    let l = w.b.bind(format!("xen:self:{port}")).unwrap();
    let c = w.a.connect((u32::from(w.b.domid()), port)).unwrap();
    let (s, _) = l.accept().unwrap();
    (c, s)
}

fn migrate(host: &SimHost, t: &Transport) -> Duration {
    let t0 = Instant::now();
    t.suspend();
    let new = host
        .migrate_domain(t.domid(), MigrateTo::SameHost)
        .unwrap()
        .unwrap();
    while t.domid() != new {
        std::thread::sleep(Duration::from_micros(200));
    }
    t0.elapsed()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let mib = args.first().copied().unwrap_or(256);
    let moves = args.get(1).copied().unwrap_or(20);
    let total = mib << 20;

    // ---- pause at switch-over ------------------------------------------
    let w = world();
    let (c, s) = pair(&w, 10);
    let stop = Arc::new(AtomicBool::new(false));
    let reads: Arc<Mutex<Vec<Instant>>> = Arc::new(Mutex::new(Vec::with_capacity(1 << 20)));
    let writer = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let buf = vec![3u8; 16 * 1024];
            while !stop.load(Ordering::Relaxed) {
                (&c).write_all(&buf).unwrap();
            }
            c
        })
    };
    let reader = {
        let reads = reads.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                match (&s).read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(_) => reads.lock().unwrap().push(Instant::now()),
                }
            }
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    let mut events = Vec::new();
    for i in 0..moves {
        let t = if i % 2 == 0 { &w.a } else { &w.b };
        let at = Instant::now();
        let took = migrate(&w.host, t);
        events.push((at, took));
        std::thread::sleep(Duration::from_millis(150));
    }
    stop.store(true, Ordering::Relaxed);
    let c = writer.join().unwrap();
    drop(c);
    let _ = reader.join();
    let reads = reads.lock().unwrap().clone();
    let max_gap = |from: Instant, to: Instant| -> f64 {
        let mut last = from;
        let mut gap = Duration::ZERO;
        for &t in reads.iter().filter(|&&t| t > from && t <= to) {
            gap = gap.max(t - last);
            last = t;
        }
        gap.max(to.saturating_duration_since(last).min(Duration::ZERO))
            .as_secs_f64()
            * 1e3
    };
    let mut added = Vec::new();
    let mut own = Vec::new();
    for &(at, took) in &events {
        let before = max_gap(at - Duration::from_millis(100), at);
        let after = max_gap(at, at + Duration::from_millis(300));
        added.push(after - before);
        own.push(took.as_secs_f64() * 1e3);
    }
    let max_added = added.iter().copied().fold(f64::MIN, f64::max);
    println!(
        "switch-over, {moves} moves (A and B in turn, back to a ring after each): added reader gap median {:.2} ms (max {:.2}); the move itself (suspend hook + toolstack + domid) median {:.2} ms",
        median(&mut added),
        max_added,
        median(&mut own)
    );
    let st = w.a.status();
    if let Some(cs) = st.connections.first() {
        println!("  A's connection: {}", cs.carrier);
    }
    drop(w);

    // ---- TCP carrier vs plain TCP ---------------------------------------
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    let mut plain_rate = Vec::new();
    for round in 0..5 {
        let w = world();
        let (c, s) = pair(&w, 20);
        w.b.suspend();
        w.host
            .migrate_domain(w.b.domid(), MigrateTo::OtherHost("elsewhere".into()))
            .unwrap();
        let (pt, pc) = plain_tcp(total);
        let (xt, xc) = stream(c, s, total);
        wall.push(pt / xt);
        cpu.push(xc / pc);
        plain_rate.push(total as f64 / pt / 1e6);
        if round == 0 {
            println!(
                "  (round 0: plain {:.0} MB/s, TCP carrier {:.0} MB/s)",
                total as f64 / pt / 1e6,
                total as f64 / xt / 1e6
            );
        }
    }
    println!(
        "TCP carrier after a move to another host, {mib} MiB x 5 rounds: throughput / plain loopback TCP median {:.2} (min {:.2}); CPU per MiB / plain median {:.2}; plain median {:.0} MB/s",
        median(&mut wall.clone()),
        wall.iter().copied().fold(f64::MAX, f64::min),
        median(&mut cpu),
        median(&mut plain_rate)
    );
}
