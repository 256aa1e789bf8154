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

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use libxensock::{BackendKind, SockAddrXen, DOMID_ANY};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

/// Seconds since boot, suspended time included (/proc/uptime, CLOCK_BOOTTIME).
fn boot_secs() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/uptime").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

async fn run(s: XenStream, name: &str, o: Arc<Opts>, txseed: u32, rxseed: u32) -> bool {
    let local_port = s.local_addr().ok().map(|a| a.port);
    let peer_port = s.peer_addr().ok().map(|a| a.port);
    let (mut r, mut w) = s.into_split();
    let c = Arc::new(Counters::default());
    let t0 = Instant::now();
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
            if n % 5 == 0 {
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
                    *whyw.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("write returned 0 at offset {sent}"));
                    return;
                }
                Ok(Ok(n)) => {
                    sent += n as u64;
                    cw.sent.store(sent, Ordering::Relaxed);
                }
                Ok(Err(e)) => {
                    *whyw.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(format!("write at offset {sent}: {e}"));
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
            *whyw.lock().unwrap_or_else(|p| p.into_inner()) =
                Some(format!("end marker / shutdown after {sent} bytes: {e}"));
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
            *whyr.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
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
