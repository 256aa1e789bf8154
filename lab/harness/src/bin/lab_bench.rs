// SPDX-License-Identifier: MIT OR Apache-2.0
//! `lab_bench`: xlbench's workload (`lab/tools/xlbench.c`) over libxensock,
//! for the xensock rows of `lab/run bench`.
//!
//! ```text
//! lab_bench server kernel|user <port> <MiB> <N>
//! lab_bench client kernel|user <server-domid> <port> <MiB> <N> [connect-timeout-s]
//! lab_bench server user-tcpc[-paired] <port> <tcp-port> <MiB> <N> <rounds>
//! lab_bench client user-tcpc[-paired] <server-domid> <port> <server-ip> <tcp-port> <MiB> <N> <rounds> [connect-timeout-s]
//! ```
//!
//! `kernel`: `XenListener::bind` / `XenStream::connect`, which use the
//! AF_XEN family of `af_xen.ko` (refused if another backend is chosen).
//! `user`: the user-space transport over `/dev/xen`
//! (`Transport::from_env`, with a 30 s link timeout: the first link takes
//! seconds under TCG).
//!
//! Workload, as xlbench: the client streams `<MiB>` MiB in 64 KiB writes
//! of a prime-period pattern, the server checks every byte and answers one
//! byte, then `<N>` one-byte round trips. The client prints
//! `@@METRIC <label>.stream_mib_s` and `<label>.rtt_us_{avg,p50,p99}`
//! (label: `$XLBENCH_LABEL`, default `xensock-<mode>`).
//!
//! `user-tcpc`: the user-space transport's TCP carrier against
//! plain TCP over the same path, `<rounds>` interleaved rounds in one
//! process each side. Per round (the rows' order alternates, see
//! `round_order`) the client runs the workload over a plain
//! `TcpStream` to `<server-ip>:<tcp-port>` (row `tcp-same-phase-user`);
//! for the other row it connects over the user-space transport, checks that the
//! connection is on its ring, runs the transport's suspend hook
//! (`Transport::suspend`: every connection leaves its rings for its TCP
//! carrier and the links go down, as before a save or a move to another
//! host; nothing brings the connection back until `resume`), checks that
//! it sends on TCP with both legs up, and runs the workload over the
//! carrier (row `xensock-user-tcp-carrier`); the metrics are printed only
//! if the connection stayed on TCP throughout and every byte arrived
//! intact. Then `Transport::resume` lets the next round start on a ring.
//! Both rows also time `<N>` more round trips as one batch
//! (`rtt_us_batch`, as xlbench: clock reads are costly in these guests).
//!
//! `user-tcpc-paired`: the same two rows, but both connections are open at
//! once and their streams go in turns, a quarter at a time in A-B-B-A
//! order (`segment_plan`), so that both rows see the same host: in these
//! emulated guests a stream's speed drifts by 2-3x between seconds, which
//! sequential rows turn into noise in their ratio. Each row's throughput
//! is its bytes over the sum of its segments' times (first write to the
//! receiver's verdict; the verdict's round trip, ~3-5 ms per 16 MiB, is
//! counted in both rows). No per-stream `Usage` lines in this mode; at
//! the end each side prints every row's CPU time and context switches per
//! thread (`SchedTally`).

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use libxensock::{
    BackendKind, Carrier, Config, SockAddrXen, Transport, XenListener, XenStream, DOMID_ANY,
};
use xensock_discovery::xs::XsClient;

const CHUNK: usize = 64 * 1024;
const PATLEN: usize = 65521;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const BAD_MODE: &str = "mode must be kernel, user, user-tcpc or user-tcpc-paired";

fn pattern() -> Vec<u8> {
    (0..PATLEN + CHUNK)
        .map(|i| {
            let p = (i % PATLEN) as u64;
            ((p * 131) ^ (p >> 7)) as u8
        })
        .collect()
}

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> Res<T> {
    a.get(i)
        .ok_or_else(|| format!("missing {what}"))?
        .parse()
        .map_err(|_| format!("bad {what}").into())
}

fn user_transport() -> Res<Transport> {
    let cfg = Config {
        link_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let report = libxensock::backend();
    if report.user_space == BackendKind::Sim {
        // a trial run on the simulated host (XENSOCK_SIM, XENSOCK_SIM_DOMID)
        let dir = std::env::var("XENSOCK_SIM")?;
        let domid = std::env::var("XENSOCK_SIM_DOMID")?.parse()?;
        return Ok(Transport::sim_with(std::path::Path::new(&dir), domid, cfg)?);
    }
    if report.user_space != BackendKind::DevXen {
        return Err(format!(
            "user-space transport needs /dev/xen, have {}",
            report.user_space
        )
        .into());
    }
    let xs = XsClient::open()?;
    let domid = xs.read_string("domid")?.trim().parse()?;
    let dev = xensock_xenif::dev::DevXen::open()?;
    Ok(Transport::with_backend(
        dev,
        xs,
        domid,
        BackendKind::DevXen,
        cfg,
    )?)
}

fn check_kernel() -> Res<()> {
    let r = libxensock::backend();
    if r.kind != BackendKind::Kernel {
        return Err(format!("kernel mode, but the backend is {}", r.kind).into());
    }
    Ok(())
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let r = match a.get(1).map(String::as_str) {
        Some("server") => server(&a),
        Some("client") => client(&a),
        _ => Err("usage: lab_bench server kernel|user PORT MIB N | client kernel|user DOMID PORT MIB N [TIMEOUT]\n       lab_bench server user-tcpc[-paired] PORT TCP-PORT MIB N ROUNDS | client user-tcpc[-paired] DOMID PORT IP TCP-PORT MIB N ROUNDS [TIMEOUT]".into()),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("lab_bench: error: {e}");
            std::process::exit(2);
        }
    }
}

/// The receiving side of the workload on one connection: checks the
/// stream, answers `K` (or `X`), echoes `pings` bytes. Returns how many
/// reads were not what was sent (0: every byte intact).
/// The process's CPU (every thread: the transport's own too), its context
/// switches and the domain's idle/softirq/steal ticks (/proc/stat), for
/// where a stream's time went (as xlbench's usage and domain lines).
struct Usage {
    t: Instant,
    /// CLOCK_MONOTONIC in seconds, as `perf record -k mono` stamps samples
    mono: f64,
    cpu_ms: f64,
    /// of `cpu_ms`, in the kernel
    sys_ms: f64,
    switches: (i64, i64),
    ticks: [i64; 3],
    /// the domain's TCP and network-device counters (`net_counters`)
    net: Vec<(String, i64)>,
    /// each thread's name and CPU ticks (utime + stime)
    threads: Vec<(u64, String, i64)>,
}

/// The domain's TCP segments and ACK/coalescing counters (/proc/net/snmp,
/// /proc/net/netstat) and its network devices' packets (/proc/net/dev):
/// how finely a stream was cut and acknowledged, for comparing a
/// transport's TCP with plain TCP's in the same round; and the domain's
/// interrupts by source and context switches (from `stat`, the text of
/// /proc/stat the caller read).
fn net_counters(stat: &str) -> Vec<(String, i64)> {
    const WANTED: [&str; 8] = [
        "InSegs",
        "OutSegs",
        "DelayedACKs",
        "TCPPureAcks",
        "TCPHPHits",
        "TCPRcvCoalesce",
        "TCPBacklogCoalesce",
        "TCPAutoCorking",
    ];
    let mut out = Vec::new();
    for file in ["/proc/net/snmp", "/proc/net/netstat"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        // pairs of lines: "Tcp: names..." then "Tcp: values..."
        for pair in lines.chunks(2) {
            let [names, values] = pair else { continue };
            for (n, v) in names
                .split_whitespace()
                .zip(values.split_whitespace())
                .skip(1)
            {
                if let (true, Ok(v)) = (WANTED.contains(&n), v.parse::<i64>()) {
                    out.push((n.to_string(), v));
                }
            }
        }
    }
    let dev = std::fs::read_to_string("/proc/net/dev").unwrap_or_default();
    for line in dev.lines().skip(2) {
        let Some((name, rest)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        let f: Vec<i64> = rest
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if name != "lo" && f.len() > 9 {
            out.push((format!("{name}_rxpk"), f[1]));
            out.push((format!("{name}_txpk"), f[9]));
        }
    }
    // Interrupts by source, summed over CPUs (in a PV guest: event
    // channels for the timer, IPIs, netfront and our links), and the
    // domain's context switches: where kernel time goes besides calls.
    let irqs = std::fs::read_to_string("/proc/interrupts").unwrap_or_default();
    let cpus = irqs
        .lines()
        .next()
        .map_or(0, |l| l.split_whitespace().count());
    for line in irqs.lines().skip(1) {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let counts: Vec<i64> = fields
            .iter()
            .skip(1)
            .take(cpus)
            .map_while(|x| x.parse().ok())
            .collect();
        let Some(last) = fields.last() else { continue };
        if counts.is_empty() {
            continue;
        }
        let name = if fields.len() > cpus + 1 {
            last.to_string()
        } else {
            fields[0].trim_end_matches(':').to_string()
        };
        out.push((format!("irq_{name}"), counts.iter().sum()));
    }
    for line in stat.lines() {
        if let Some(v) = line.strip_prefix("ctxt ") {
            if let Ok(v) = v.trim().parse() {
                out.push(("ctxt".to_string(), v));
            }
        }
    }
    out
}

/// This process's threads: id and /proc/self/task directory.
fn threads() -> Vec<(u32, std::path::PathBuf)> {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| Some((e.file_name().to_string_lossy().parse().ok()?, e.path())))
        .collect()
}

/// This process's threads: id, name, CPU ticks so far (/proc/self/task).
fn thread_ticks() -> Vec<(u64, String, i64)> {
    let mut out = Vec::new();
    for (tid, dir) in threads() {
        let tid = u64::from(tid);
        let Ok(stat) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        // "tid (comm) state ppid ..."; utime and stime are fields 14 and 15
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let field = |i: usize| rest.get(i).and_then(|v| v.parse::<i64>().ok()).unwrap_or(0);
        out.push((tid, name, field(11) + field(12)));
    }
    out
}

/// Each thread of this process: id, name, CPU time (ns, the thread's CPU
/// clock: exact, unlike the tick-sampled `stat` times; `schedstat` is off
/// in the lab kernel) and context switches (voluntary + involuntary, from
/// `status`).
fn sched_snapshot() -> Vec<(u64, String, u64, u64)> {
    let mut out = Vec::new();
    for (tid, dir) in threads() {
        let name = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
        let status = std::fs::read_to_string(dir.join("status")).unwrap_or_default();
        let switches: u64 = status
            .lines()
            .filter(|l| l.contains("ctxt_switches:"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum();
        // A thread's CPU clock: MAKE_THREAD_CPUCLOCK(tid, CPUCLOCK_SCHED)
        // of linux/posix-timers.h.
        let clock = ((!tid) << 3 | 6) as libc::clockid_t;
        // SAFETY: clock_gettime fills the zeroed timespec it is given.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: `ts` is a valid, writable timespec; a thread that has
        // exited makes the call fail, not misbehave.
        if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
            continue;
        }
        let ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
        out.push((u64::from(tid), name.trim().to_string(), ns, switches));
    }
    out
}

/// CPU time and context switches per thread name, summed over the segments of
/// one row of a paired round (`add` the difference of two snapshots).
#[derive(Default)]
struct SchedTally(std::collections::BTreeMap<String, (u64, u64)>);

impl SchedTally {
    fn add(&mut self, before: &[(u64, String, u64, u64)], after: &[(u64, String, u64, u64)]) {
        for (tid, name, ns, slices) in after {
            let (ns0, sl0) = before
                .iter()
                .find(|b| b.0 == *tid)
                .map_or((0, 0), |b| (b.2, b.3));
            let e = self.0.entry(name.clone()).or_default();
            e.0 += ns.saturating_sub(ns0);
            e.1 += slices.saturating_sub(sl0);
        }
    }

    /// One line: per thread name, ms of CPU and context switches per round.
    fn report(&self, label: &str, rounds: u32) {
        let r = u64::from(rounds.max(1));
        let total: u64 = self.0.values().map(|v| v.0).sum();
        let per: Vec<String> = self
            .0
            .iter()
            .filter(|(_, v)| v.0 > 0)
            .map(|(n, v)| format!("{n} {:.1} ms/{}", v.0 as f64 / 1e6 / r as f64, v.1 / r))
            .collect();
        println!(
            "lab_bench {label} sched per round: {:.1} ms; {}",
            total as f64 / 1e6 / r as f64,
            per.join(", ")
        );
    }
}

impl Usage {
    fn now() -> Usage {
        // SAFETY: getrusage fills the zeroed struct it is given.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: `r` is a valid, writable rusage.
        unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) };
        let ms = |t: libc::timeval| t.tv_sec as f64 * 1e3 + t.tv_usec as f64 / 1e3;
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        let v: Vec<i64> = stat
            .lines()
            .next()
            .unwrap_or("")
            .split_whitespace()
            .skip(1)
            .filter_map(|x| x.parse().ok())
            .collect();
        let tick = |i: usize| v.get(i).copied().unwrap_or(0);
        // SAFETY: clock_gettime fills the zeroed timespec it is given.
        let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
        // SAFETY: `ts` is a valid, writable timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        Usage {
            t: Instant::now(),
            mono: ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9,
            cpu_ms: ms(r.ru_utime) + ms(r.ru_stime),
            sys_ms: ms(r.ru_stime),
            switches: (r.ru_nvcsw, r.ru_nivcsw),
            ticks: [tick(3), tick(6), tick(7)],
            threads: thread_ticks(),
            net: net_counters(&stat),
        }
    }

    /// One line: since `self`, `calls` reads or writes moved `bytes`.
    fn report(&self, label: &str, calls: u64, bytes: u64) {
        let b = Usage::now();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1);
        let t = |i: usize| (b.ticks[i] - self.ticks[i]) * 1000 / hz;
        println!(
            "lab_bench {label} stream: wall {:.0} ms, process cpu {:.0} ms ({:.0} in the kernel), {} voluntary / {} involuntary switches, {calls} calls ({:.1} KiB each); domain idle {} ms, softirq {} ms, steal {} ms",
            b.t.duration_since(self.t).as_secs_f64() * 1e3,
            b.cpu_ms - self.cpu_ms,
            b.sys_ms - self.sys_ms,
            b.switches.0 - self.switches.0,
            b.switches.1 - self.switches.1,
            bytes as f64 / calls.max(1) as f64 / 1024.0,
            t(0),
            t(1),
            t(2)
        );
        let net: Vec<String> = b
            .net
            .iter()
            .filter_map(|(n, now)| {
                let was = self.net.iter().find(|(m, _)| m == n).map_or(0, |(_, v)| *v);
                (now != &was).then(|| format!("{n}={}", now - was))
            })
            .collect();
        println!("lab_bench {label} stream net: {}", net.join(" "));
        // for a profile of just this stream (tests/lab/bench, BENCH_PERF)
        println!(
            "lab_bench {label} stream window: monotonic {:.6},{:.6}",
            self.mono, b.mono
        );
        // which of the process's threads used its CPU (the transport's own
        // threads run beside the application's)
        let mut per: Vec<(String, i64)> = b
            .threads
            .iter()
            .map(|(id, name, now)| {
                let was = self
                    .threads
                    .iter()
                    .find(|(i, ..)| i == id)
                    .map_or(0, |(_, _, v)| *v);
                (format!("{name}/{id}"), (now - was) * 1000 / hz)
            })
            .filter(|(_, ms)| *ms > 0)
            .collect();
        per.sort_by_key(|p| std::cmp::Reverse(p.1));
        let list: Vec<String> = per.iter().map(|(n, ms)| format!("{n} {ms} ms")).collect();
        println!("lab_bench {label} stream threads: {}", list.join(", "));
    }
}

fn serve_one<S: Read + Write>(s: &mut S, pat: &[u8], mib: u64, pings: u64) -> Res<u64> {
    serve_one_as(s, pat, mib, pings, None)
}

/// `serve_one`, printing the stream's `Usage` (from its first bytes) as `label`.
fn serve_one_as<S: Read + Write>(
    s: &mut S,
    pat: &[u8],
    mib: u64,
    pings: u64,
    label: Option<&str>,
) -> Res<u64> {
    let mut usage = None;
    let mut pos = 0;
    let (bad, reads) = serve_segment(s, pat, &mut pos, mib << 20, label.map(|_| &mut usage))?;
    if let (Some(label), Some(u)) = (label, usage) {
        u.report(label, reads, mib << 20);
    }
    echo_pings(s, pings)?;
    Ok(bad)
}

/// Receives `len` bytes of the pattern from stream offset `*pos`, checks
/// them and answers `K` (or `X`). Returns the reads that were not what was
/// sent and the number of reads; `usage`, if given, is taken at the first
/// bytes.
fn serve_segment<S: Read + Write + ?Sized>(
    s: &mut S,
    pat: &[u8],
    pos: &mut u64,
    len: u64,
    mut usage: Option<&mut Option<Usage>>,
) -> Res<(u64, u64)> {
    let end = *pos + len;
    let mut buf = vec![0u8; CHUNK];
    let (mut bad, mut reads) = (0u64, 0u64);
    while *pos < end {
        let want = (end - *pos).min(CHUNK as u64) as usize;
        let r = s.read(&mut buf[..want])?;
        if r == 0 {
            return Err(format!("stream ended at {} of {end} bytes", *pos).into());
        }
        reads += 1;
        if let Some(u) = usage.as_deref_mut() {
            u.get_or_insert_with(Usage::now);
        }
        let off = (*pos % PATLEN as u64) as usize;
        if buf[..r] != pat[off..off + r] {
            bad += 1;
        }
        *pos += r as u64;
    }
    s.write_all(if bad == 0 { b"K" } else { b"X" })?;
    Ok((bad, reads))
}

/// Echoes `pings` one-byte round trips.
fn echo_pings<S: Read + Write + ?Sized>(s: &mut S, pings: u64) -> Res<()> {
    let mut b = [0u8; 1];
    for _ in 0..pings {
        s.read_exact(&mut b)?;
        s.write_all(&b)?;
    }
    Ok(())
}

/// What the sending side of the workload measured.
struct Measured {
    stream_mib_s: f64,
    intact: bool,
    /// Each round trip, microseconds, sorted.
    rtt_us: Vec<f64>,
    /// The mean of `batch` more round trips timed as one.
    batch_us: Option<f64>,
}

/// The sending side: `mib` MiB in 64 KiB writes, the receiver's verdict,
/// `pings` timed round trips, then `batch` more timed together (the
/// receiver must echo `pings + batch`); the stream's `Usage` is printed as
/// the row `label`.
fn drive_one<S: Read + Write>(
    s: &mut S,
    pat: &[u8],
    mib: u64,
    pings: usize,
    batch: usize,
    label: &str,
) -> Res<Measured> {
    let usage = Usage::now();
    let mut pos = 0;
    let (secs, writes, intact) = drive_segment(s, pat, &mut pos, mib << 20)?;
    usage.report(&format!("{label} client"), writes, mib << 20);
    let mut m = Measured {
        stream_mib_s: mib as f64 / secs,
        intact,
        rtt_us: Vec::new(),
        batch_us: None,
    };
    if m.intact {
        (m.rtt_us, m.batch_us) = drive_pings(s, pings, batch)?;
    }
    Ok(m)
}

/// Sends `len` bytes of the pattern from stream offset `*pos` in 64 KiB
/// writes and waits for the receiver's verdict. Returns the seconds from
/// the first write to the verdict, the writes, and whether it was `K`.
fn drive_segment<S: Read + Write + ?Sized>(
    s: &mut S,
    pat: &[u8],
    pos: &mut u64,
    len: u64,
) -> Res<(f64, u64, bool)> {
    let end = *pos + len;
    let t0 = Instant::now();
    let mut writes = 0u64;
    while *pos < end {
        let n = (end - *pos).min(CHUNK as u64) as usize;
        let off = (*pos % PATLEN as u64) as usize;
        s.write_all(&pat[off..off + n])?;
        *pos += n as u64;
        writes += 1;
    }
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    Ok((t0.elapsed().as_secs_f64(), writes, b[0] == b'K'))
}

/// `pings` round trips timed one by one (sorted, microseconds), then
/// `batch` more timed as one (their mean).
fn drive_pings<S: Read + Write + ?Sized>(
    s: &mut S,
    pings: usize,
    batch: usize,
) -> Res<(Vec<f64>, Option<f64>)> {
    let mut b = [0u8; 1];
    let mut ping = |i: usize| -> Res<()> {
        s.write_all(&[i as u8])?;
        s.read_exact(&mut b)?;
        if b[0] != i as u8 {
            return Err("ping-pong byte mismatch".into());
        }
        Ok(())
    };
    let mut rtt_us = Vec::with_capacity(pings);
    for i in 0..pings {
        let t = Instant::now();
        ping(i)?;
        rtt_us.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let mut batch_us = None;
    if batch > 0 {
        let t = Instant::now();
        for i in 0..batch {
            ping(i)?;
        }
        batch_us = Some(t.elapsed().as_secs_f64() * 1e6 / batch as f64);
    }
    rtt_us.sort_by(f64::total_cmp);
    Ok((rtt_us, batch_us))
}

fn print_metrics(label: &str, m: &Measured) {
    println!("@@METRIC {label}.stream_mib_s {:.1} MiB/s", m.stream_mib_s);
    let n = m.rtt_us.len();
    if n > 0 {
        let avg = m.rtt_us.iter().sum::<f64>() / n as f64;
        println!("@@METRIC {label}.rtt_us_avg {avg:.1} us");
        println!("@@METRIC {label}.rtt_us_p50 {:.1} us", m.rtt_us[n / 2]);
        println!(
            "@@METRIC {label}.rtt_us_p99 {:.1} us",
            m.rtt_us[n * 99 / 100]
        );
    }
    if let Some(b) = m.batch_us {
        println!("@@METRIC {label}.rtt_us_batch {b:.1} us");
    }
}

/// `user-tcpc` server: per round one plain TCP connection, then one over
/// the user-space transport, each with the workload (pings echoed twice:
/// timed one by one, then as a batch).
fn server_tcpc(a: &[String], mode: TcpcMode) -> Res<i32> {
    let port: u32 = arg(a, 3, "port")?;
    let tcp_port: u16 = arg(a, 4, "TCP port")?;
    let mib: u64 = arg(a, 5, "MiB")?;
    let n: u64 = arg(a, 6, "N")?;
    let rounds: u32 = arg(a, 7, "rounds")?;
    let transport = user_transport()?;
    let listener = transport.bind(SockAddrXen::new(DOMID_ANY, port))?;
    let tcp = std::net::TcpListener::bind(("0.0.0.0", tcp_port))?;
    println!(
        "lab_bench user-tcpc server: {} on {}, TCP on {}{}",
        listener.backend_kind(),
        listener.local_addr()?,
        tcp.local_addr()?,
        mode.banner()
    );
    let pat = pattern();
    let mut all_intact = true;
    let rows = mode.rows();
    let mut tallies: Vec<SchedTally> = rows.iter().map(|_| SchedTally::default()).collect();
    for round in 1..=rounds {
        if mode.paired() {
            let (c, c_peer) = listener.accept()?;
            let mut carrier = Some((RowConn::Carrier(c), c_peer.to_string()));
            let mut conns = Vec::new();
            for row in &rows {
                conns.push(match row {
                    Row::Carrier => carrier.take().ok_or("two carrier rows")?,
                    Row::Tcp => {
                        let (t, peer) = tcp.accept()?;
                        t.set_nodelay(true)?;
                        (RowConn::Tcp(t), peer.to_string())
                    }
                });
            }
            let mut pos = vec![0u64; rows.len()];
            let mut bad = vec![0u64; rows.len()];
            for (i, len) in segment_plan(rows.len(), mib << 20, round) {
                let before = sched_snapshot();
                bad[i] += serve_segment(conns[i].0.io(), &pat, &mut pos[i], len, None)?.0;
                tallies[i].add(&before, &sched_snapshot());
            }
            for i in turn_order(rows.len(), round) {
                echo_pings(conns[i].0.io(), 2 * n)?;
            }
            // the client reads its last echo before it closes
            let mut b = [0u8; 1];
            for (c, _) in conns.iter_mut() {
                let _ = c.io().read(&mut b);
            }
            for (i, (row, (_, peer))) in rows.iter().zip(&conns).enumerate() {
                println!(
                    "lab_bench user-tcpc server: round {round}: {} from {peer}: intact {}",
                    row.label(),
                    bad[i] == 0
                );
                all_intact &= bad[i] == 0;
            }
            continue;
        }
        for leg in round_order(round) {
            let (ok, peer, label) = match leg {
                Row::Tcp => {
                    let (mut s, peer) = tcp.accept()?;
                    s.set_nodelay(true)?;
                    let bad =
                        serve_one_as(&mut s, &pat, mib, 2 * n, Some("tcp-same-phase-user server"))?;
                    (bad == 0, peer.to_string(), "TCP")
                }
                Row::Carrier => {
                    let (mut s, peer) = listener.accept()?;
                    let bad = serve_one_as(
                        &mut s,
                        &pat,
                        mib,
                        2 * n,
                        Some("xensock-user-tcp-carrier server"),
                    )?;
                    // the client reads the last echo before it closes
                    let mut b = [0u8; 1];
                    let _ = s.read(&mut b);
                    (bad == 0, peer.to_string(), "xensock")
                }
            };
            println!("lab_bench user-tcpc server: round {round}: {label} from {peer}: intact {ok}");
            all_intact &= ok;
        }
    }
    if mode.paired() {
        for (row, t) in rows.iter().zip(&tallies) {
            t.report(&format!("{} server", row.label()), rounds);
        }
    }
    println!("lab_bench user-tcpc server: served {rounds} rounds of {mib} MiB, echoed {n}+{n} pings each");
    drop(listener);
    drop(transport);
    Ok(if all_intact { 0 } else { 1 })
}

/// This process's connection `s` as `Transport::status` shows it.
fn carrier_of(t: &Transport, s: &XenStream) -> Res<Carrier> {
    let local = s.local_addr()?;
    t.status()
        .connections
        .into_iter()
        .find(|c| c.local == local)
        .map(|c| c.carrier)
        .ok_or_else(|| format!("{local} is not in the transport's status").into())
}

/// Sends on the TCP carrier with both legs up, never back on a ring.
fn on_tcp(c: &Carrier) -> bool {
    matches!(
        c,
        Carrier::Switched {
            tx: "tcp",
            legs_up: true,
            tx_to_ring: 0,
            failure: None,
            ..
        }
    )
}

fn tcp_connect(addr: &str, secs: u64) -> Res<std::net::TcpStream> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        match std::net::TcpStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < end => {
                println!("connect {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("connect {addr}: {e}").into()),
        }
    }
}

/// The rows of a `user-tcpc` round.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Row {
    Tcp,
    Carrier,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Tcp => "tcp-same-phase-user",
            Row::Carrier => "xensock-user-tcp-carrier",
        }
    }
}

/// How a `user-tcpc` run measures its rows (see the module comment).
#[derive(Clone, Copy, PartialEq, Eq)]
enum TcpcMode {
    /// `user-tcpc`: one whole stream per row, one row after the other.
    Rows,
    /// `user-tcpc-paired`: both rows' connections open, streams in turns.
    Paired,
}

impl TcpcMode {
    fn parse(mode: &str) -> Option<TcpcMode> {
        match mode {
            "user-tcpc" => Some(TcpcMode::Rows),
            "user-tcpc-paired" => Some(TcpcMode::Paired),
            _ => None,
        }
    }

    fn paired(self) -> bool {
        self != TcpcMode::Rows
    }

    /// The rows of a paired round, in the order both sides set up their
    /// connections (the carrier's comes first on the wire in any case).
    fn rows(self) -> Vec<Row> {
        vec![Row::Tcp, Row::Carrier]
    }

    /// What the server says of the mode when it starts.
    fn banner(self) -> &'static str {
        match self {
            TcpcMode::Rows => "",
            TcpcMode::Paired => ", paired segments",
        }
    }
}

/// A connection of one row of a paired round.
enum RowConn {
    Tcp(std::net::TcpStream),
    Carrier(XenStream),
}

impl RowConn {
    fn io(&mut self) -> &mut dyn ReadWrite {
        match self {
            RowConn::Tcp(s) => s,
            RowConn::Carrier(s) => s,
        }
    }
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// Which row goes first alternates between rounds, so that neither row
/// always follows the other (a stream right after another may find the
/// guests' caches, timers and TCP state in a different shape).
fn round_order(round: u32) -> [Row; 2] {
    if round % 2 == 1 {
        [Row::Tcp, Row::Carrier]
    } else {
        [Row::Carrier, Row::Tcp]
    }
}

/// What every round of the `user-tcpc` client works with.
struct Tcpc<'a> {
    transport: &'a Transport,
    /// The server: its domid and AF_XEN port, and its plain TCP address.
    domid: u32,
    port: u32,
    tcp_addr: &'a str,
    /// Connect timeout, seconds.
    timeout: u64,
    pat: &'a [u8],
    mib: u64,
    /// Round trips per row.
    n: usize,
}

/// One plain-TCP row of `user-tcpc`; whether it arrived intact.
fn tcp_round(t: &Tcpc, round: u32) -> Res<bool> {
    let mut s = tcp_connect(t.tcp_addr, t.timeout)?;
    s.set_nodelay(true)?;
    let m = drive_one(&mut s, t.pat, t.mib, t.n, t.n, "tcp-same-phase-user")?;
    if m.intact {
        print_metrics("tcp-same-phase-user", &m);
    } else {
        println!("lab_bench user-tcpc client: round {round}: the server saw corrupted TCP data");
    }
    Ok(m.intact)
}

/// A connection made on its ring, then moved to the TCP carrier by the
/// transport's suspend hook (see the module comment); `None` (the
/// transport resumed) if it was not on its ring first or not on TCP after.
fn moved_connection(
    transport: &Transport,
    domid: u32,
    port: u32,
    timeout: u64,
    round: u32,
) -> Res<Option<XenStream>> {
    let s = connect(
        "user",
        Some(transport),
        SockAddrXen::new(domid, port),
        timeout,
    )?;
    let before = carrier_of(transport, &s)?;
    if before != Carrier::Ring {
        println!("lab_bench user-tcpc client: round {round}: carrier {before} before the switch (want ring)");
        return Ok(None);
    }
    let t0 = Instant::now();
    let moved = transport.suspend();
    let hook_ms = t0.elapsed().as_secs_f64() * 1e3;
    // The hook returns once both legs are up and nothing shared is held;
    // the sending direction leaves FROZEN one round trip later (the
    // peer's Consumed for our TxFreeze, which goes out on the leg the
    // peer connects back), so wait for that, bounded.
    let mut after = carrier_of(transport, &s)?;
    let settle = Instant::now() + Duration::from_secs(10);
    while !on_tcp(&after) && Instant::now() < settle {
        std::thread::sleep(Duration::from_millis(1));
        after = carrier_of(transport, &s)?;
    }
    println!(
        "lab_bench user-tcpc client: round {round}: suspend hook moved {moved} connection(s) in {hook_ms:.0} ms, on TCP {:.0} ms after it began; carrier {after}",
        t0.elapsed().as_secs_f64() * 1e3
    );
    if !on_tcp(&after) {
        println!("lab_bench user-tcpc client: round {round}: not on the TCP carrier after the suspend hook");
        transport.resume();
        return Ok(None);
    }
    Ok(Some(s))
}

/// Whether `s` stayed on the TCP carrier through the workload and `m`
/// arrived intact; prints the row's metrics if so.
fn carrier_verdict(transport: &Transport, s: &XenStream, m: &Measured, round: u32) -> Res<bool> {
    let end = carrier_of(transport, s)?;
    println!("lab_bench user-tcpc client: round {round}: carrier {end} after the workload");
    Ok(if !m.intact {
        println!("lab_bench user-tcpc client: round {round}: the server saw corrupted data");
        false
    } else if !on_tcp(&end) {
        println!(
            "lab_bench user-tcpc client: round {round}: left the TCP carrier during the workload"
        );
        false
    } else {
        print_metrics("xensock-user-tcp-carrier", m);
        true
    })
}

/// One carrier row of `user-tcpc`; whether it stayed on TCP and arrived
/// intact. Leaves the transport resumed.
fn carrier_round(t: &Tcpc, round: u32) -> Res<bool> {
    let Some(mut s) = moved_connection(t.transport, t.domid, t.port, t.timeout, round)? else {
        return Ok(false);
    };
    let m = drive_one(&mut s, t.pat, t.mib, t.n, t.n, "xensock-user-tcp-carrier")?;
    let ok = carrier_verdict(t.transport, &s, &m, round)?;
    drop(s);
    t.transport.resume();
    Ok(ok)
}

/// Segments per row in a paired round: the stream is cut into this many
/// parts per connection, sent in turn (see `segment_plan`).
const SEGMENTS_PER_ROW: u64 = 4;

/// The segments of a paired round: which of its `rows` rows sends next
/// (an index) and how much. The rows take turns in A-B-B-A order
/// (A-B-C-C-B-A with three; the first row alternating between rounds), so
/// a drift in the host's speed that is linear over the round weighs on
/// every row alike.
fn segment_plan(rows: usize, total: u64, round: u32) -> Vec<(usize, u64)> {
    let chunks = total.div_ceil(CHUNK as u64);
    let per = chunks.div_ceil(SEGMENTS_PER_ROW) * CHUNK as u64;
    let mut plan = Vec::new();
    let mut left = total;
    for turn in 0..SEGMENTS_PER_ROW {
        if left == 0 {
            break;
        }
        let len = per.min(left);
        left -= len;
        plan.extend(
            turn_order(rows, round + turn as u32)
                .into_iter()
                .map(|i| (i, len)),
        );
    }
    plan
}

/// The indices of `rows` rows, forwards in odd turns, backwards in even
/// ones.
fn turn_order(rows: usize, turn: u32) -> Vec<usize> {
    let mut order: Vec<usize> = (0..rows).collect();
    if turn.is_multiple_of(2) {
        order.reverse();
    }
    order
}

/// One paired round of `user-tcpc-paired`: a plain TCP connection and a
/// moved carrier connection open side by side, their streams sent in turns per `segment_plan`, each row's
/// throughput its bytes over the sum of its segments' times (each from its
/// first write to the receiver's verdict); then each row's round trips.
/// Returns the failed rows. Leaves the transport resumed.
fn paired_round(t: &Tcpc, round: u32, mode: TcpcMode, tallies: &mut [SchedTally]) -> Res<u32> {
    let rows = mode.rows();
    // the server accepts in this order: the carrier, then the TCP rows
    let Some(c) = moved_connection(t.transport, t.domid, t.port, t.timeout, round)? else {
        return Ok(1);
    };
    let mut carrier = Some(RowConn::Carrier(c));
    let mut conns = Vec::new();
    for row in &rows {
        conns.push(match row {
            Row::Carrier => carrier.take().ok_or("two carrier rows")?,
            Row::Tcp => {
                let s = tcp_connect(t.tcp_addr, t.timeout)?;
                s.set_nodelay(true)?;
                RowConn::Tcp(s)
            }
        });
    }
    let mut pos = vec![0u64; rows.len()];
    let mut measured: Vec<Measured> = rows
        .iter()
        .map(|_| Measured {
            stream_mib_s: 0.0,
            intact: true,
            rtt_us: Vec::new(),
            batch_us: None,
        })
        .collect();
    let mut secs = vec![0.0f64; rows.len()];
    for (i, len) in segment_plan(rows.len(), t.mib << 20, round) {
        let before = sched_snapshot();
        let (s, _, ok) = drive_segment(conns[i].io(), t.pat, &mut pos[i], len)?;
        tallies[i].add(&before, &sched_snapshot());
        secs[i] += s;
        measured[i].intact &= ok;
    }
    for (m, s) in measured.iter_mut().zip(&secs) {
        m.stream_mib_s = t.mib as f64 / s;
    }
    for i in turn_order(rows.len(), round) {
        let m = &mut measured[i];
        if m.intact {
            (m.rtt_us, m.batch_us) = drive_pings(conns[i].io(), t.n, t.n)?;
        }
    }
    let mut failed = 0;
    for ((row, conn), m) in rows.iter().zip(&conns).zip(&measured) {
        let ok = match conn {
            RowConn::Carrier(s) => carrier_verdict(t.transport, s, m, round)?,
            _ if m.intact => {
                print_metrics(row.label(), m);
                true
            }
            _ => {
                println!(
                    "lab_bench user-tcpc client: round {round}: the server saw corrupted data on {}",
                    row.label()
                );
                false
            }
        };
        if !ok {
            failed += 1;
        }
    }
    drop(conns);
    t.transport.resume();
    Ok(failed)
}

/// `user-tcpc` client (see the module comment).
fn client_tcpc(a: &[String], mode: TcpcMode) -> Res<i32> {
    let domid: u32 = arg(a, 3, "domid")?;
    let port: u32 = arg(a, 4, "port")?;
    let ip: std::net::IpAddr = arg(a, 5, "server IP")?;
    let tcp_port: u16 = arg(a, 6, "TCP port")?;
    let mib: u64 = arg(a, 7, "MiB")?;
    let n: usize = arg(a, 8, "N")?;
    let rounds: u32 = arg(a, 9, "rounds")?;
    let timeout: u64 = if a.len() > 10 {
        arg(a, 10, "timeout")?
    } else {
        120
    };
    let tcp_addr = std::net::SocketAddr::new(ip, tcp_port).to_string();
    let transport = user_transport()?;
    let pat = pattern();
    let t = Tcpc {
        transport: &transport,
        domid,
        port,
        tcp_addr: &tcp_addr,
        timeout,
        pat: &pat,
        mib,
        n,
    };
    let mut failed = 0;
    let rows = mode.rows();
    let mut tallies: Vec<SchedTally> = rows.iter().map(|_| SchedTally::default()).collect();
    for round in 1..=rounds {
        if mode.paired() {
            failed += paired_round(&t, round, mode, &mut tallies)?;
            io::stdout().flush()?;
            continue;
        }
        for row in round_order(round) {
            let ok = match row {
                Row::Tcp => tcp_round(&t, round)?,
                Row::Carrier => carrier_round(&t, round)?,
            };
            if !ok {
                failed += 1;
            }
            io::stdout().flush()?;
        }
    }
    if mode.paired() {
        for (row, t) in rows.iter().zip(&tallies) {
            t.report(&format!("{} client", row.label()), rounds);
        }
    }
    drop(transport);
    Ok(if failed == 0 { 0 } else { 1 })
}

fn server(a: &[String]) -> Res<i32> {
    let mode = a.get(2).map(String::as_str).unwrap_or("");
    if let Some(m) = TcpcMode::parse(mode) {
        return server_tcpc(a, m);
    }
    let port: u32 = arg(a, 3, "port")?;
    let mib: u64 = arg(a, 4, "MiB")?;
    let n: u64 = arg(a, 5, "N")?;
    let addr = SockAddrXen::new(DOMID_ANY, port);
    let mut transport = None;
    let listener = match mode {
        "kernel" => {
            check_kernel()?;
            XenListener::bind(addr)?
        }
        "user" => transport.insert(user_transport()?).bind(addr)?,
        _ => return Err(BAD_MODE.into()),
    };
    println!(
        "lab_bench {mode} server: {} on {}",
        listener.backend_kind(),
        listener.local_addr()?
    );
    let (mut s, peer) = listener.accept()?;
    println!("lab_bench {mode} server: connection from {peer}");
    let bad = serve_one(&mut s, &pattern(), mib, n)?;
    println!("lab_bench {mode} server: received {mib} MiB ({bad} bad reads), echoed {n} pings");
    // let the client read the last echo before the connection goes
    std::thread::sleep(Duration::from_secs(1));
    drop(s);
    drop(listener);
    drop(transport);
    Ok(if bad == 0 { 0 } else { 1 })
}

fn connect(mode: &str, t: Option<&Transport>, addr: SockAddrXen, secs: u64) -> Res<XenStream> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = match (mode, t) {
            ("kernel", _) => XenStream::connect(addr),
            (_, Some(t)) => t.connect(addr),
            _ => return Err("no transport".into()),
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < end => {
                println!("connect {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("connect {addr}: {e}").into()),
        }
    }
}

fn client(a: &[String]) -> Res<i32> {
    let mode = a.get(2).map(String::as_str).unwrap_or("");
    if let Some(m) = TcpcMode::parse(mode) {
        return client_tcpc(a, m);
    }
    let domid: u32 = arg(a, 3, "domid")?;
    let port: u32 = arg(a, 4, "port")?;
    let mib: u64 = arg(a, 5, "MiB")?;
    let n: usize = arg(a, 6, "N")?;
    let timeout: u64 = if a.len() > 7 {
        arg(a, 7, "timeout")?
    } else {
        120
    };
    let label = std::env::var("XLBENCH_LABEL").unwrap_or_else(|_| format!("xensock-{mode}"));
    let transport = match mode {
        "kernel" => {
            check_kernel()?;
            None
        }
        "user" => Some(user_transport()?),
        _ => return Err(BAD_MODE.into()),
    };
    let mut s = connect(
        mode,
        transport.as_ref(),
        SockAddrXen::new(domid, port),
        timeout,
    )?;
    println!(
        "lab_bench {mode} client: {} {} -> {}",
        s.backend_kind(),
        s.local_addr()?,
        s.peer_addr()?
    );
    let m = drive_one(&mut s, &pattern(), mib, n, 0, &label)?;
    if !m.intact {
        println!("lab_bench {mode}: server saw corrupted stream data");
        return Ok(1);
    }
    print_metrics(&label, &m);
    io::stdout().flush()?;
    drop(s);
    drop(transport);
    Ok(0)
}
