// SPDX-License-Identifier: MIT OR Apache-2.0
//! The `xensock` command line tool.
//!
//! * `xensock demo`: a simulated host with two domains, an echo server in
//!   one, a client in the other, a checksummed stream through the rings,
//!   and the same through TCP loopback for comparison.
//! * `xensock bench`: throughput, latency, connection rate and memory per
//!   idle connection for xensock vs AF_UNIX vs TCP loopback, in one run.
//! * `xensock status`: the backend, and the links and connections of this
//!   domain as XenStore and this process see them; with the kernel module
//!   loaded, its connections from `/proc/net/af_xen` (carrier and switch
//!   counts) and its switch counters.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use libxensock::{SockAddrXen, SocketOptions, Transport, XenStream};
use xensock_proto::link::node as link_node;
use xensock_sim::{DomainConfig, SimHost};

#[derive(Parser)]
#[command(
    name = "xensock",
    version,
    about = "xensock: sockets between co-resident Xen domains"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Echo a checksummed stream between two (simulated) domains and compare with TCP loopback.
    Demo {
        /// MiB to stream (each way).
        #[arg(long, default_value_t = 256)]
        mib: u64,
        /// Write size in bytes.
        #[arg(long, default_value_t = 65536)]
        write_size: usize,
        /// Receive ring size in bytes.
        #[arg(long, default_value_t = 1 << 20)]
        ring: usize,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Throughput, latency, connection rate and memory: xensock vs AF_UNIX vs TCP loopback.
    Bench {
        /// Scale the amount of work (1 = default; smaller is quicker).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Write a PNG chart of the throughput table to this path.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Repetitions of every measurement; the table shows the median
        /// (and xensock's min..max).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Where the stream test's writer and reader run: `spread` pins
        /// them to different CPUs (as two domains on two vCPUs), `same`
        /// to one CPU, `any` lets the scheduler choose (then the figures
        /// jump between the two regimes from run to run).
        #[arg(long, value_enum, default_value_t = Placement::Spread)]
        placement: Placement,
    },
    /// Backend, links and connections of the calling domain (this
    /// process's and, through their control sockets, every other
    /// process's user-space transport: carrier and switch counts).
    Status {
        /// One JSON object instead of text (for scripts and monitoring).
        #[arg(long)]
        json: bool,
    },
    /// Migration hook, before this guest is suspended, saved or migrated:
    /// every process's user-space transport moves its connections off the
    /// rings (onto their TCP carrier). Run it from the guest's suspend path.
    Suspend,
    /// Migration hook, after resume: transports follow a new domid and
    /// bring connections back onto rings. (They also notice a new domid by
    /// themselves.)
    Resume,
    /// Connect to a xensock listener and copy stdin to it and it to stdout
    /// (as `nc`): stdin's end of file half-closes the connection; the
    /// command ends when the peer's end of stream arrives.
    Connect {
        /// `xen:DOMID:PORT`.
        addr: String,
    },
    /// Listen on a port of this domain, accept one connection and copy it
    /// to stdout and stdin to it (as `nc -l`).
    Listen {
        /// The port (`xen:self:PORT` is also accepted).
        port: String,
    },
    /// Run this guest's user-space transport for every process of the
    /// guest: programs' XenStream and XenListener then go through this
    /// daemon (each connection a Unix socket it relays), so any number of
    /// processes have their own connections. Runs until killed.
    Daemon {
        /// The socket programs reach the daemon on (default
        /// `$XENSOCK_DAEMON_SOCKET`, else /run/xensock/daemon.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Run an unmodified TCP program with libxensock_preload.so
    /// (`LD_PRELOAD`): `xensock run -- PROG ARGS...`. The library is
    /// `$XENSOCK_PRELOAD_LIB`, else the one next to this binary, else
    /// `../lib/libxensock_preload.so` from it.
    Run {
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
}

/// The preload library `xensock run` puts in front of a program.
fn preload_library() -> Result<PathBuf, Box<dyn std::error::Error>> {
    const NAME: &str = "libxensock_preload.so";
    if let Some(p) = std::env::var_os("XENSOCK_PRELOAD_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("XENSOCK_PRELOAD_LIB={}: no such file", p.display()).into())
        };
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or("the xensock binary has no directory")?;
    let candidates = [dir.join(NAME), dir.join("../lib").join(NAME)];
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "{NAME} not found next to {} or in ../lib (set XENSOCK_PRELOAD_LIB)",
                exe.display()
            )
            .into()
        })
}

/// `xensock run`: the program, with the preload library first in
/// `LD_PRELOAD`; replaces this process.
fn run(command: Vec<std::ffi::OsString>) -> Result<(), Box<dyn std::error::Error>> {
    use std::os::unix::process::CommandExt;
    let lib = preload_library()?;
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(" ");
        preload.push(old);
    }
    let (prog, args) = command.split_first().ok_or("no program to run")?;
    let e = std::process::Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", preload)
        .exec();
    Err(format!("{}: {e}", prog.to_string_lossy()).into())
}

/// What `bench` can know is wrong before it runs for minutes.
fn check_bench_args(scale: f64, plot: Option<&std::path::Path>) -> Res<()> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(format!("--scale must be a positive number, not {scale}").into());
    }
    if let Some(p) = plot {
        // the chart is written at the end: find out now that it can be
        std::fs::File::create(p)
            .and_then(|_| std::fs::remove_file(p))
            .map_err(|e| format!("--plot {}: {e}", p.display()))?;
    }
    Ok(())
}

/// `xensock listen`: one connection, piped.
fn listen(port: &str) -> Res<()> {
    let addr = if port.starts_with("xen:") {
        port.to_string()
    } else {
        format!("xen:self:{port}")
    };
    let l =
        libxensock::XenListener::bind(addr.as_str()).map_err(|e| format!("listen {addr}: {e}"))?;
    eprintln!("xensock: listening on {}", l.local_addr()?);
    let (s, peer) = l.accept()?;
    eprintln!("xensock: connection from {peer}");
    drop(l);
    pipe(s)
}

/// Copies stdin to `s` (then half-closes it) and `s` to stdout. Ends at
/// the peer's end of stream once stdin is sent too, unless stdin is a
/// terminal (a person typing), which is not waited for.
fn pipe(s: XenStream) -> Res<()> {
    use std::io::IsTerminal;
    let mut w = s.try_clone()?;
    let sender = thread::spawn(move || {
        let _ = io::copy(&mut io::stdin().lock(), &mut w);
        let _ = w.shutdown(Shutdown::Write);
    });
    let mut r = s;
    let mut out = io::stdout().lock();
    io::copy(&mut r, &mut out)?;
    out.flush()?;
    if !io::stdin().is_terminal() {
        let _ = sender.join();
    }
    Ok(())
}

/// `xensock daemon`: the process-wide transport, served to the guest.
fn daemon(socket: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    let path = socket.unwrap_or_else(libxensock::daemon::socket_path);
    let t = libxensock::Transport::global()?;
    eprintln!(
        "xensock daemon: domain {} ({}), serving on {}",
        t.domid(),
        t.backend_kind(),
        path.display()
    );
    libxensock::daemon::serve(&t, &path)?;
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Demo { write_size: 0, .. } => Err("--write-size must be at least 1 byte".into()),
        Cmd::Demo {
            mib,
            write_size,
            ring,
            quiet,
        } => demo(mib, write_size, ring, quiet),
        Cmd::Bench {
            scale,
            plot,
            reps,
            placement,
        } => check_bench_args(scale, plot.as_deref())
            .and_then(|()| bench(scale, plot, reps.max(1), placement)),
        Cmd::Status { json } => status(json),
        Cmd::Suspend => hook("suspend"),
        Cmd::Resume => hook("resume"),
        Cmd::Daemon { socket } => daemon(socket),
        Cmd::Connect { addr } => XenStream::connect(addr.as_str())
            .map_err(|e| format!("connect {addr}: {e}").into())
            .and_then(pipe),
        Cmd::Listen { port } => listen(&port),
        Cmd::Run { command } => run(command),
    };
    if let Err(e) = r {
        eprintln!("xensock: {e}");
        std::process::exit(1);
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[path = "../../shared/stream_check.rs"]
mod stream_check;
use stream_check::{pattern, read_stream, write_stream};

/// Streams `total` bytes through an echo peer: one thread writes, this one
/// reads back. Returns (sent checksum, received checksum, bytes received, elapsed).
fn echo_run<S>(
    s: S,
    total: u64,
    write_size: usize,
    pb: Option<&ProgressBar>,
) -> Res<(u64, u64, u64, Duration)>
where
    S: Read + Write + Send + 'static + TryCloneShut,
{
    // Writes start at varying offsets of a random block, so that lost,
    // duplicated or reordered data changes the checksum.
    let block = pattern(write_size + 8192);
    let mut w = s.try_clone_box()?;
    let start = Instant::now();
    let writer = thread::spawn(move || -> io::Result<u64> {
        let sum = write_stream(&mut w, &block, total, write_size)?;
        w.shutdown_write()?;
        Ok(sum)
    });
    let mut r = s;
    let (recv, got) = read_stream(&mut r, |got| {
        if let Some(pb) = pb {
            pb.set_position(got);
        }
    })?;
    let elapsed = start.elapsed();
    let sent = writer.join().map_err(|_| "writer panicked")??;
    Ok((sent, recv, got, elapsed))
}

/// A stream whose write side can be cloned off and shut down.
trait TryCloneShut: Read + Write + Send {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>>;
    fn shutdown_write(&self) -> io::Result<()>;
}

impl TryCloneShut for XenStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl TryCloneShut for TcpStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl TryCloneShut for UnixStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl TryCloneShut for Box<dyn TryCloneShut> {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        (**self).try_clone_box()
    }
    fn shutdown_write(&self) -> io::Result<()> {
        (**self).shutdown_write()
    }
}

/// Echoes everything back until EOF, then shuts down its write side.
fn echo_serve(mut s: Box<dyn TryCloneShut>) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            s.shutdown_write()?;
            return Ok(total);
        }
        s.write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn bar(total: u64, quiet: bool, what: &str) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{bar:40.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    Some(pb)
}

fn demo(mib: u64, write_size: usize, ring: usize, quiet: bool) -> Res<()> {
    let total = mib << 20;
    println!(
        "xensock demo: two domains of a simulated Xen host, in this process; \
         every figure below is the simulation's (real Xen: lab/run bench, docs/lab.md)."
    );
    let report = libxensock::backend();
    println!(
        "(This machine's own backend, which programs here would use: {})",
        report.kind
    );
    for r in &report.reasons {
        println!("  {r}");
    }
    println!("Starting the simulated host:");
    let host = SimHost::start()?;
    let ds = host.create_domain(DomainConfig::new("echo-server"))?;
    let dc = host.create_domain(DomainConfig::new("client"))?;
    println!(
        "  domain {} \"{}\" runs an echo server; domain {} \"{}\" the client (sim in {})",
        ds.domid,
        ds.name,
        dc.domid,
        dc.name,
        host.dir().display()
    );
    let ts = Transport::sim(host.dir(), ds.domid)?;
    let tc = Transport::sim(host.dir(), dc.domid)?;
    let opts = SocketOptions {
        recv_buffer: Some(ring),
        ..Default::default()
    };
    let l = ts.bind_with("xen:self:7", opts)?;
    let server = thread::spawn(move || -> io::Result<u64> {
        let (s, peer) = l.accept()?;
        let _ = peer;
        echo_serve(Box::new(s))
    });
    let t0 = Instant::now();
    let c = tc.connect_with(SockAddrXen::new(ds.domid.into(), 7), None, opts)?;
    let setup = t0.elapsed();
    let node = xensock_proto::link::HalfPath {
        owner: dc.domid.into(),
        peer: ds.domid.into(),
    }
    .to_string();
    let read = |p: &str| {
        host.xenstore_read(p)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_else(|_| "?".into())
    };
    println!(
        "  link {} <-> {} set up through XenStore in {:.1?}: {node}/{{ring-ref={}, event-channel={}, state={}}}",
        dc.domid,
        ds.domid,
        setup,
        read(&format!("{node}/{}", link_node::RING_REF)),
        read(&format!("{node}/{}", link_node::EVENT_CHANNEL)),
        read(&format!("{node}/{}", link_node::STATE)),
    );
    println!(
        "  connected {} -> {}; rings: {} KiB each way; host now has {} grants, {} mappings, {} event-channel ports",
        c.local_addr()?,
        c.peer_addr()?,
        c.recv_buffer_size() / 1024,
        host.stats().grants,
        host.stats().mappings,
        host.stats().ports
    );
    println!("Streaming {mib} MiB through the echo server in {write_size}-byte writes:");
    let pb = bar(total, quiet, "xensock");
    let (sent, recv, got, xen_t) = echo_run(c, total, write_size, pb.as_ref())?;
    if let Some(pb) = pb {
        pb.finish();
    }
    let echoed = server.join().map_err(|_| "server panicked")??;
    if got != total || sent != recv {
        return Err(
            format!("checksum mismatch: sent {total} bytes, echoed {echoed}, got {got}").into(),
        );
    }
    println!(
        "  xensock (simulated host): {got} bytes echoed, checksum {recv:016x} matches, {:.0} MB/s each way",
        mbps(got, xen_t)
    );

    // The same over TCP loopback.
    let tl = TcpListener::bind("127.0.0.1:0")?;
    let addr = tl.local_addr()?;
    let tserver = thread::spawn(move || -> io::Result<u64> {
        let (s, _) = tl.accept()?;
        echo_serve(Box::new(s))
    });
    let tc2 = TcpStream::connect(addr)?;
    let pb = bar(total, quiet, "TCP loopback");
    let (tsent, trecv, tgot, tcp_t) = echo_run(tc2, total, write_size, pb.as_ref())?;
    if let Some(pb) = pb {
        pb.finish();
    }
    tserver.join().map_err(|_| "server panicked")??;
    if tgot != total || tsent != trecv {
        return Err("TCP checksum mismatch".into());
    }
    println!(
        "  TCP loopback:             {tgot} bytes echoed, checksum {trecv:016x} matches, {:.0} MB/s each way",
        mbps(tgot, tcp_t)
    );
    println!(
        "  xensock / TCP loopback throughput: {:.2}x (simulated host: grants and event channels are emulated by a process here)",
        tcp_t.as_secs_f64() / xen_t.as_secs_f64()
    );
    drop((tc, ts));
    let released = (0..200).any(|_| {
        thread::sleep(Duration::from_millis(10));
        host.stats().grants_and_channels_released()
    });
    println!(
        "Closed: every grant, mapping and event channel released: {}",
        if released { "yes" } else { "NO" }
    );
    if !released {
        return Err(format!("leaked: {:?}", host.stats()).into());
    }
    Ok(())
}

// ---- bench --------------------------------------------------------------

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Xen,
    Unix,
    Tcp,
}

const KINDS: [Kind; 3] = [Kind::Xen, Kind::Unix, Kind::Tcp];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Xen => "xensock",
            Kind::Unix => "AF_UNIX",
            Kind::Tcp => "TCP lo",
        }
    }
}

struct Env {
    host: SimHost,
    a: Transport,
    b: Transport,
    bid: u32,
    port: u32,
}

type Pair = (Box<dyn TryCloneShut>, Box<dyn TryCloneShut>);

fn make_pair(env: &mut Env, kind: Kind, ring: Option<usize>) -> Res<Pair> {
    Ok(match kind {
        Kind::Xen => {
            env.port += 1;
            let opts = SocketOptions {
                recv_buffer: ring,
                backlog: Some(4),
            };
            let l = env.b.bind_with((env.bid, env.port), opts)?;
            let c = env.a.connect_with((env.bid, env.port), None, opts)?;
            let (s, _) = l.accept()?;
            (Box::new(c), Box::new(s))
        }
        Kind::Unix => {
            let (a, b) = UnixStream::pair()?;
            (Box::new(a), Box::new(b))
        }
        Kind::Tcp => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let c = TcpStream::connect(l.local_addr()?)?;
            c.set_nodelay(true)?;
            let (s, _) = l.accept()?;
            s.set_nodelay(true)?;
            (Box::new(c), Box::new(s))
        }
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
enum Placement {
    /// Writer on CPU 0, reader on CPU 1.
    Spread,
    /// Both on CPU 0.
    Same,
    /// Wherever the scheduler puts them.
    Any,
}

impl Placement {
    /// CPUs for (writer, reader), if pinned.
    fn cpus(self) -> Option<(usize, usize)> {
        match self {
            Placement::Spread => Some((0, 1)),
            Placement::Same => Some((0, 0)),
            Placement::Any => None,
        }
    }
}

/// Restricts the calling thread to `cpu`, or lets it run anywhere again.
fn pin_to(cpu: Option<usize>) {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::{sysconf, Pid, SysconfVar};
    // Not available_parallelism(): that follows our own affinity mask.
    let online = sysconf(SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
        .max(1);
    let mut set = CpuSet::new();
    for c in 0..online.min(CpuSet::count()) {
        if cpu.map_or(true, |p| p % online == c) {
            let _ = set.set(c);
        }
    }
    // 0 is the calling thread. A failure leaves the thread where it was,
    // which only costs accuracy.
    let _ = sched_setaffinity(Pid::from_raw(0), &set);
}

fn throughput(env: &mut Env, kind: Kind, write: usize, total: u64, place: Placement) -> Res<f64> {
    let (mut c, mut s) = make_pair(env, kind, Some(1 << 20))?;
    let block = pattern(write);
    let cpus = place.cpus();
    pin_to(cpus.map(|c| c.1));
    let start = Instant::now();
    let w = thread::spawn(move || -> io::Result<()> {
        pin_to(cpus.map(|c| c.0));
        let mut sent = 0;
        while sent < total {
            c.write_all(&block)?;
            sent += block.len() as u64;
        }
        c.shutdown_write()
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let t = start.elapsed();
    pin_to(None);
    w.join().map_err(|_| "writer panicked")??;
    Ok(mbps(got, t))
}

fn pingpong(env: &mut Env, kind: Kind, rounds: u32) -> Res<f64> {
    let (mut c, mut s) = make_pair(env, kind, None)?;
    let echo = thread::spawn(move || -> io::Result<()> {
        let mut b = [0u8; 1];
        loop {
            if s.read(&mut b)? == 0 {
                return Ok(());
            }
            s.write_all(&b)?;
        }
    });
    let mut b = [7u8; 1];
    for _ in 0..rounds / 10 {
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
    }
    let start = Instant::now();
    for _ in 0..rounds {
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
    }
    let t = start.elapsed();
    c.shutdown_write()?;
    echo.join().map_err(|_| "echo panicked")??;
    Ok(t.as_secs_f64() * 1e6 / f64::from(rounds) / 2.0)
}

fn connect_rate(env: &mut Env, kind: Kind, n: u32) -> Res<f64> {
    let start;
    match kind {
        Kind::Xen => {
            env.port += 1;
            let l = env.b.bind((env.bid, env.port))?;
            let addr = (env.bid, env.port);
            start = Instant::now();
            for _ in 0..n {
                let c = env.a.connect(addr)?;
                let (s, _) = l.accept()?;
                drop((c, s));
            }
        }
        Kind::Unix => {
            let dir = std::env::temp_dir().join(format!("xensock-bench-{}", std::process::id()));
            let _ = std::fs::remove_file(&dir);
            let l = std::os::unix::net::UnixListener::bind(&dir)?;
            start = Instant::now();
            for _ in 0..n {
                let c = UnixStream::connect(&dir)?;
                let (s, _) = l.accept()?;
                drop((c, s));
            }
            let _ = std::fs::remove_file(&dir);
        }
        Kind::Tcp => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let addr = l.local_addr()?;
            start = Instant::now();
            for _ in 0..n {
                let c = TcpStream::connect(addr)?;
                let (s, _) = l.accept()?;
                drop((c, s));
            }
        }
    }
    Ok(f64::from(n) / start.elapsed().as_secs_f64())
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Resident memory per idle connection (both ends, user space only: the
/// sim's shared pages are counted when touched, kernel socket buffers of
/// AF_UNIX/TCP are not in RSS).
///
/// Returns (RSS per connection, the part of it that is the peer's ring
/// pages mapped a second time: both domains live in this one process, so
/// each shared page is resident twice here, once in a real deployment).
fn idle_memory(env: &mut Env, kind: Kind, n: usize) -> Res<(f64, f64)> {
    let maps_before = env.host.stats().mappings;
    let before = rss_bytes();
    let mut keep = Vec::with_capacity(n);
    for _ in 0..n {
        keep.push(make_pair(env, kind, Some(2048))?);
    }
    let after = rss_bytes();
    let mapped_twice = env.host.stats().mappings.saturating_sub(maps_before) * 4096;
    drop(keep);
    let per = |b: u64| b as f64 / n as f64;
    let twice = if kind == Kind::Xen {
        per(mapped_twice as u64)
    } else {
        0.0
    };
    Ok((per(after.saturating_sub(before)), twice))
}

/// Median and spread of repeated measurements.
#[derive(Clone, Copy, Default)]
struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Stat {
        v.sort_by(|a, b| a.total_cmp(b));
        match (v.first(), v.get(v.len() / 2), v.last()) {
            (Some(&min), Some(&median), Some(&max)) => Stat { median, min, max },
            _ => Stat::default(),
        }
    }
}

fn bench(scale: f64, plot: Option<PathBuf>, reps: usize, placement: Placement) -> Res<()> {
    let host = SimHost::start()?;
    let da = host.create_domain(DomainConfig::new("bench-a"))?;
    let db = host.create_domain(DomainConfig::new("bench-b"))?;
    let mut env = Env {
        a: Transport::sim(host.dir(), da.domid)?,
        b: Transport::sim(host.dir(), db.domid)?,
        bid: db.domid.into(),
        port: 1000,
        host,
    };
    println!("{}", libxensock::backend());
    println!("xensock on the simulated host vs AF_UNIX vs TCP loopback (same run, same machine)");
    println!(
        "every figure is the median of {reps} runs, interleaved by kind; xensock's min..max in brackets\n"
    );
    let sizes = [64usize, 1024, 16 * 1024, 64 * 1024, 1 << 20];
    let placed = match placement {
        Placement::Spread => "spread: writer on CPU 0, reader on CPU 1",
        Placement::Same => "same: writer and reader on CPU 0",
        Placement::Any => "any: wherever the scheduler puts them",
    };
    println!("stream throughput, MB/s (one writer, one reader, 1 MiB rings; placement {placed})");
    println!(
        "{:>10} {:>10} {:>13} {:>10} {:>10} {:>9} {:>9}",
        "write", "xensock", "(min..max)", "AF_UNIX", "TCP lo", "x/unix", "x/tcp"
    );
    let mut rows = Vec::new();
    for &w in &sizes {
        let total = ((if w < 1024 { 16u64 << 20 } else { 256u64 << 20 }) as f64 * scale) as u64;
        let total = total.max(w as u64);
        let r = interleaved(reps, |k| throughput(&mut env, k, w, total, placement))?;
        println!(
            "{:>10} {:>10.0} {:>13} {:>10.0} {:>10.0} {:>8.2}x {:>8.2}x",
            human(w),
            r[0].median,
            format!("({:.0}..{:.0})", r[0].min, r[0].max),
            r[1].median,
            r[2].median,
            r[0].median / r[1].median,
            r[0].median / r[2].median
        );
        rows.push((w, r));
    }
    let rounds = ((20_000f64 * scale) as u32).max(100);
    let lat = interleaved(reps, |k| pingpong(&mut env, k, rounds))?;
    println!("\n1-byte ping-pong, one-way latency (us)");
    println!("{:>10} {:>10} {:>10}", "xensock", "AF_UNIX", "TCP lo");
    println!(
        "{:>10.2} {:>10.2} {:>10.2}   xensock/TCP {:.2}x  xensock/unix {:.2}x  (xensock {:.2}..{:.2})",
        lat[0].median,
        lat[1].median,
        lat[2].median,
        lat[0].median / lat[2].median,
        lat[0].median / lat[1].median,
        lat[0].min,
        lat[0].max
    );
    let n = ((2000f64 * scale) as u32).max(10);
    let rate = interleaved(reps, |k| connect_rate(&mut env, k, n))?;
    println!("\nconnect+accept+close per second ({n} in a row, one thread)");
    println!(
        "{:>10.0} {:>10.0} {:>10.0}   xensock/TCP {:.2}x  (xensock {:.0}..{:.0})",
        rate[0].median,
        rate[1].median,
        rate[2].median,
        rate[0].median / rate[2].median,
        rate[0].min,
        rate[0].max
    );
    let idle = ((1000f64 * scale) as usize).max(10);
    let mut mem = [(0f64, 0f64); 3];
    for (i, k) in KINDS.iter().enumerate() {
        mem[i] = idle_memory(&mut env, *k, idle)?;
    }
    println!("\nresident memory per idle connection, both ends, {idle} connections (bytes; xensock with 2 KiB rings; kernel socket memory is not in RSS)");
    println!("{:>10.0} {:>10.0} {:>10.0}", mem[0].0, mem[1].0, mem[2].0);
    println!(
        "  xensock: {:.0} of it is each ring page resident a second time as the peer's mapping (both domains are this one process); one copy each: {:.0}",
        mem[0].1,
        mem[0].0 - mem[0].1
    );
    println!("\ncolumns: {}", KINDS.map(|k| k.name()).join(", "));
    if let Some(p) = plot {
        let what = format!(
            "simulated host, one writer and one reader ({placed}), 1 MiB rings; \
             points: median of {reps} runs, bars: min..max"
        );
        write_plot(&p, &rows, &what)?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// Runs `f` for every kind, `reps` times, interleaving the kinds so that a
/// slow period of the machine hits all three alike.
fn interleaved(reps: usize, mut f: impl FnMut(Kind) -> Res<f64>) -> Res<[Stat; 3]> {
    let mut v: [Vec<f64>; 3] = Default::default();
    for _ in 0..reps {
        for (i, k) in KINDS.iter().enumerate() {
            v[i].push(f(*k)?);
        }
    }
    Ok(v.map(Stat::of))
}

fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else if n >= 1024 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// A PNG chart of the throughput table (plotters): MB/s per write size,
/// log scale, one line per kind (blue xensock, green AF_UNIX, red TCP)
/// through the medians, with each point's min..max as a bar; `what` (how
/// it was measured) under the title. Labels need a TrueType font (the
/// usual DejaVu/Liberation paths are tried); without one the chart has no
/// text.
fn write_plot(path: &std::path::Path, rows: &[(usize, [Stat; 3])], what: &str) -> Res<()> {
    use plotters::prelude::*;
    let text = match register_font() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("xensock: chart without labels: {e}");
            false
        }
    };
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let all = || {
        rows.iter()
            .flat_map(|(_, r)| r.iter().flat_map(|s| [s.min, s.max]))
    };
    let ymax = all().fold(1.0f64, f64::max) * 1.5;
    let ymin = (all().fold(f64::INFINITY, f64::min) / 1.5).clamp(0.1, ymax / 2.0);
    let root = if text {
        let (top, rest) = root.split_vertically(60);
        top.draw(&Text::new(
            "stream throughput: xensock (simulated host) vs AF_UNIX vs TCP loopback",
            (20, 8),
            ("sans-serif", 22),
        ))?;
        top.draw(&Text::new(what.to_string(), (20, 38), ("sans-serif", 13)))?;
        rest
    } else {
        root
    };
    let mut builder = ChartBuilder::on(&root);
    let mut chart = builder
        .margin(15)
        .x_label_area_size(if text { 45 } else { 0 })
        .y_label_area_size(if text { 80 } else { 0 })
        .build_cartesian_2d(
            (0..rows.len().saturating_sub(1)).into_segmented(),
            (ymin..ymax).log_scale(),
        )?;
    let label = |x: &SegmentValue<usize>| match x {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            rows.get(*i).map(|(w, _)| human(*w)).unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_labels(rows.len())
            .x_label_formatter(&label)
            .x_desc("write size")
            .y_desc("MB/s (log scale)");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw()?;
    for (k, colour) in [(0usize, BLUE), (1, GREEN), (2, RED)] {
        let points = || {
            rows.iter()
                .enumerate()
                .map(move |(i, (_, r))| (SegmentValue::CenterOf(i), r[k].median))
        };
        chart.draw_series(rows.iter().enumerate().map(|(i, (_, r))| {
            ErrorBar::new_vertical(
                SegmentValue::CenterOf(i),
                r[k].min,
                r[k].median,
                r[k].max,
                colour.stroke_width(1),
                8,
            )
        }))?;
        chart
            .draw_series(LineSeries::new(points(), colour.stroke_width(2)))?
            .label(KINDS[k].name())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart.draw_series(points().map(|p| Circle::new(p, 4, colour.filled())))?;
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Registers a system TrueType font as plotters' "sans-serif" (its
/// `ab_glyph` backend has no font lookup of its own).
fn register_font() -> Res<()> {
    const CANDIDATES: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    let bytes = CANDIDATES
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no TrueType font for the chart's labels (apt-get install fonts-dejavu-core)")?;
    // plotters keeps the font for the rest of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
        .map_err(|_| "the font file is not a usable TrueType font")?;
    Ok(())
}

// ---- status -------------------------------------------------------------

/// One connection of the kernel module, as `/proc/net/af_xen` lists it.
#[derive(Debug, PartialEq, Eq)]
struct KernelConn<'a> {
    state: &'a str,
    local: &'a str,
    peer: &'a str,
    carrier: &'a str,
    to_tcp: u64,
    to_ring: u64,
    /// A TCP program's connection (the preload library): the AF_INET or
    /// AF_INET6 peer it asked for; its dual listener: the address it
    /// listens on.
    inet: Option<&'a str>,
}

/// Parses `/proc/net/af_xen` (header, then one line per socket; the
/// carrier and switch columns are named in the header, so an older module
/// without them still parses, with `-` and 0).
fn parse_proc_af_xen(text: &str) -> Vec<KernelConn<'_>> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cols: Vec<&str> = header.split_whitespace().collect();
    let at = |name: &str| cols.iter().position(|c| *c == name);
    let (carrier, to_tcp, to_ring, inet) = (at("carrier"), at("to_tcp"), at("to_ring"), at("inet"));
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 3 {
                return None;
            }
            let num = |i: Option<usize>| {
                i.and_then(|i| f.get(i))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            Some(KernelConn {
                state: f[0],
                local: f[1],
                peer: f[2],
                carrier: carrier.and_then(|i| f.get(i)).copied().unwrap_or("-"),
                to_tcp: num(to_tcp),
                to_ring: num(to_ring),
                inet: inet.and_then(|i| f.get(i)).copied().filter(|v| *v != "-"),
            })
        })
        .collect()
}

/// The kernel module's view, when it is loaded.
/// What `/proc/net/af_xen` and `/proc/net/af_xen_stats` say, if the
/// module is loaded: its connections and its switch counters.
struct KernelStatus {
    proc_text: String,
    switch: Vec<(String, i64)>,
}

fn kernel_status() -> Option<KernelStatus> {
    let proc_text = std::fs::read_to_string("/proc/net/af_xen").ok()?;
    let switch = std::fs::read_to_string("/proc/net/af_xen_stats")
        .map(|stats| {
            stats
                .lines()
                .filter(|l| l.starts_with("switch_"))
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_string(), v.trim().parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(KernelStatus { proc_text, switch })
}

fn print_kernel_status(k: &KernelStatus) {
    let conns = parse_proc_af_xen(&k.proc_text);
    println!("kernel module (af_xen): {} sockets", conns.len());
    for c in conns.iter() {
        match (c.state, c.inet) {
            ("ESTABLISHED", inet) => println!(
                "  {} -> {}{}: carrier {}, switched to TCP {} times, back to a ring {} times",
                c.local,
                c.peer,
                inet.map(|a| format!(" (a TCP program's connection to {a})"))
                    .unwrap_or_default(),
                c.carrier,
                c.to_tcp,
                c.to_ring
            ),
            ("LISTEN", Some(a)) => println!(
                "  {}: a TCP program's listener on {a}, taking co-resident clients over AF_XEN",
                c.local
            ),
            _ => {}
        }
    }
    if !k.switch.is_empty() {
        let line: Vec<String> = k.switch.iter().map(|(n, v)| format!("{n} {v}")).collect();
        println!("  {}", line.join(", "));
    }
}

/// One link of this domain as XenStore shows it (written by whichever
/// process of this domain runs the transport).
struct LinkNode {
    peer: String,
    state: String,
    ring_ref: String,
    event_channel: String,
    generation: String,
}

/// This domain's id and its links' XenStore nodes, if XenStore answers.
fn xenstore_status() -> Option<(String, String, Vec<LinkNode>)> {
    let xs = xensock_discovery::xs::XsClient::open().ok()?;
    let me = xs
        .read_string(xensock_proto::store::DOMID)
        .ok()?
        .trim()
        .to_string();
    let dir = xensock_proto::store::InHome {
        domid: me.parse().ok()?,
        rel: xensock_proto::store::LINK_DIR,
    }
    .to_string();
    let peers = xs.directory(&dir).unwrap_or_default();
    let links = peers
        .into_iter()
        .map(|p| {
            let get = |n: &str| {
                xs.read_string(&format!("{dir}/{p}/{n}"))
                    .unwrap_or_else(|_| "-".into())
            };
            LinkNode {
                state: get(link_node::STATE),
                ring_ref: get(link_node::RING_REF),
                event_channel: get(link_node::EVENT_CHANNEL),
                generation: get(link_node::GENERATION),
                peer: p,
            }
        })
        .collect();
    Some((me, dir, links))
}

fn hook(cmd: &str) -> Res<()> {
    let answers = libxensock::control::broadcast(cmd);
    if answers.is_empty() {
        println!("no user-space transport runs here");
    }
    for (pid, answer) in answers {
        print!("process {pid}: {answer}");
    }
    Ok(())
}

fn status(json: bool) -> Res<()> {
    let backend = libxensock::backend();
    let kernel = kernel_status();
    // No transport of our own: starting one would take this domain's link
    // nodes from the process that runs the transport.
    let domain = xenstore_status();
    let answers = libxensock::control::broadcast("status");
    if json {
        println!(
            "{}",
            status_json(&backend, kernel.as_ref(), domain.as_ref(), &answers)
        );
        return Ok(());
    }
    print!("{backend}");
    if let Some(k) = &kernel {
        print_kernel_status(k);
    }
    if let Some((me, dir, links)) = &domain {
        println!("domain {me}");
        if links.is_empty() {
            println!("no links in XenStore");
        } else {
            println!("links in XenStore ({dir}):");
            for l in links {
                println!(
                    "  peer {}: state={} ring-ref={} event-channel={} generation={}",
                    l.peer, l.state, l.ring_ref, l.event_channel, l.generation
                );
            }
        }
    }
    if answers.is_empty() {
        println!("no user-space transport runs here");
    }
    for (pid, answer) in answers {
        print!("process {pid}: {answer}");
    }
    Ok(())
}

/// `xensock status --json`: the same facts as the text, as one object.
fn status_json(
    backend: &libxensock::BackendReport,
    kernel: Option<&KernelStatus>,
    domain: Option<&(String, String, Vec<LinkNode>)>,
    answers: &[(u32, String)],
) -> serde_json::Value {
    use serde_json::json;
    let kernel = kernel.map(|k| {
        let conns: Vec<_> = parse_proc_af_xen(&k.proc_text)
            .iter()
            .map(|c| {
                json!({
                    "state": c.state, "local": c.local, "peer": c.peer,
                    "carrier": c.carrier, "to_tcp": c.to_tcp, "to_ring": c.to_ring,
                    "inet": c.inet,
                })
            })
            .collect();
        let switch: serde_json::Map<_, _> = k
            .switch
            .iter()
            .map(|(n, v)| (n.clone(), json!(v)))
            .collect();
        json!({ "sockets": conns, "switch": switch })
    });
    let (domid, links) = match domain {
        Some((me, _, links)) => (
            me.parse::<u32>().ok(),
            links
                .iter()
                .map(|l| {
                    json!({
                        "peer": l.peer, "state": l.state, "ring_ref": l.ring_ref,
                        "event_channel": l.event_channel, "generation": l.generation,
                    })
                })
                .collect(),
        ),
        None => (None, Vec::new()),
    };
    json!({
        "backend": {
            "kind": backend.kind.to_string(),
            "family": backend.family,
            "user_space": backend.user_space.to_string(),
            "reasons": backend.reasons,
        },
        "kernel": kernel,
        "domid": domid,
        "links": links,
        "processes": answers
            .iter()
            .map(|(pid, text)| json!({ "pid": pid, "status": text.trim_end() }))
            .collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod proc_tests {
    use super::*;

    #[test]
    fn proc_af_xen_columns_are_found_by_name() {
        let text = "state       local            peer             rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier    to_tcp to_ring\n\
                    ESTABLISHED     2:7301           1:49155       131072       0  131072       0      100       200 tcp             2       1\n\
                    LISTEN          2:7301           -:-                0       0       0       0        0         0 -               0       0\n";
        let c = parse_proc_af_xen(text);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            KernelConn {
                state: "ESTABLISHED",
                local: "2:7301",
                peer: "1:49155",
                carrier: "tcp",
                to_tcp: 2,
                to_ring: 1,
                inet: None
            }
        );
        assert_eq!(c[1].state, "LISTEN");
        assert_eq!(c[1].to_tcp, 0);
    }

    #[test]
    fn proc_af_xen_inet_column_names_a_tcp_programs_connection() {
        let text = "state       local            peer             rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier    to_tcp to_ring inet\n\
                    ESTABLISHED     2:49160          1:6379        131072       0  131072       0      100       200 ring-xen        0       0 10.0.0.11:6379\n\
                    ESTABLISHED     2:7301           1:49155       131072       0  131072       0      100       200 tcp             2       1 -\n\
                    LISTEN          2:6379           -:-                0       0       0       0        0         0 -               0       0 0.0.0.0:6379\n";
        let c = parse_proc_af_xen(text);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].inet, Some("10.0.0.11:6379"));
        assert_eq!(c[1].inet, None, "an AF_XEN program's connection");
        assert_eq!((c[2].state, c[2].inet), ("LISTEN", Some("0.0.0.0:6379")));
    }

    #[test]
    fn proc_af_xen_without_switch_columns_still_parses() {
        let text = "state local peer rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier\nESTABLISHED 2:1 1:2 1 0 1 0 0 0 ring-xen\n";
        let c = parse_proc_af_xen(text);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].carrier, "ring-xen");
        assert_eq!((c[0].to_tcp, c[0].to_ring), (0, 0));
    }
}
