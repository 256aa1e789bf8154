// SPDX-License-Identifier: MIT OR Apache-2.0
//! `lab_echo`: the two ends of xensock's first real-Xen runs
//! (`tests/lab/userspace`), one per domain, plus a XenStore self-test.
//!
//! ```text
//! lab_echo server <port>...                   echo every connection back (one thread each)
//! lab_echo client <domid> <port> <MiB>        stream MiB through the echo, verify the checksum
//! lab_echo dclient <domid> <port> <MiB>       the same through XenStream::connect (kernel family,
//!                                             the guest's xensock daemon, or this process's transport)
//! lab_echo hold <domid> <port> <secs>         stream until the peer dies; report EOF/reset
//! lab_echo send <domid> <port> <MiB>          write MiB of the checked stream, then exit with
//!                                             the connection open (no shutdown, no close)
//! lab_echo sink <port> <MiB>                  take one connection, read to EOF, check it is
//!                                             exactly what `send` writes
//! lab_echo xs <path> [--watch]                XsClient read/write/perms/rm (+ watch) under <path>
//! ```
//!
//! Uses only the public API: `Transport::from_env()` (real `/dev/xen` when
//! present) and `xensock_discovery::xs::XsClient`. A failed connect exits
//! with status 2 and prints the errno (`os error 113` is `EHOSTUNREACH`).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use libxensock::{SockAddrXen, Transport, XenStream};
use xensock_discovery::xs::XsClient;
use xensock_xenif::xs_wire::{Perm, PermAccess};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[path = "../../../../libxensock/shared/stream_check.rs"]
mod stream_check;
use stream_check::{pattern, read_stream, write_stream, Sum};

fn now_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> Res<T> {
    a.get(i)
        .ok_or_else(|| format!("missing {what}"))?
        .parse()
        .map_err(|_| format!("bad {what}: {:?}", a[i]).into())
}

fn main() {
    // RUST_LOG=libxensock=info: the transport's link and carrier events on
    // stderr (the lab's death test looks for why the connection ended)
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let a: Vec<String> = std::env::args().collect();
    let r = match a.get(1).map(String::as_str) {
        Some("server") => server(&a),
        Some("client" | "dclient") => client(&a),
        Some("hold") => hold(&a),
        Some("send") => send(&a),
        Some("sink") => sink(&a),
        Some("xs") => xs(&a),
        _ => Err("usage: lab_echo server PORT... | client|dclient DOMID PORT MIB | hold DOMID PORT SECS | send DOMID PORT MIB | sink PORT MIB | xs PATH [--watch]".into()),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("lab_echo: error: {e}");
            std::process::exit(2);
        }
    }
}

/// `Transport::from_env()`: real `/dev/xen` when present, with the
/// library's settings (`XENSOCK_LINK_TIMEOUT_MS` etc. apply).
fn transport() -> Res<Transport> {
    let report = libxensock::backend();
    println!("{report}");
    let cfg = libxensock::Config::default();
    println!(
        "link timeout {:.1} s, connect timeout {:.1} s",
        cfg.link_timeout.as_secs_f64(),
        cfg.connect_timeout.as_secs_f64()
    );
    let t = Transport::from_env()?;
    println!(
        "transport up: domain {} backend {}",
        t.domid(),
        t.backend_kind()
    );
    Ok(t)
}

fn server(a: &[String]) -> Res<i32> {
    let ports: Vec<u32> = a[2..]
        .iter()
        .map(|p| p.parse().map_err(|_| format!("bad port {p:?}")))
        .collect::<Result<_, _>>()?;
    if ports.is_empty() {
        return Err("missing port".into());
    }
    let t = transport()?;
    let mut threads = Vec::new();
    for port in ports {
        let l = t.bind(SockAddrXen::new(libxensock::DOMID_SELF, port))?;
        println!("listening on {}", l.local_addr()?);
        // connections are named <port>.<n>
        threads.push(thread::spawn(move || -> io::Result<()> {
            let mut n = 0u32;
            loop {
                let (s, peer) = l.accept()?;
                n += 1;
                let id = format!("{port}.{n}");
                println!("conn {id} accepted from {peer}");
                thread::spawn(move || match echo(s, &id) {
                    Ok((bytes, sum)) => {
                        println!("conn {id} done: echoed {bytes} bytes, checksum {sum:016x}")
                    }
                    Err(e) => println!("conn {id} error: {e} ({:?})", e.kind()),
                });
            }
        }));
    }
    for th in threads {
        th.join().map_err(|_| "listener panicked")??;
    }
    Ok(0)
}

/// Echoes until EOF, printing progress every 1 MiB.
fn echo(mut s: XenStream, id: &str) -> io::Result<(u64, u64)> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    let mut sum = Sum::default();
    let mut next = 1u64 << 20;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            s.shutdown(Shutdown::Write)?;
            return Ok((total, sum.finish()));
        }
        sum.add(&buf[..n]);
        s.write_all(&buf[..n])?;
        total += n as u64;
        while total >= next {
            // "passed N MiB" lines at 1 and 2 MiB, then every 16 MiB
            println!("conn {id} passed {} MiB ({total} bytes)", next >> 20);
            next = if next < 2 << 20 {
                next + (1 << 20)
            } else {
                next + (16 << 20)
            };
        }
    }
}

fn client(a: &[String]) -> Res<i32> {
    let domid: u32 = arg(a, 2, "domid")?;
    let port: u32 = arg(a, 3, "port")?;
    let mib: u64 = arg(a, 4, "MiB")?;
    let total = mib << 20;
    let t0 = Instant::now();
    // dclient: the generic XenStream::connect, which goes through the
    // guest's xensock daemon when one runs
    let r = if a[1] == "dclient" {
        XenStream::connect(SockAddrXen::new(domid, port))
    } else {
        transport()?.connect(SockAddrXen::new(domid, port))
    };
    let s = r.map_err(|e| {
        format!(
            "connect to xen:{domid}:{port} failed after {:.2?}: {e}",
            t0.elapsed()
        )
    })?;
    println!("connect_ms {:.1}", t0.elapsed().as_secs_f64() * 1e3);
    println!(
        "connected {} -> {} in {:.1?} (rings {} KiB)",
        s.local_addr()?,
        s.peer_addr()?,
        t0.elapsed(),
        s.recv_buffer_size() / 1024
    );
    let write_size = 65536usize;
    let block = pattern(write_size + 8192);
    let mut w = s.try_clone()?;
    let start = Instant::now();
    let writer = thread::spawn(move || -> io::Result<u64> {
        let sum = write_stream(&mut w, &block, total, write_size)?;
        w.shutdown(Shutdown::Write)?;
        Ok(sum)
    });
    let mut r = s;
    let (recv, got) = read_stream(&mut r, |_| {})?;
    let el = start.elapsed();
    let sent = writer.join().map_err(|_| "writer panicked")??;
    let mibs = got as f64 / (1 << 20) as f64 / el.as_secs_f64();
    println!(
        "sent {total} bytes checksum {sent:016x}; received {got} bytes checksum {recv:016x}; {el:.2?}, {mibs:.2} MiB/s"
    );
    println!("@@METRIC userspace.echo_{mib}mib_mib_s {mibs:.2} MiB/s");
    if got == total && sent == recv {
        println!("checksum OK");
        Ok(0)
    } else {
        println!("checksum MISMATCH");
        Ok(1)
    }
}

/// The checked stream's writes (as `client` makes them).
const STREAM_WRITE: usize = 65536;

/// Writes the checked stream and leaves: `process::exit` runs no
/// destructor, so the stream is neither shut down nor closed, as when a
/// program returns from `main` with a connection open or is ended by a
/// signal after its last write.
fn send(a: &[String]) -> Res<i32> {
    let domid: u32 = arg(a, 2, "domid")?;
    let port: u32 = arg(a, 3, "port")?;
    let total = arg::<u64>(a, 4, "MiB")? << 20;
    let mut s = transport()?.connect(SockAddrXen::new(domid, port))?;
    let sum = write_stream(&mut s, &pattern(STREAM_WRITE + 8192), total, STREAM_WRITE)?;
    println!("written {total} bytes checksum {sum:016x}; exiting with the connection open");
    io::stdout().flush()?;
    std::process::exit(0)
}

/// Takes one connection and reads it to EOF: every byte `send` wrote, in
/// order, then EOF (not a reset).
fn sink(a: &[String]) -> Res<i32> {
    let port: u32 = arg(a, 2, "port")?;
    let total = arg::<u64>(a, 3, "MiB")? << 20;
    let want = write_stream(
        &mut io::sink(),
        &pattern(STREAM_WRITE + 8192),
        total,
        STREAM_WRITE,
    )?;
    let t = transport()?;
    let l = t.bind(SockAddrXen::new(libxensock::DOMID_SELF, port))?;
    println!("listening on {}", l.local_addr()?);
    let (mut s, peer) = l.accept()?;
    println!("accepted from {peer}");
    match read_stream(&mut s, |_| {}) {
        Ok((sum, got)) if got == total && sum == want => {
            println!("sink: {got} bytes, checksum {sum:016x} as sent, then EOF");
            Ok(0)
        }
        Ok((sum, got)) => {
            println!(
                "sink: {got} of {total} bytes, checksum {sum:016x} (want {want:016x}), then EOF"
            );
            Ok(1)
        }
        Err(e) => {
            println!("sink: the stream ended with an error: {e} ({:?})", e.kind());
            Ok(1)
        }
    }
}

/// Streams through the echo until the connection ends; success if it ends
/// with EOF or ECONNRESET (the peer died) within `secs`, and reports how
/// long after the last received byte that was noticed.
fn hold(a: &[String]) -> Res<i32> {
    let domid: u32 = arg(a, 2, "domid")?;
    let port: u32 = arg(a, 3, "port")?;
    let secs: u64 = arg(a, 4, "secs")?;
    let t = transport()?;
    let t0 = Instant::now();
    let s = t.connect(SockAddrXen::new(domid, port)).map_err(|e| {
        format!(
            "connect to xen:{domid}:{port} failed after {:.2?}: {e}",
            t0.elapsed()
        )
    })?;
    println!(
        "connected {} -> {} in {:.1?}",
        s.local_addr()?,
        s.peer_addr()?,
        t0.elapsed()
    );
    s.set_read_timeout(Some(Duration::from_secs(secs)))?;
    let mut w = s.try_clone()?;
    let werr = Arc::new(std::sync::Mutex::new(None::<String>));
    let werr2 = werr.clone();
    thread::spawn(move || {
        let block = pattern(16384);
        loop {
            if let Err(e) = w.write_all(&block) {
                *werr2.lock().unwrap_or_else(|p| p.into_inner()) =
                    Some(format!("{e} ({:?}) at {:.3}", e.kind(), now_s()));
                return;
            }
        }
    });
    let got = Arc::new(AtomicU64::new(0));
    let mut r = s;
    let mut buf = vec![0u8; 64 * 1024];
    let mut last = Instant::now();
    let mut next = 1u64 << 20;
    let outcome = loop {
        match r.read(&mut buf) {
            Ok(0) => break "EOF".to_string(),
            Ok(n) => {
                last = Instant::now();
                let g = got.fetch_add(n as u64, Ordering::Relaxed) + n as u64;
                while g >= next {
                    println!("passed {} MiB ({g} bytes)", next >> 20);
                    next += 16 << 20;
                }
            }
            Err(e) => break format!("{e} ({:?}, os error {:?})", e.kind(), e.raw_os_error()),
        }
    };
    let gap = last.elapsed();
    println!(
        "connection ended: {outcome} at wall {:.3}; {:.1} ms after the last byte; received {} bytes; writer: {}",
        now_s(),
        gap.as_secs_f64() * 1e3,
        got.load(Ordering::Relaxed),
        werr.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or_else(|| "still writing".into())
    );
    println!(
        "@@METRIC userspace.peer_death_gap_ms {:.1} ms",
        gap.as_secs_f64() * 1e3
    );
    let ok = outcome == "EOF"
        || outcome.contains("ConnectionReset")
        || outcome.contains("os error Some(104)");
    Ok(if ok { 0 } else { 1 })
}

/// XenStore self-test of `XsClient` on whatever `XsClient::open()` finds.
fn xs(a: &[String]) -> Res<i32> {
    let base = a.get(2).ok_or("missing path")?.clone();
    let watch = a.iter().any(|s| s == "--watch");
    let c = XsClient::open()?;
    let dom: String = c.read_string("domid").unwrap_or_else(|_| "0".into());
    println!("XsClient open; domid node = {dom:?}");
    let me: u32 = dom.trim().parse().unwrap_or(0);
    let mut w = if watch { Some(c.watch(&base)?) } else { None };
    if let Some(w) = w.as_mut() {
        // the initial event every watch fires
        let e = w.recv_timeout(Duration::from_secs(10))?;
        println!("initial watch event: {e:?}");
    }
    let p = format!("{base}/xstest/a");
    c.write(&p, b"hello real xenstored")?;
    let v = c.read_string(&p)?;
    println!("read back {p} = {v:?}");
    if v != "hello real xenstored" {
        return Ok(1);
    }
    let dir = c.directory(&format!("{base}/xstest"))?;
    println!("directory {base}/xstest = {dir:?}");
    c.mkdir(&format!("{base}/xstest/b"))?;
    let perms = vec![
        Perm::new(PermAccess::None, me),
        Perm::new(PermAccess::Read, 0),
    ];
    c.set_perms(&p, &perms)?;
    let got = c.get_perms(&p)?;
    println!(
        "perms {p} = {}",
        got.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    );
    if got.first() != perms.first() {
        return Ok(1);
    }
    let tx = c.transaction(|tx| {
        tx.write(&format!("{base}/xstest/tx1"), b"1")?;
        tx.write(&format!("{base}/xstest/tx2"), b"2")?;
        Ok(())
    });
    println!("transaction: {tx:?}");
    tx?;
    match c.read(&format!("{base}/xstest/nonexistent")) {
        Err(e) => println!("read of a missing node: {e}"),
        Ok(_) => return Ok(1),
    }
    if let Some(w) = w.as_mut() {
        let t0 = Instant::now();
        let mut seen = Vec::new();
        while t0.elapsed() < Duration::from_secs(5) {
            match w.recv_timeout(Duration::from_millis(500))? {
                Some(e) => seen.push(e.path),
                None => break,
            }
        }
        println!("watch events after writes: {seen:?}");
        if !seen.iter().any(|s| s.ends_with("xstest/a")) {
            println!("no watch event for {p}");
            return Ok(1);
        }
    }
    c.rm(&format!("{base}/xstest"))?;
    let gone = c.try_read(&p)?.is_none();
    println!("rm {base}/xstest: gone={gone}");
    Ok(if gone { 0 } else { 1 })
}
