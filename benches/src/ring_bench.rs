// SPDX-License-Identifier: MIT OR Apache-2.0
//! Ring benchmark: two processes stream through a xensock-proto ring in
//! shared memory (memfd + mmap, eventfd notifications), against an AF_UNIX
//! socketpair and TCP loopback measured in the same run, plus a 1-byte
//! ping-pong with and without busy-polling. Prints throughput and latency
//! with ratios to AF_UNIX and to a single-thread memcpy of the same sizes.
//!
//! `cargo run --release -p xensock-benches --bin ring-bench`

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use clap::Parser;
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::mman::{mmap, MapFlags, ProtFlags};
use nix::sys::wait::waitpid;
use nix::unistd::{fork, ForkResult};
use xensock_proto::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
use xensock_proto::mem::RawRing;
use xensock_proto::ring::{Consumer, Producer, RingError};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "xensock ring vs AF_UNIX vs TCP loopback vs memcpy, in one run"
)]
struct Args {
    /// Fewer bytes and round trips (about 8x faster, noisier).
    #[arg(long)]
    quick: bool,
    /// log2 of the ring's data size (SO_RCVBUF equivalent).
    #[arg(long, default_value_t = 18)]
    ring_order: u32,
    /// Repetitions per cell; the median is reported.
    #[arg(long, default_value_t = 3)]
    reps: usize,
}

#[derive(Debug, thiserror::Error)]
enum BenchError {
    #[error("ring: {0}")]
    Ring(String),
    #[error("system call: {0}")]
    Sys(#[from] nix::Error),
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("peer process failed")]
    Child,
}

impl From<RingError> for BenchError {
    fn from(e: RingError) -> Self {
        BenchError::Ring(e.to_string())
    }
}

type Result<T> = std::result::Result<T, BenchError>;

/// One end of a bidirectional byte transport.
trait End {
    /// Writes all of `buf`.
    fn send(&mut self, buf: &[u8]) -> Result<()>;
    /// Reads at least one byte (blocking).
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize>;
}

impl End for UnixStream {
    fn send(&mut self, buf: &[u8]) -> Result<()> {
        Ok(self.write_all(buf)?)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        Ok(self.read(buf)?)
    }
}

impl End for TcpStream {
    fn send(&mut self, buf: &[u8]) -> Result<()> {
        Ok(self.write_all(buf)?)
    }
    fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        Ok(self.read(buf)?)
    }
}

/// Shared memory holding two rings, one per direction.
struct SharedRings {
    rings: [RawRing; 2],
}

impl SharedRings {
    fn new(order: u32) -> Result<Self> {
        let geometry = RingGeometry::new(order).map_err(|e| BenchError::Ring(e.to_string()))?;
        let one = geometry.region_size();
        let fd: OwnedFd = nix::sys::memfd::memfd_create(
            c"xensock-bench",
            nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC,
        )?;
        nix::unistd::ftruncate(&fd, (2 * one) as i64)?;
        let len = std::num::NonZeroUsize::new(2 * one).ok_or(BenchError::Child)?;
        // SAFETY: a fresh shared mapping of the memfd; it stays mapped for
        // the life of the process (never unmapped), in both parent and child.
        let base = unsafe {
            mmap(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_SHARED,
                fd.as_fd(),
                0,
            )?
        };
        let base: NonNull<u8> = base.cast();
        let mut rings = Vec::new();
        for k in 0..2 {
            // SAFETY: region k lies inside the mapping, page aligned, and the
            // mapping is never unmapped.
            let ring = unsafe {
                RawRing::from_region(
                    NonNull::new_unchecked(base.as_ptr().add(k * one)),
                    one,
                    geometry,
                )
            }
            .map_err(|e| BenchError::Ring(e.to_string()))?;
            ring.header().init(&RingIdentity {
                magic: DATA_RING_MAGIC,
                order,
                owner_domid: k as u32,
                peer_domid: 1 - k as u32,
                conn_id: 1,
                epoch: 0,
            });
            rings.push(ring);
        }
        Ok(SharedRings {
            rings: [rings[0], rings[1]],
        })
    }
}

/// Event channels stand-in: one eventfd per (ring, reason).
struct Kicks {
    data: [EventFd; 2],
    space: [EventFd; 2],
}

impl Kicks {
    fn new() -> Result<Self> {
        let mk = || EventFd::from_value_and_flags(0, EfdFlags::EFD_CLOEXEC);
        Ok(Kicks {
            data: [mk()?, mk()?],
            space: [mk()?, mk()?],
        })
    }
}

struct RingEnd<'k> {
    tx: Producer<RawRing>,
    rx: Consumer<RawRing>,
    /// Kick the peer: data in my tx ring.
    peer_data: &'k EventFd,
    /// Wait: data in my rx ring.
    my_data: &'k EventFd,
    /// Kick the peer: space in my rx ring.
    peer_space: &'k EventFd,
    /// Wait: space in my tx ring.
    my_space: &'k EventFd,
    poll: Poll,
}

/// How an end waits when it cannot make progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Poll {
    /// Spin, never sleep.
    Busy,
    /// Spin briefly, then sleep on the eventfd.
    SpinThenSleep,
    /// Sleep on the eventfd at once.
    Sleep,
}

impl<'k> RingEnd<'k> {
    fn new(rings: &SharedRings, kicks: &'k Kicks, side: usize, poll: Poll) -> Self {
        let (out, inn) = (side, 1 - side);
        RingEnd {
            tx: Producer::new(rings.rings[out]),
            rx: Consumer::new(rings.rings[inn]),
            peer_data: &kicks.data[out],
            my_data: &kicks.data[inn],
            peer_space: &kicks.space[inn],
            my_space: &kicks.space[out],
            poll,
        }
    }
}

/// Polls `ready` for a short while before the caller sleeps: a wakeup
/// through the kernel costs microseconds, and the peer is usually about to
/// make progress (the "busy-poll before sleeping" of the design).
fn spin(mut ready: impl FnMut() -> std::result::Result<bool, RingError>) -> Result<bool> {
    // Long enough to cover a peer that was briefly preempted: on a VM a
    // halted vCPU can take 50-100 us to wake, far more than a spin costs.
    const BUDGET: Duration = Duration::from_micros(200);
    let start = Instant::now();
    loop {
        for _ in 0..64 {
            if ready()? {
                return Ok(true);
            }
            std::hint::spin_loop();
        }
        if start.elapsed() > BUDGET {
            return Ok(false);
        }
    }
}

fn kick(fd: &EventFd) -> Result<()> {
    fd.write(1)?;
    Ok(())
}

fn wait(fd: &EventFd) -> Result<()> {
    fd.read()?;
    Ok(())
}

impl End for RingEnd<'_> {
    fn send(&mut self, buf: &[u8]) -> Result<()> {
        let mut off = 0;
        while off < buf.len() {
            let n = self.tx.write(&buf[off..])?;
            off += n;
            if self.tx.flush() {
                kick(self.peer_data)?;
            }
            if n == 0 {
                if self.poll == Poll::Busy
                    || (self.poll == Poll::SpinThenSleep
                        && spin(|| self.tx.free_space().map(|f| f > 0))?)
                {
                    continue;
                }
                let want = ((buf.len() - off) as u32).min(self.tx.capacity() / 2);
                if self.tx.prepare_wait(want)? {
                    wait(self.my_space)?;
                }
            }
        }
        Ok(())
    }

    fn recv(&mut self, buf: &mut [u8]) -> Result<usize> {
        loop {
            let n = self.rx.read(buf)?;
            if n > 0 {
                if self.rx.flush() {
                    kick(self.peer_space)?;
                }
                return Ok(n);
            }
            if self.poll == Poll::Busy
                || (self.poll == Poll::SpinThenSleep && spin(|| self.rx.readable().map(|r| r > 0))?)
            {
                continue;
            }
            if self.rx.prepare_wait()? {
                wait(self.my_data)?;
            }
        }
    }
}

/// Pins the calling process to `cpu` (modulo the CPUs available), so the
/// two ends of every transport run on different cores: a spinning end that
/// shares a core with its peer only burns the peer's time slice.
fn pin_to_cpu(cpu: usize) {
    // Online CPUs, not available_parallelism(): that follows this process's
    // affinity, which an earlier pin (inherited across fork) narrowed to one.
    // SAFETY: sysconf has no preconditions.
    let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as usize;
    let mut set = nix::sched::CpuSet::new();
    if set.set(cpu % cpus).is_ok() {
        // Best effort: without pinning the numbers are only noisier.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set);
    }
}

/// Runs `child` in a forked process and `parent` here; returns the
/// parent's result after the child exited successfully.
fn with_child<T>(
    child: impl FnOnce() -> Result<()>,
    parent: impl FnOnce() -> Result<T>,
) -> Result<T> {
    // SAFETY: the benchmark is single-threaded when it forks, so the child
    // inherits no locks held by other threads.
    match unsafe { fork() }? {
        ForkResult::Child => {
            pin_to_cpu(1);
            let code = match child() {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("child: {e}");
                    1
                }
            };
            // SAFETY: _exit skips the parent's atexit handlers and buffers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child: pid } => {
            pin_to_cpu(0);
            let result = parent();
            let status = waitpid(pid, None)?;
            match (result, status) {
                (Ok(v), nix::sys::wait::WaitStatus::Exited(_, 0)) => Ok(v),
                (Err(e), _) => Err(e),
                _ => Err(BenchError::Child),
            }
        }
    }
}

/// Streams `total` bytes in `chunk`-byte writes from parent to child; the
/// child acknowledges the last byte with one byte back. Returns bytes/s.
fn stream<E: End>(mut a: E, mut b: E, chunk: usize, total: u64) -> Result<f64> {
    with_child(
        move || {
            let mut buf = vec![0u8; chunk];
            let mut got = 0u64;
            while got < total {
                got += b.recv(&mut buf)? as u64;
            }
            b.send(&[1])
        },
        move || {
            let buf = vec![0xA5u8; chunk];
            let start = Instant::now();
            let mut sent = 0u64;
            while sent < total {
                a.send(&buf)?;
                sent += chunk as u64;
            }
            let mut ack = [0u8; 1];
            a.recv(&mut ack)?;
            Ok(sent as f64 / start.elapsed().as_secs_f64())
        },
    )
}

/// 1-byte ping-pong; returns the median round-trip time.
fn ping_pong<E: End>(mut a: E, mut b: E, rounds: usize) -> Result<Duration> {
    with_child(
        move || {
            let mut byte = [0u8; 1];
            for _ in 0..rounds {
                b.recv(&mut byte)?;
                b.send(&byte)?;
            }
            Ok(())
        },
        move || {
            let mut byte = [7u8; 1];
            let mut rtts = Vec::with_capacity(rounds);
            for _ in 0..rounds {
                let t = Instant::now();
                a.send(&byte)?;
                a.recv(&mut byte)?;
                rtts.push(t.elapsed());
            }
            rtts.sort();
            Ok(rtts[rtts.len() / 2])
        },
    )
}

fn memcpy_rate(chunk: usize, total: u64) -> f64 {
    // Source and destination as large as the ring, so the copy sees the same
    // cache footprint as a ring transfer of this chunk size.
    let span = chunk.max(1 << 20);
    let src = vec![0x5Au8; span];
    let mut dst = vec![0u8; span];
    let start = Instant::now();
    let mut done = 0u64;
    let mut at = 0usize;
    while done < total {
        if at + chunk > span {
            at = 0;
        }
        dst[at..at + chunk].copy_from_slice(&src[at..at + chunk]);
        std::hint::black_box(&mut dst);
        at += chunk;
        done += chunk as u64;
    }
    done as f64 / start.elapsed().as_secs_f64()
}

fn tcp_pair(nodelay: bool) -> Result<(TcpStream, TcpStream)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let a = TcpStream::connect(listener.local_addr()?)?;
    let (b, _) = listener.accept()?;
    a.set_nodelay(nodelay)?;
    b.set_nodelay(nodelay)?;
    Ok((a, b))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn gib(rate: f64) -> String {
    format!("{:.2}", rate / (1u64 << 30) as f64)
}

fn main() -> Result<()> {
    let args = Args::parse();
    let scale = if args.quick { 8 } else { 1 };
    let reps = args.reps.max(1);
    let cap = 1usize << args.ring_order;
    println!(
        "xensock ring benchmark: ring {} KiB, {} rep(s) per cell (median), {}",
        cap >> 10,
        reps,
        if args.quick { "quick" } else { "full" }
    );
    println!("\nstream throughput, GiB/s (two processes; memcpy: one thread)");
    println!(
        "{:>10} {:>10} {:>10} {:>10} {:>10} {:>12} {:>12}",
        "write", "ring", "AF_UNIX", "TCP lo", "memcpy", "ring/UNIX", "ring/memcpy"
    );
    let sizes: [(usize, &str, u64); 4] = [
        (64, "64 B", 32 << 20),
        (4096, "4 KiB", 256 << 20),
        (65536, "64 KiB", 1 << 30),
        (1 << 20, "1 MiB", 1 << 30),
    ];
    let mut ratio_64k = (0.0, 0.0);
    for (chunk, label, total) in sizes {
        let total = total / scale;
        let mut ring = Vec::new();
        let mut unix = Vec::new();
        let mut tcp = Vec::new();
        let mut copy = Vec::new();
        for _ in 0..reps {
            let rings = SharedRings::new(args.ring_order)?;
            let kicks = Kicks::new()?;
            ring.push(stream(
                RingEnd::new(&rings, &kicks, 0, Poll::SpinThenSleep),
                RingEnd::new(&rings, &kicks, 1, Poll::SpinThenSleep),
                chunk,
                total,
            )?);
            let (a, b) = UnixStream::pair()?;
            unix.push(stream(a, b, chunk, total)?);
            let (a, b) = tcp_pair(false)?;
            tcp.push(stream(a, b, chunk, total)?);
            copy.push(memcpy_rate(chunk, total));
        }
        let (r, u, t, c) = (median(ring), median(unix), median(tcp), median(copy));
        if chunk == 65536 {
            ratio_64k = (r / u, r / c);
        }
        println!(
            "{:>10} {:>10} {:>10} {:>10} {:>10} {:>11.2}x {:>11.2}x",
            label,
            gib(r),
            gib(u),
            gib(t),
            gib(c),
            r / u,
            r / c
        );
    }

    let rounds = 100_000 / scale as usize;
    println!("\n1-byte ping-pong, median round trip ({rounds} rounds)");
    println!("{:>22} {:>10} {:>12}", "transport", "RTT us", "vs AF_UNIX");
    let mut results: Vec<(&str, f64)> = Vec::new();
    for (name, poll) in [
        ("ring, busy-poll", Poll::Busy),
        ("ring, eventfd sleep", Poll::Sleep),
    ] {
        let mut v = Vec::new();
        for _ in 0..reps {
            let rings = SharedRings::new(12)?;
            let kicks = Kicks::new()?;
            v.push(
                ping_pong(
                    RingEnd::new(&rings, &kicks, 0, poll),
                    RingEnd::new(&rings, &kicks, 1, poll),
                    rounds,
                )?
                .as_secs_f64(),
            );
        }
        results.push((name, median(v)));
    }
    let mut v = Vec::new();
    for _ in 0..reps {
        let (a, b) = UnixStream::pair()?;
        v.push(ping_pong(a, b, rounds)?.as_secs_f64());
    }
    let unix_rtt = median(v);
    results.push(("AF_UNIX", unix_rtt));
    let mut v = Vec::new();
    for _ in 0..reps {
        let (a, b) = tcp_pair(true)?;
        v.push(ping_pong(a, b, rounds)?.as_secs_f64());
    }
    results.push(("TCP loopback", median(v)));
    for (name, rtt) in &results {
        println!("{:>22} {:>10.2} {:>11.2}x", name, rtt * 1e6, rtt / unix_rtt);
    }

    let busy_ratio = results[0].1 / unix_rtt;
    println!("\ntargets:");
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "  64 KiB throughput >= 3x AF_UNIX:        {:.2}x  {}",
        ratio_64k.0,
        verdict(ratio_64k.0 >= 3.0)
    );
    println!(
        "  64 KiB throughput >= 0.5x memcpy:       {:.2}x  {}",
        ratio_64k.1,
        verdict(ratio_64k.1 >= 0.5)
    );
    println!(
        "  busy-poll RTT <= 0.3x AF_UNIX:          {:.2}x  {}",
        busy_ratio,
        verdict(busy_ratio <= 0.3)
    );
    Ok(())
}
