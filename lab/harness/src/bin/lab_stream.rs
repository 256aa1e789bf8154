// SPDX-License-Identifier: MIT OR Apache-2.0
//! `lab_stream`: one checksummed bidirectional stream over tokio-xensock,
//! for the lab's migration scenarios (`tests/lab/migration/`). The same
//! wire as the C `tests/lab/c/xsstream.c`: nothing here knows about
//! migration; the connection must survive moves below the API.
//!
//! ```text
//! lab_stream server PORT NAME [options]
//! lab_stream client DOMID PORT NAME [options]
//!   --rate KIB     send at most KIB KiB/s (default 1024; 0: unlimited)
//!   --stop FILE    stop sending once FILE exists (default /tmp/NAME.stop)
//!   --status FILE  rewritten each second: "sent S got G gap X t T" and,
//!                  over the user-space transport, the connection's status
//!                  line from `Transport::status()` (default /tmp/NAME.status)
//!   --stall S      nothing received for S seconds fails (default 180)
//!   --max S        give up after S seconds (default 1500)
//! ```
//!
//! Each direction is a pattern keyed by the byte's offset (seed 1 from the
//! client, 2 from the server) ended by an 8-byte marker (the total sent,
//! xored with a constant) and a shutdown of the sending side; the reader
//! holds back the last 8 bytes, checks everything before them, and at EOF
//! compares the marker with what it got. Prints
//! `@@RESULT tokio-NAME-connect` and `@@RESULT tokio-NAME PASS|FAIL <why>`
//! and progress every 5 s; exit status 0 on success. With `RUST_LOG` set,
//! the transport's traces go to stderr.

use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use libxensock::{BackendKind, SockAddrXen, DOMID_ANY};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio_xensock::{XenListener, XenStream};

const END_MAGIC: u64 = 0x5853_4e44_5045_4e44;
const HOLD: usize = 8;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn pattern(i: u64, seed: u32) -> u8 {
    let mut x = (i >> 2).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ u64::from(seed);
    x ^= x >> 29;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 32;
    (x >> (8 * (i & 3))) as u8
}

struct Opts {
    rate: f64,
    stop: PathBuf,
    status: PathBuf,
    stall: Duration,
    max: Duration,
}

#[derive(Default)]
struct Counters {
    /// LAB_STREAM_PROBE: polls of the read and write halves (and how many
    /// said Pending), and the status task's ticks
    read_polls: AtomicU64,
    read_pending: AtomicU64,
    write_polls: AtomicU64,
    write_pending: AtomicU64,
    /// time inside the write half's polls (the send syscall), and the longest
    write_us: AtomicU64,
    write_max_us: AtomicU64,
    status_beats: AtomicU64,
    /// when (µs after the probe's start) the read half's current poll
    /// began; 0 while it is not inside one
    read_in_since_us: AtomicU64,
    sent: AtomicU64,
    got: AtomicU64,
    /// Longest silence of the receiving direction, in milliseconds.
    max_gap_ms: AtomicU64,
}

fn result(name: &str, ok: bool, detail: &str) {
    println!(
        "@@RESULT tokio-{name} {} {detail}",
        if ok { "PASS" } else { "FAIL" }
    );
}

fn usage() -> ! {
    eprintln!(
        "usage: lab_stream server PORT NAME [--rate KIB] [--stop FILE] [--status FILE] [--stall S] [--max S]\n       lab_stream client DOMID PORT NAME [options]"
    );
    std::process::exit(100);
}

/// LAB_STREAM_THREADS=1: a current-thread runtime (reader and writer never
/// in the socket at once), else two workers.
/// Records why the stream failed, keeping the first reason: a writer's
/// error (a reset) comes before the end of stream its reader then reads.
fn first_reason(why: &Mutex<Option<String>>, m: String) {
    why.lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert(m);
}

fn main() {
    let one = std::env::var("LAB_STREAM_THREADS").is_ok_and(|v| v == "1");
    let rt = if one {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
    };
    match rt {
        Ok(rt) => rt.block_on(lab_main()),
        Err(e) => {
            eprintln!("lab_stream: runtime: {e}");
            std::process::exit(2);
        }
    }
}

async fn lab_main() {
    // RUST_LOG=libxensock=info (the lab sets it): the transport's link and
    // carrier events on stderr, next to the stream's own lines.
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .init();
    }
    let a: Vec<String> = std::env::args().collect();
    let server = match a.get(1).map(String::as_str) {
        Some("server") => true,
        Some("client") => false,
        _ => usage(),
    };
    let mut i = 2;
    let peer: Option<u32> = if server {
        None
    } else {
        i += 1;
        Some(
            a.get(2)
                .and_then(|d| d.parse().ok())
                .unwrap_or_else(|| usage()),
        )
    };
    let port: u32 = a
        .get(i)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| usage());
    let name = a.get(i + 1).cloned().unwrap_or_else(|| usage());
    i += 2;
    let mut o = Opts {
        rate: 1024.0 * 1024.0,
        stop: PathBuf::from(format!("/tmp/{name}.stop")),
        status: PathBuf::from(format!("/tmp/{name}.status")),
        stall: Duration::from_secs(180),
        max: Duration::from_secs(1500),
    };
    while i + 1 < a.len() {
        let v = &a[i + 1];
        let secs = || Duration::from_secs_f64(v.parse().unwrap_or_else(|_| usage()));
        match a[i].as_str() {
            "--rate" => o.rate = v.parse::<f64>().unwrap_or_else(|_| usage()) * 1024.0,
            "--stop" => o.stop = v.into(),
            "--status" => o.status = v.into(),
            "--stall" => o.stall = secs(),
            "--max" => o.max = secs(),
            _ => usage(),
        }
        i += 2;
    }
    if i != a.len() {
        usage();
    }
    print!("{}", libxensock::backend());
    let stream = match connect(server, peer, port).await {
        Ok(s) => {
            result(&format!("{name}-connect"), true, &format!("port {port}"));
            s
        }
        Err(e) => {
            result(&format!("{name}-connect"), false, &e.to_string());
            std::process::exit(1);
        }
    };
    let (tx, rx) = if server { (2, 1) } else { (1, 2) };
    let ok = run(stream, &name, Arc::new(o), tx, rx).await;
    std::process::exit(if ok { 0 } else { 1 });
}

async fn connect(server: bool, peer: Option<u32>, port: u32) -> Res<XenStream> {
    if server {
        let l = XenListener::bind(SockAddrXen::new(DOMID_ANY, port))?;
        let (s, from) = l.accept().await?;
        println!("lab_stream: accepted {from}");
        return Ok(s);
    }
    let peer = peer.ok_or("no peer")?;
    // The server may not listen yet, or the link may not be up.
    let end = Instant::now() + Duration::from_secs(150);
    loop {
        let left = end.saturating_duration_since(Instant::now());
        let e = match tokio::time::timeout(left, XenStream::connect(SockAddrXen::new(peer, port)))
            .await
        {
            Ok(Ok(s)) => return Ok(s),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if Instant::now() >= end {
            return Err(format!("connect to dom{peer}:{port} for 150 s: {e}").into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The connection's line of the user-space transport's status (None over
/// the kernel family: /proc/net/af_xen shows it there).
fn transport_line(local: Option<u32>, peer: Option<u32>) -> Option<String> {
    if libxensock::backend().kind == BackendKind::Kernel {
        return None;
    }
    let t = libxensock::Transport::global().ok()?;
    let st = t.status();
    let lines: Vec<String> = st
        .connections
        .iter()
        .filter(|c| Some(c.local.port) == local && Some(c.peer.port) == peer)
        .map(|c| format!("{c:?}"))
        .collect();
    Some(lines.join(" | "))
}

static PROBE_T0: std::sync::LazyLock<Instant> = std::sync::LazyLock::new(Instant::now);

/// Each thread of this process: name, state, wchan and syscall (number and
/// first argument), for the probe: where a stalled reader's worker is.
fn threads_now() -> String {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return String::new();
    };
    let mut out = Vec::new();
    for t in dir.flatten() {
        let p = t.path();
        let get = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default();
        let stat = get("stat");
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        let sc: Vec<String> = get("syscall")
            .split_whitespace()
            .take(2)
            .map(String::from)
            .collect();
        out.push(format!(
            "{}:{} {} {} [{}]",
            t.file_name().to_string_lossy(),
            get("comm").trim(),
            state,
            get("wchan").trim(),
            sc.join(" ")
        ));
    }
    out.join(", ")
}

/// A stream half whose polls are counted (LAB_STREAM_PROBE): whether a
/// stalled reader is polled at all, and what it is told.
struct Counted<T> {
    io: T,
    c: Arc<Counters>,
}

fn count<T>(polls: &AtomicU64, pending: &AtomicU64, r: Poll<T>) -> Poll<T> {
    polls.fetch_add(1, Ordering::Relaxed);
    if r.is_pending() {
        pending.fetch_add(1, Ordering::Relaxed);
    }
    r
}

impl<T: AsyncRead + Unpin> AsyncRead for Counted<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let since = PROBE_T0.elapsed().as_micros() as u64;
        self.c
            .read_in_since_us
            .store(since.max(1), Ordering::Relaxed);
        let r = Pin::new(&mut self.io).poll_read(cx, buf);
        self.c.read_in_since_us.store(0, Ordering::Relaxed);
        count(&self.c.read_polls, &self.c.read_pending, r)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Counted<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let t = Instant::now();
        let r = Pin::new(&mut self.io).poll_write(cx, buf);
        let us = t.elapsed().as_micros() as u64;
        self.c.write_us.fetch_add(us, Ordering::Relaxed);
        self.c.write_max_us.fetch_max(us, Ordering::Relaxed);
        count(&self.c.write_polls, &self.c.write_pending, r)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// LAB_STREAM_PROBE=1: a thread outside the runtime that, each second the
/// reader got nothing, says what `poll` reports for the socket and how
/// often the runtime polled the halves and ticked the status task since
/// the last second: POLLIN with no read polls is an edge that never
/// reached tokio; no status ticks is a runtime that stood still.
fn probe(
    fd: std::os::fd::RawFd,
    port: Option<u32>,
    c: &Counters,
    stop: &std::sync::atomic::AtomicBool,
    name: &str,
    t0: Instant,
) {
    let snap = || {
        [
            c.got.load(Ordering::Relaxed),
            c.read_polls.load(Ordering::Relaxed),
            c.read_pending.load(Ordering::Relaxed),
            c.write_polls.load(Ordering::Relaxed),
            c.write_pending.load(Ordering::Relaxed),
            c.status_beats.load(Ordering::Relaxed),
            c.sent.load(Ordering::Relaxed),
            c.write_us.load(Ordering::Relaxed),
        ]
    };
    let mut last = snap();
    let mut still = 0u32;
    std::sync::LazyLock::force(&PROBE_T0);
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_secs(1));
        let now = snap();
        // the reader got nothing, or the writer sent nothing while told Pending
        let stuck = now[0] == last[0] || (now[6] == last[6] && now[4] > last[4]);
        still = if stuck { still + 1 } else { 0 };
        if still > 0 {
            if let Some(p) = port {
                let rows = std::fs::read_to_string("/proc/net/af_xen").unwrap_or_default();
                let pat = format!(":{p} ");
                for row in rows.lines().filter(|l| l.contains(&pat)) {
                    println!(
                        "lab_stream {name}: probe row: {}",
                        row.split_whitespace().collect::<Vec<_>>().join(" ")
                    );
                }
            }
            let since = c.read_in_since_us.load(Ordering::Relaxed);
            let inside = if since == 0 {
                "reader not in a poll".to_string()
            } else {
                format!(
                    "reader inside one poll for {} ms",
                    (PROBE_T0.elapsed().as_micros() as u64).saturating_sub(since) / 1000
                )
            };
            println!(
                "lab_stream {name}: probe threads: {inside}; {}",
                threads_now()
            );
            let d: Vec<u64> = now.iter().zip(&last).map(|(a, b)| a - b).collect();
            println!(
                "lab_stream {name}: probe t {:.1} got {} stuck {still} s: {}; read polls +{} (pending +{}) write polls +{} (pending +{}) sent +{} in {} ms (longest write {} ms) status ticks +{}",
                t0.elapsed().as_secs_f64(),
                now[0],
                poll_now(fd),
                d[1],
                d[2],
                d[3],
                d[4],
                d[6],
                d[7] / 1000,
                c.write_max_us.swap(0, Ordering::Relaxed) / 1000,
                d[5]
            );
        }
        last = now;
    }
}

/// What `poll` says of `fd` right now (no wait), for LAB_STREAM_PROBE.
fn poll_now(fd: std::os::fd::RawFd) -> String {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the call. poll only reads the
    // descriptor number: once the stream's halves are gone it may be
    // closed (POLLNVAL) or another file's, which is harmless here.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n < 0 {
        return format!("poll: {}", std::io::Error::last_os_error());
    }
    let mut bits = Vec::new();
    for (b, name) in [
        (libc::POLLIN, "IN"),
        (libc::POLLOUT, "OUT"),
        (libc::POLLRDHUP, "RDHUP"),
        (libc::POLLHUP, "HUP"),
        (libc::POLLERR, "ERR"),
    ] {
        if p.revents & b != 0 {
            bits.push(name);
        }
    }
    format!(
        "poll revents {}",
        if bits.is_empty() {
            "none".to_string()
        } else {
            bits.join("|")
        }
    )
}

/// Seconds since boot, suspended time included (/proc/uptime, CLOCK_BOOTTIME).
fn boot_secs() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/uptime").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

async fn run(s: XenStream, name: &str, o: Arc<Opts>, txseed: u32, rxseed: u32) -> bool {
    let local_port = s.local_addr().ok().map(|a| a.port);
    let peer_port = s.peer_addr().ok().map(|a| a.port);
    // LAB_STREAM_PROBE=1: a thread outside the runtime (`probe`) looks at
    // the socket and the runtime each second the stream stands still
    let probe_fd = std::env::var("LAB_STREAM_PROBE")
        .is_ok_and(|v| v == "1")
        .then(|| s.as_raw_fd());
    let (r, w) = s.into_split();
    let c = Arc::new(Counters::default());
    let (mut r, mut w) = (
        Counted {
            io: r,
            c: c.clone(),
        },
        Counted {
            io: w,
            c: c.clone(),
        },
    );
    let t0 = Instant::now();
    let probe_stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(fd) = probe_fd {
        let (c, stop, name) = (c.clone(), probe_stop.clone(), name.to_string());
        std::thread::spawn(move || probe(fd, local_port, &c, &stop, &name, t0));
    }
    let boot0 = boot_secs();
    let why: Arc<Mutex<Option<String>>> = Arc::default();

    // status + progress
    let (cs, os, name_s) = (c.clone(), o.clone(), name.to_string());
    let status = tokio::spawn(async move {
        let mut n = 0u64;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            n += 1;
            let (sent, got) = (
                cs.sent.load(Ordering::Relaxed),
                cs.got.load(Ordering::Relaxed),
            );
            cs.status_beats.fetch_add(1, Ordering::Relaxed);
            let gap = cs.max_gap_ms.load(Ordering::Relaxed) as f64 / 1000.0;
            let conn = tokio::task::spawn_blocking(move || transport_line(local_port, peer_port))
                .await
                .ok()
                .flatten();
            let line = format!(
                "sent {sent} got {got} gap {gap:.2} t {:.1}{}\n",
                t0.elapsed().as_secs_f64(),
                conn.as_deref()
                    .map(|c| format!(" conn {c}"))
                    .unwrap_or_default()
            );
            let tmp = os.status.with_extension("tmp");
            if std::fs::write(&tmp, &line).is_ok() {
                let _ = std::fs::rename(&tmp, &os.status);
            }
            if n.is_multiple_of(5) {
                print!("lab_stream {name_s}: {line}");
            }
        }
    });

    // sending direction
    let (cw, ow, whyw) = (c.clone(), o.clone(), why.clone());
    let writer = tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        let mut sent = 0u64;
        loop {
            if ow.stop.exists() {
                break;
            }
            let mut len = buf.len();
            if ow.rate > 0.0 {
                let allowed = t0.elapsed().as_secs_f64() * ow.rate - sent as f64;
                if allowed < 1.0 {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                len = len.min(allowed as usize);
            }
            for (k, b) in buf[..len].iter_mut().enumerate() {
                *b = pattern(sent + k as u64, txseed);
            }
            match tokio::time::timeout(Duration::from_millis(200), w.write(&buf[..len])).await {
                Ok(Ok(0)) => {
                    first_reason(&whyw, format!("write returned 0 at offset {sent}"));
                    return;
                }
                Ok(Ok(n)) => {
                    sent += n as u64;
                    cw.sent.store(sent, Ordering::Relaxed);
                    // each round fills 64 KiB of pattern first, ~50 ms of
                    // CPU under the lab's TCG: a writer catching up after a
                    // switch, whose every write is ready at once, held its
                    // worker for tokio's whole budget (128 writes, 4-9 s)
                    // while the reader and timers waited
                    tokio::task::yield_now().await;
                }
                Ok(Err(e)) => {
                    first_reason(&whyw, format!("write at offset {sent}: {e}"));
                    return;
                }
                // no room for 200 ms: look at the stop file again
                Err(_) => {}
            }
        }
        println!(
            "lab_stream: stop at {:.1} s: sent {sent}, ending",
            t0.elapsed().as_secs_f64()
        );
        let marker = (sent ^ END_MAGIC).to_le_bytes();
        let end = async {
            w.write_all(&marker).await?;
            w.shutdown().await
        };
        if let Err(e) = end.await {
            first_reason(
                &whyw,
                format!("end marker / shutdown after {sent} bytes: {e}"),
            );
        }
        // keep the write half until the reader is done (dropping it is fine
        // too: it only shuts down what is already shut down)
    });

    // receiving direction
    let (cr, or_, whyr) = (c.clone(), o.clone(), why.clone());
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 65536 + HOLD];
        let (mut held, mut checked, mut got) = (0usize, 0u64, 0u64);
        let mut last = Instant::now();
        let fail = |m: String| {
            first_reason(&whyr, m);
        };
        loop {
            let n = match tokio::time::timeout(or_.stall, r.read(&mut buf[held..])).await {
                Err(_) => {
                    return fail(format!(
                        "stalled: nothing received for {:.0} s at offset {got} (sent {})",
                        or_.stall.as_secs_f64(),
                        cr.sent.load(Ordering::Relaxed)
                    ))
                }
                Ok(Err(e)) => return fail(format!("read at offset {got}: {e}")),
                Ok(Ok(n)) => n,
            };
            let gap = last.elapsed().as_millis() as u64;
            cr.max_gap_ms.fetch_max(gap, Ordering::Relaxed);
            last = Instant::now();
            if n == 0 {
                let stream_data = held == HOLD
                    && (0..HOLD).all(|k| buf[k] == pattern(checked + k as u64, rxseed));
                if held < HOLD || stream_data {
                    return fail(format!(
                        "EOF at offset {got} without the end marker (peer closed or the connection was dropped)"
                    ));
                }
                let mut m = [0u8; HOLD];
                m.copy_from_slice(&buf[..HOLD]);
                let peer_sent = u64::from_le_bytes(m) ^ END_MAGIC;
                if peer_sent > checked {
                    return fail(format!(
                        "lost {} bytes: peer sent {peer_sent}, got {checked} before its end marker",
                        peer_sent - checked
                    ));
                }
                if peer_sent < checked {
                    return fail(format!(
                        "end marker says {peer_sent} bytes, got {checked} (garbled end)"
                    ));
                }
                // the marker is not stream data
                cr.got.store(checked, Ordering::Relaxed);
                println!("lab_stream: peer's end after {checked} bytes, all checked");
                return;
            }
            let total = held + n;
            let check = total.saturating_sub(HOLD);
            for (k, &b) in buf[..check].iter().enumerate() {
                let want = pattern(checked + k as u64, rxseed);
                if b != want {
                    return fail(format!(
                        "mismatch at offset {}: got {b:#04x}, expected {want:#04x} (bytes lost, duplicated or reordered)",
                        checked + k as u64
                    ));
                }
            }
            checked += check as u64;
            buf.copy_within(check..total, 0);
            held = total - check;
            got += n as u64;
            cr.got.store(got, Ordering::Relaxed);
            // the check above is the reader's CPU-heavy round (see the writer)
            tokio::task::yield_now().await;
        }
    });

    let writer_abort = writer.abort_handle();
    let why_j = why.clone();
    let both = async move {
        // A receiving direction that failed ends the run at once (the
        // sender would otherwise stream until the stop file).
        let r_ok = reader.await.is_ok();
        if why_j.lock().unwrap_or_else(|p| p.into_inner()).is_some() {
            writer_abort.abort();
            return r_ok;
        }
        writer.await.is_ok() && r_ok
    };
    let finished = tokio::time::timeout(o.max, both).await;
    status.abort();
    probe_stop.store(true, Ordering::Relaxed);
    let (sent, got) = (
        c.sent.load(Ordering::Relaxed),
        c.got.load(Ordering::Relaxed),
    );
    let gap = c.max_gap_ms.load(Ordering::Relaxed) as f64 / 1000.0;
    println!("@@METRIC {name}.max_gap_s {gap:.2} s");
    println!(
        "@@METRIC {name}.sent_mib {:.1} MiB",
        sent as f64 / 1048576.0
    );
    println!("@@METRIC {name}.got_mib {:.1} MiB", got as f64 / 1048576.0);
    // max_gap_s is on Instant (CLOCK_MONOTONIC), which stands still while
    // this guest is suspended: on the guest that moved it is the pause
    // beyond its own suspended time, which this is (boot time went further)
    if let (Some(b0), Some(b1)) = (boot0, boot_secs()) {
        let suspended = (b1 - b0 - t0.elapsed().as_secs_f64()).max(0.0);
        println!("@@METRIC {name}.suspended_s {suspended:.2} s");
    }
    let why = why.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let why = match (finished, why) {
        (_, Some(w)) => Some(w),
        (Err(_), None) => Some(format!(
            "gave up after {:.0} s (sent {sent}, got {got})",
            o.max.as_secs_f64()
        )),
        (Ok(false), None) => Some("a task panicked".into()),
        (Ok(true), None) => None,
    };
    match why {
        Some(w) => {
            result(name, false, &w);
            false
        }
        None => {
            result(
                name,
                true,
                &format!("sent={sent} got={got} max_gap={gap:.2}s"),
            );
            true
        }
    }
}
