// SPDX-License-Identifier: MIT OR Apache-2.0
//! `lab_kernel`: libxensock's behaviour checks across two real Xen
//! domains, run by `tests/lab/kmod-rust` with `af_xen.ko` loaded (so every
//! socket is the kernel family; the program also runs over the user-space
//! transport, where the same checks apply except the loopback ones).
//!
//! ```text
//! lab_kernel server                serve the ports below until a connection to 7199
//! lab_kernel client <server-domid> run every check against that server
//! ```
//!
//! Ports: 7101 echo (one thread per connection), 7102 half-close ("got N"
//! after EOF), 7103 accept-and-close at once, 7104 SOCK_SEQPACKET echo
//! (each message back as it came), 7199 stop (the server reads
//! the stop connection to EOF, then exits). Each check prints one lab marker,
//! `@@RESULT rust-<name> PASS|FAIL <detail>`; the exit status is the
//! number of failures (capped at 100).

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::thread;
use std::time::{Duration, Instant};

use libxensock::{
    BackendKind, SockAddrXen, SocketOptions, XenListener, XenSeqPacket, XenSeqPacketListener,
    XenStream,
};

const ECHO: u32 = 7101;
const HALF_CLOSE: u32 = 7102;
const ACCEPT_CLOSE: u32 = 7103;
const SEQ_ECHO: u32 = 7104;
const STOP: u32 = 7199;
/// What the accept-and-close server writes before it closes.
const ACCEPT_CLOSE_GREETING: &[u8] = b"accepted, closing";
const BIG_MIB: usize = 32;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// The stream pattern: position-dependent with a prime period, so a lost,
/// repeated or reordered chunk is caught by comparing with the position.
fn pat(pos: usize) -> u8 {
    let p = (pos % 65521) as u64;
    ((p * 131) ^ (p >> 7)) as u8
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let report = libxensock::backend();
    print!("{report}");
    let r = match (a.get(1).map(String::as_str), a.get(2)) {
        (Some("server"), _) => server().map(|()| 0),
        (Some("client"), Some(d)) => match d.parse() {
            Ok(d) => Ok(client(d)),
            Err(_) => Err("bad domid".into()),
        },
        _ => Err("usage: lab_kernel server | client <server-domid>".into()),
    };
    match r {
        Ok(failures) => std::process::exit(failures.min(100) as i32),
        Err(e) => {
            eprintln!("lab_kernel: error: {e}");
            std::process::exit(101);
        }
    }
}

// ---- server -------------------------------------------------------------------

fn server() -> Res<()> {
    let echo = XenListener::bind(SockAddrXen::new(libxensock::DOMID_ANY, ECHO))?;
    let half = XenListener::bind(SockAddrXen::new(libxensock::DOMID_ANY, HALF_CLOSE))?;
    let quick = XenListener::bind(SockAddrXen::new(libxensock::DOMID_ANY, ACCEPT_CLOSE))?;
    let stop = XenListener::bind(SockAddrXen::new(libxensock::DOMID_ANY, STOP))?;
    let seq = XenSeqPacketListener::bind(SockAddrXen::new(libxensock::DOMID_ANY, SEQ_ECHO))?;
    thread::spawn(move || {
        while let Ok((c, _)) = seq.accept() {
            thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    match c.recv(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => {
                            if c.send(&buf[..n]).is_err() {
                                return;
                            }
                        }
                    }
                }
            });
        }
    });
    println!(
        "lab_kernel server: {:?} on {}, {}, {}, {}",
        echo.backend_kind(),
        echo.local_addr()?,
        half.local_addr()?,
        quick.local_addr()?,
        stop.local_addr()?
    );
    thread::spawn(move || {
        // write a few bytes and close at once: the connector must still see
        // its connect succeed, then those bytes, then EOF
        for mut s in quick.incoming().flatten() {
            let _ = s.write_all(ACCEPT_CLOSE_GREETING);
        }
    });
    thread::spawn(move || {
        for s in echo.incoming() {
            match s {
                Ok(s) => {
                    thread::spawn(move || {
                        let who = s.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                        match echo_conn(s) {
                            Ok(n) => println!("echo {who}: {n} bytes"),
                            Err(e) => println!("echo {who}: {e}"),
                        }
                    });
                }
                Err(e) => println!("echo accept: {e}"),
            }
        }
    });
    thread::spawn(move || {
        for s in half.incoming() {
            match s.and_then(half_close_conn) {
                Ok(n) => println!("half-close: {n} bytes then EOF"),
                Err(e) => println!("half-close: {e}"),
            }
        }
    });
    let (mut s, who) = stop.accept()?;
    // closing at once would race the client's connect (see the
    // accept-close check); wait for its EOF
    let _ = s.read_to_end(&mut Vec::new());
    println!("lab_kernel server: stop from {who}");
    Ok(())
}

fn echo_conn(mut s: XenStream) -> io::Result<u64> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            // the client half-closed: so do we, after everything was echoed
            s.shutdown(Shutdown::Write)?;
            return Ok(total);
        }
        s.write_all(&buf[..n])?;
        total += n as u64;
    }
}

fn half_close_conn(mut s: XenStream) -> io::Result<u64> {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)?;
    // the read direction is at EOF; the write direction still works
    s.write_all(format!("got {}", buf.len()).as_bytes())?;
    Ok(buf.len() as u64)
}

// ---- client -------------------------------------------------------------------

struct Checks {
    failures: u32,
}

impl Checks {
    fn run(&mut self, name: &str, f: impl FnOnce() -> Res<String>) {
        let t = Instant::now();
        let r = f();
        let ms = t.elapsed().as_millis();
        match r {
            Ok(detail) => println!("@@RESULT rust-{name} PASS {detail} ({ms} ms)"),
            Err(e) => {
                self.failures += 1;
                println!("@@RESULT rust-{name} FAIL {e} ({ms} ms)");
            }
        }
    }
}

fn ensure(cond: bool, what: impl Into<String>) -> Res<()> {
    if cond {
        Ok(())
    } else {
        Err(what.into().into())
    }
}

fn errno_of<T>(r: io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

/// Connects, retrying while the server is not up yet (ECONNREFUSED) or the
/// link is still coming up (EHOSTUNREACH / ETIMEDOUT), for up to 120 s.
fn connect_retry(addr: SockAddrXen) -> Res<XenStream> {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        match XenStream::connect(addr) {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < end => {
                println!("connect {addr}: {e}; retrying");
                thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("connect {addr}: {e}").into()),
        }
    }
}

fn client(server: u32) -> u32 {
    let mut c = Checks { failures: 0 };
    let echo = SockAddrXen::new(server, ECHO);

    c.run("backend", || {
        let r = libxensock::backend();
        ensure(
            r.kind == BackendKind::Kernel,
            format!("backend is {}", r.kind),
        )?;
        Ok(format!("family {:?}", r.family))
    });

    // the module owns this domain's links: the user-space transport
    // refuses to start beside it, saying why
    c.run(
        "userspace-refused",
        || match libxensock::Transport::from_env() {
            Ok(_) => Err("the user-space transport started beside af_xen.ko".into()),
            Err(e) if e.to_string().contains("af_xen.ko is loaded") => Ok(e.to_string()),
            Err(e) => Err(format!("unexpected error: {e}").into()),
        },
    );

    // the first connection also waits for the server and the link
    c.run("echo", || {
        let mut s = connect_retry(echo)?;
        ensure(s.backend_kind() == BackendKind::Kernel, "stream not kernel")?;
        s.write_all(b"hello over AF_XEN")?;
        let mut buf = [0u8; 17];
        s.read_exact(&mut buf)?;
        ensure(&buf == b"hello over AF_XEN", "echo differs")?;
        let peer = s.peer_addr()?;
        ensure(peer == echo, format!("peer_addr {peer}"))?;
        let me = s.local_addr()?;
        ensure(
            me.is_concrete_domain() && me.domid != server,
            format!("local_addr {me}"),
        )?;
        Ok(format!("{me} -> {peer}"))
    });

    c.run("big-both-ways", || {
        let s = XenStream::connect(echo)?;
        let mut w = s.try_clone()?;
        let total = BIG_MIB << 20;
        let t = Instant::now();
        let writer = thread::spawn(move || -> io::Result<()> {
            let chunk: Vec<u8> = (0..65521 + 65536).map(pat).collect();
            let mut pos = 0;
            while pos < total {
                let n = (total - pos).min(65536);
                let off = pos % 65521;
                w.write_all(&chunk[off..off + n])?;
                pos += n;
            }
            w.shutdown(Shutdown::Write)
        });
        let mut r = s;
        let mut buf = vec![0u8; 65536];
        let mut pos = 0usize;
        loop {
            let n = r.read(&mut buf)?;
            if n == 0 {
                break;
            }
            for (i, b) in buf[..n].iter().enumerate() {
                if *b != pat(pos + i) {
                    return Err(format!("byte {} differs", pos + i).into());
                }
            }
            pos += n;
        }
        writer.join().map_err(|_| "writer panicked")??;
        ensure(pos == total, format!("echoed {pos} of {total} bytes"))?;
        let secs = t.elapsed().as_secs_f64();
        Ok(format!(
            "{BIG_MIB} MiB out and back, checked ({:.1} MiB/s each way)",
            BIG_MIB as f64 / secs
        ))
    });

    c.run("half-close", || {
        let mut s = connect_retry(SockAddrXen::new(server, HALF_CLOSE))?;
        s.write_all(&[7u8; 1000])?;
        s.shutdown(Shutdown::Write)?;
        let mut answer = String::new();
        s.read_to_string(&mut answer)?;
        ensure(answer == "got 1000", format!("answer {answer:?}"))?;
        let e = errno_of((&s).write(b"x"));
        ensure(
            e == Some(libc::EPIPE),
            format!("write after SHUT_WR: {e:?}"),
        )?;
        Ok("EOF seen by the server, its answer read after our SHUT_WR; EPIPE".into())
    });

    c.run("errno-refused", || {
        let e = errno_of(XenStream::connect(SockAddrXen::new(server, 7198)));
        ensure(e == Some(libc::ECONNREFUSED), format!("{e:?}"))?;
        Ok("ECONNREFUSED".into())
    });

    c.run("errno-unreachable", || {
        // a domid nobody made a link directory for
        let e = errno_of(XenStream::connect(SockAddrXen::new(0x7fe0, 1)));
        ensure(e == Some(libc::EHOSTUNREACH), format!("{e:?}"))?;
        Ok("EHOSTUNREACH".into())
    });

    c.run("errno-bind", || {
        let port = SockAddrXen::new(libxensock::DOMID_SELF, 7150);
        let _l = XenListener::bind(port)?;
        let e = errno_of(XenListener::bind(port));
        ensure(e == Some(libc::EADDRINUSE), format!("second bind: {e:?}"))?;
        let e = errno_of(XenListener::bind(SockAddrXen::new(server, 7151)));
        ensure(
            e == Some(libc::EADDRNOTAVAIL),
            format!("bind to the peer's domid: {e:?}"),
        )?;
        // an address that does not parse says so (no errno to carry)
        let e = XenStream::connect("xen:nonsense").err();
        let kind = e.as_ref().map(io::Error::kind);
        ensure(
            kind == Some(io::ErrorKind::InvalidInput),
            format!("bad address: {e:?}"),
        )?;
        Ok("EADDRINUSE, EADDRNOTAVAIL, InvalidInput".into())
    });

    c.run("timeouts", || {
        let s = XenStream::connect_timeout(&echo, Duration::from_secs(20))?;
        let e = errno_of(s.set_read_timeout(Some(Duration::ZERO)));
        ensure(e == Some(libc::EINVAL), format!("zero timeout: {e:?}"))?;
        s.set_read_timeout(Some(Duration::from_millis(300)))?;
        ensure(
            s.read_timeout()? == Some(Duration::from_millis(300)),
            "read_timeout",
        )?;
        let t = Instant::now();
        let r = (&s).read(&mut [0u8; 8]);
        let waited = t.elapsed();
        let kind = r.as_ref().err().map(io::Error::kind);
        ensure(
            kind == Some(io::ErrorKind::WouldBlock),
            format!("read with nothing to read: {r:?}"),
        )?;
        ensure(
            waited >= Duration::from_millis(250),
            format!("returned after {waited:?}"),
        )?;
        s.set_write_timeout(Some(Duration::from_secs(5)))?;
        ensure(
            s.write_timeout()? == Some(Duration::from_secs(5)),
            "write_timeout",
        )?;
        Ok(format!(
            "connect_timeout, read timed out after {} ms",
            waited.as_millis()
        ))
    });

    c.run("nonblocking", || {
        let s = XenStream::connect(echo)?;
        s.set_nonblocking(true)?;
        let r = (&s).read(&mut [0u8; 8]);
        ensure(
            r.as_ref().err().map(io::Error::kind) == Some(io::ErrorKind::WouldBlock),
            format!("empty read: {r:?}"),
        )?;
        (&s).write_all(b"12345")?;
        wait_fd(&s, libc::POLLIN, 5000)?;
        let n = s.bytes_readable();
        let mut buf = [0u8; 16];
        let got = (&s).read(&mut buf)?;
        ensure(
            got == 5 && &buf[..5] == b"12345",
            format!("read {got} bytes"),
        )?;
        ensure(n == 5, format!("bytes_readable said {n}"))?;
        Ok("WouldBlock, POLLIN, bytes_readable".into())
    });

    c.run("rcvbuf", || {
        let s = XenStream::connect_with(
            echo,
            SocketOptions {
                recv_buffer: Some(8192),
                backlog: None,
            },
        )?;
        let r = s.recv_buffer_size();
        ensure(r == 8192, format!("recv_buffer_size {r}"))?;
        let snd = s.send_buffer_size();
        ensure(snd > 0, "send_buffer_size 0")?;
        // the small ring still carries more than its size
        let mut w = s.try_clone()?;
        let t = thread::spawn(move || w.write_all(&[0x5a; 100_000]));
        let mut got = 0;
        let mut buf = [0u8; 4096];
        let mut r2 = s;
        while got < 100_000 {
            let n = r2.read(&mut buf)?;
            ensure(n > 0, "EOF")?;
            ensure(buf[..n].iter().all(|b| *b == 0x5a), "bad byte")?;
            got += n;
        }
        t.join().map_err(|_| "writer panicked")??;
        Ok(format!(
            "SO_RCVBUF 8192, SO_SNDBUF {snd}, 100000 bytes through"
        ))
    });

    c.run("epoll-et", || epoll_check(echo));

    c.run("listener-poll-loopback", || {
        // a listener in this domain, connected to from this domain
        // (loopback over the kernel family): its fd polls readable
        let l = XenListener::bind(SockAddrXen::new(
            libxensock::DOMID_SELF,
            libxensock::PORT_ANY,
        ))?;
        let addr = l.local_addr()?;
        l.set_nonblocking(true)?;
        let e = errno_of(l.accept());
        ensure(e == Some(libc::EAGAIN), format!("empty accept: {e:?}"))?;
        let t = thread::spawn(move || XenStream::connect(addr));
        wait_fd(&l, libc::POLLIN, 10_000)?;
        let (s, peer) = l.accept()?;
        let c2 = t.join().map_err(|_| "connect panicked")??;
        ensure(
            peer == c2.local_addr()?,
            format!("accept's peer {peer} vs {}", c2.local_addr()?),
        )?;
        ensure(s.peer_addr()? == peer, "peer_addr of the accepted stream")?;
        let timed = l.accept_timeout(Duration::from_millis(200));
        ensure(
            errno_of(timed) == Some(libc::ETIMEDOUT),
            "accept_timeout without a connection",
        )?;
        Ok(format!("{addr}: POLLIN, accept, ETIMEDOUT"))
    });

    // A server that accepts and closes at once: connect must succeed (the
    // connection existed), then read EOF or ECONNRESET, never
    // ECONNREFUSED.
    c.run("accept-close", || {
        let mut refused = 0;
        for i in 0..20 {
            match XenStream::connect(SockAddrXen::new(server, ACCEPT_CLOSE)) {
                Ok(mut s) => {
                    // the bytes written before the close, then EOF (a clean
                    // close: no ECONNRESET)
                    let mut got = Vec::new();
                    s.read_to_end(&mut got)
                        .map_err(|e| format!("connect {i}: read after the peer closed: {e}"))?;
                    ensure(
                        got == ACCEPT_CLOSE_GREETING,
                        format!("connect {i}: read {got:?} then EOF"),
                    )?;
                }
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => refused += 1,
                Err(e) => return Err(e.into()),
            }
        }
        ensure(
            refused == 0,
            format!("{refused} of 20 connects to an accept-and-close server: ECONNREFUSED"),
        )?;
        Ok("20 connects, each read the server's bytes then EOF".into())
    });

    // messages keep their boundaries both ways, a short buffer gets a
    // message's head, peek leaves the message, shutdown ends the stream
    c.run("seqpacket", || {
        let s = XenSeqPacket::connect(SockAddrXen::new(server, SEQ_ECHO))?;
        let sizes = [1usize, 100, 4000, 60_000, 7];
        for &n in &sizes {
            let msg: Vec<u8> = (0..n).map(|i| pat(i + n)).collect();
            ensure(s.send(&msg)? == n, format!("send of {n}"))?;
        }
        let mut buf = vec![0u8; 1 << 17];
        for &n in &sizes {
            let p = s.peek(&mut buf)?;
            let got = s.recv(&mut buf)?;
            ensure(
                p == n && got == n,
                format!("message of {n}: peek {p}, recv {got}"),
            )?;
            ensure(
                buf[..n].iter().enumerate().all(|(i, b)| *b == pat(i + n)),
                format!("message of {n} differs"),
            )?;
        }
        let msg = vec![7u8; 3000];
        s.send(&msg)?;
        let mut short = [0u8; 100];
        let got = s.recv(&mut short)?;
        ensure(got == 100, format!("short buffer: {got}"))?;
        s.send(b"next")?;
        let got = s.recv(&mut buf)?;
        ensure(
            &buf[..got] == b"next",
            "the rest of the long message was not dropped",
        )?;
        s.shutdown(Shutdown::Write)?;
        ensure(s.recv(&mut buf)? == 0, "no end after shutdown")?;
        Ok(format!(
            "{} messages of {sizes:?} bytes back whole, peeked, head of 3000 in 100",
            sizes.len()
        ))
    });

    // stop the server
    c.run("stop-server", || {
        let _s = XenStream::connect(SockAddrXen::new(server, STOP))?;
        Ok(String::new())
    });
    c.failures
}

fn wait_fd(fd: &impl AsRawFd, events: i16, ms: i32) -> Res<()> {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: one pollfd, alive for the call.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    ensure(
        r == 1,
        format!("poll returned {r} (revents {:#x})", p.revents),
    )
}

/// Edge-triggered epoll, as mio and tokio use it: no EPOLLIN while idle,
/// EPOLLOUT at once, EPOLLIN after the echo, a new edge for new data.
fn epoll_check(echo: SockAddrXen) -> Res<String> {
    let s = XenStream::connect(echo)?;
    s.set_nonblocking(true)?;
    // SAFETY: epoll_create1 takes no pointers.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    ensure(ep >= 0, "epoll_create1")?;
    let mut ev = libc::epoll_event {
        events: (libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLRDHUP | libc::EPOLLET) as u32,
        u64: 1,
    };
    // SAFETY: valid epoll fd and socket fd; `ev` is alive for the call.
    let r = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, s.as_raw_fd(), &mut ev) };
    ensure(r == 0, "epoll_ctl")?;
    let wait = |ms: i32| -> u32 {
        let mut out = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `out` has room for 4 events and lives for the call.
        let n = unsafe { libc::epoll_wait(ep, out.as_mut_ptr(), 4, ms) };
        if n > 0 {
            out[0].events
        } else {
            0
        }
    };
    let result = (|| -> Res<String> {
        let first = wait(2000);
        ensure(
            first & libc::EPOLLOUT as u32 != 0,
            format!("first event {first:#x}"),
        )?;
        ensure(
            first & libc::EPOLLIN as u32 == 0,
            format!("EPOLLIN before any data: {first:#x}"),
        )?;
        // epoll may report a spurious edge (mio and tokio tolerate them);
        // what matters is that no EPOLLIN shows up without data
        let idle = wait(200);
        ensure(
            idle & libc::EPOLLIN as u32 == 0,
            format!("EPOLLIN while idle: {idle:#x}"),
        )?;
        for round in 0..3 {
            (&s).write_all(b"ping")?;
            let mut got = 0;
            let end = Instant::now() + Duration::from_secs(10);
            while got < 4 {
                let ev = wait(1000);
                if ev & libc::EPOLLIN as u32 == 0 {
                    ensure(Instant::now() < end, format!("round {round}: no EPOLLIN"))?;
                    continue;
                }
                // drain until WouldBlock, as an edge-triggered user must
                loop {
                    match (&s).read(&mut [0u8; 64]) {
                        Ok(0) => return Err("EOF".into()),
                        Ok(n) => got += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(e.into()),
                    }
                }
            }
            ensure(got == 4, format!("round {round}: {got} bytes"))?;
        }
        s.shutdown(Shutdown::Write)?;
        // the server echoes our FIN: EPOLLIN|EPOLLRDHUP, read 0
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let ev = wait(1000);
            if ev & libc::EPOLLRDHUP as u32 != 0 {
                break;
            }
            ensure(Instant::now() < end, "no EPOLLRDHUP after the peer's FIN")?;
        }
        ensure(
            (&s).read(&mut [0u8; 8])? == 0,
            "read after RDHUP is not EOF",
        )?;
        Ok(format!(
            "EPOLLOUT, idle {idle:#x}, 3 EPOLLIN edges, EPOLLRDHUP + EOF"
        ))
    })();
    // SAFETY: closing the epoll descriptor we created.
    unsafe { libc::close(ep) };
    result
}
