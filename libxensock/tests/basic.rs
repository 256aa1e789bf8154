//! Core behaviour across two simulated domains in one process.

mod common;

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use libxensock::{SockAddrXen, SocketOptions};

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

#[test]
fn echo_across_domains() {
    let p = pair();
    let l = p.b.bind("xen:self:7000").unwrap();
    assert_eq!(
        l.local_addr().unwrap(),
        SockAddrXen::new(p.db.domid.into(), 7000)
    );
    let server = thread::spawn(move || {
        let (mut s, peer) = l.accept().unwrap();
        let mut buf = [0u8; 1024];
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).unwrap();
        }
        peer
    });
    let mut c = p.a.connect((u32::from(p.db.domid), 7000)).unwrap();
    assert_eq!(
        c.peer_addr().unwrap(),
        SockAddrXen::new(p.db.domid.into(), 7000)
    );
    c.write_all(b"hello, xen").unwrap();
    let mut buf = [0u8; 10];
    c.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"hello, xen");
    c.shutdown(Shutdown::Write).unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).unwrap();
    assert!(rest.is_empty());
    let peer = server.join().unwrap();
    assert_eq!(peer, c.local_addr().unwrap());
    drop(c);
    drop(p.a);
    drop(p.b);
    assert!(
        eventually(Duration::from_secs(5), || p
            .host
            .stats()
            .grants_and_channels_released()),
        "{:?}",
        p.host.stats()
    );
}

#[test]
fn second_connection_reuses_the_link() {
    let p = pair();
    let l = p.b.bind("xen:self:7001").unwrap();
    let addr = (u32::from(p.db.domid), 7001);
    let c1 = p.a.connect(addr).unwrap();
    let _s1 = l.accept().unwrap();
    let ports_before = p.host.stats().ports;
    let c2 = p.a.connect(addr).unwrap();
    let _s2 = l.accept().unwrap();
    // No new event channels: connections are frames on the link.
    assert_eq!(p.host.stats().ports, ports_before);
    assert_ne!(c1.local_addr().unwrap(), c2.local_addr().unwrap());
    assert_eq!(p.a.status().links.len(), 1);
    assert_eq!(p.a.status().connections.len(), 2);
}

#[test]
fn many_small_writes_and_partial_reads() {
    let p = pair();
    let l =
        p.b.bind_with(
            "xen:self:7002",
            SocketOptions {
                recv_buffer: Some(2048),
                ..Default::default()
            },
        )
        .unwrap();
    let addr = (u32::from(p.db.domid), 7002);
    let writer = {
        let a = p.a.clone();
        thread::spawn(move || {
            let mut c = a
                .connect_with(
                    addr,
                    None,
                    SocketOptions {
                        recv_buffer: Some(2048),
                        ..Default::default()
                    },
                )
                .unwrap();
            let mut h = FNV_INIT;
            for i in 0..20_000u32 {
                let len = (i % 13) as usize + 1;
                let chunk: Vec<u8> = (0..len).map(|k| (i as usize + k) as u8).collect();
                fnv(&mut h, &chunk);
                c.write_all(&chunk).unwrap();
            }
            h
        })
    };
    let (mut s, _) = l.accept().unwrap();
    assert_eq!(s.recv_buffer_size(), 2048);
    let mut h = FNV_INIT;
    let mut total = 0usize;
    let mut i = 0usize;
    loop {
        let mut buf = vec![0u8; i % 7 + 1];
        i += 1;
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        fnv(&mut h, &buf[..n]);
        total += n;
    }
    let expect: usize = (0..20_000u32).map(|i| (i % 13) as usize + 1).sum();
    assert_eq!(total, expect);
    assert_eq!(h, writer.join().unwrap());
}

/// Writes `total` bytes of a checksummed pattern, returns the checksum.
fn send_pattern(mut w: impl Write, total: u64, seed: u64) -> u64 {
    let mut block = vec![0u8; 64 * 1024];
    Pattern::new(seed).fill(&mut block);
    let mut sum = Sum::default();
    let mut sent = 0u64;
    let mut i = 0u64;
    while sent < total {
        block[..8].copy_from_slice(&i.to_le_bytes());
        let n = (total - sent).min(block.len() as u64) as usize;
        sum.add(&block[..n]);
        w.write_all(&block[..n]).unwrap();
        sent += n as u64;
        i += 1;
    }
    sum.0
}

fn recv_all(mut r: impl Read) -> (u64, u64) {
    let mut buf = vec![0u8; 64 * 1024];
    let mut sum = Sum::default();
    let mut total = 0u64;
    loop {
        let n = r.read(&mut buf).unwrap();
        if n == 0 {
            return (total, sum.0);
        }
        sum.add(&buf[..n]);
        total += n as u64;
    }
}

/// Position-dependent checksum (detects reordering), fast in debug builds.
#[derive(Default)]
struct Sum(u64, u64);
impl Sum {
    fn add(&mut self, data: &[u8]) {
        for &b in data {
            self.1 += 1;
            self.0 = self.0.rotate_left(5) ^ u64::from(b) ^ self.1;
        }
    }
}

#[test]
fn bidirectional_checksummed_transfer() {
    // XENSOCK_TEST_BIG=1 moves the 1 GiB each way (use --release).
    let total: u64 = if std::env::var_os("XENSOCK_TEST_BIG").is_some() {
        1 << 30
    } else {
        32 << 20
    };
    let p = pair();
    let l = p.b.bind("xen:self:7003").unwrap();
    let addr = (u32::from(p.db.domid), 7003);
    let c = p.a.connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    let start = Instant::now();
    let (c2, s2) = (c.try_clone().unwrap(), s.try_clone().unwrap());
    let t1 = thread::spawn(move || {
        let h = send_pattern(&c2, total, 1);
        c2.shutdown(Shutdown::Write).unwrap();
        h
    });
    let t2 = thread::spawn(move || {
        let h = send_pattern(&s2, total, 2);
        s2.shutdown(Shutdown::Write).unwrap();
        h
    });
    let t3 = thread::spawn(move || recv_all(&s));
    let (got_a, sum_a) = recv_all(&c);
    let (got_b, sum_b) = t3.join().unwrap();
    let (sent_a, sent_b) = (t1.join().unwrap(), t2.join().unwrap());
    assert_eq!((got_b, sum_b), (total, sent_a));
    assert_eq!((got_a, sum_a), (total, sent_b));
    eprintln!("2 x {} MiB in {:?}", total >> 20, start.elapsed());
    let t = Instant::now();
    drop((c, l));
    eprintln!("close c {:?}", t.elapsed());
    drop(p.a);
    eprintln!("drop a {:?}", t.elapsed());
    drop(p.b);
    eprintln!("drop b {:?}", t.elapsed());
    drop(p.host);
    eprintln!("drop host {:?}", t.elapsed());
}

#[test]
fn half_close() {
    let p = pair();
    let l = p.b.bind("xen:self:7004").unwrap();
    let mut c = p.a.connect((u32::from(p.db.domid), 7004)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    c.write_all(b"request").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    // Writing after shutdown(Write) is EPIPE.
    assert_eq!(errno(&c.write(b"x").unwrap_err()), libc::EPIPE);
    let mut req = Vec::new();
    s.read_to_end(&mut req).unwrap();
    assert_eq!(req, b"request");
    // The other direction still works.
    s.write_all(b"response").unwrap();
    drop(s);
    let mut resp = Vec::new();
    c.read_to_end(&mut resp).unwrap();
    assert_eq!(resp, b"response");
}

#[test]
fn shutdown_read_makes_peer_writes_fail_with_epipe() {
    let p = pair();
    let l = p.b.bind("xen:self:7005").unwrap();
    let c = p.a.connect((u32::from(p.db.domid), 7005)).unwrap();
    let (s, _) = l.accept().unwrap();
    s.shutdown(Shutdown::Read).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!((&s).read(&mut buf).unwrap(), 0);
    assert_eq!(errno(&(&c).write(b"data").unwrap_err()), libc::EPIPE);
}

#[test]
fn close_gives_eof_then_epipe() {
    let p = pair();
    let l = p.b.bind("xen:self:7006").unwrap();
    let mut c = p.a.connect((u32::from(p.db.domid), 7006)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.write_all(b"bye").unwrap();
    drop(s);
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"bye");
    assert!(eventually(Duration::from_secs(2), || (&c)
        .write(b"x")
        .is_err_and(|e| errno(&e) == libc::EPIPE)));
}

#[test]
fn connect_to_a_port_nobody_listens_on_is_refused() {
    let p = pair();
    let e = p.a.connect((u32::from(p.db.domid), 9)).unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED);
    // A listener that went away refuses too.
    let l = p.b.bind("xen:self:10").unwrap();
    drop(l);
    let e = p.a.connect((u32::from(p.db.domid), 10)).unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED);
}

#[test]
fn connect_to_an_unknown_domain_is_unreachable_at_once() {
    // With the agent's table, a domid it does not list fails at once, not
    // after the link timeout (a minute here).
    let w = agent_world(libxensock::Config {
        link_timeout: Duration::from_secs(60),
        ..config()
    });
    let t0 = std::time::Instant::now();
    let e = w.pair.a.connect((4000u32, 80)).unwrap_err();
    assert_eq!(errno(&e), libc::EHOSTUNREACH);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // Nothing was offered, nothing is left behind.
    assert!(w.pair.a.status().links.is_empty());
    // The listed peer is reachable.
    let l = w.pair.b.bind("xen:self:80").unwrap();
    let _c = w.pair.a.connect((u32::from(w.pair.db.domid), 80)).unwrap();
    let _s = l.accept().unwrap();
}

#[test]
fn without_discovery_an_unknown_domain_is_unreachable_after_the_link_timeout() {
    // No agent and no static list: nothing tells that domain 4000 does not
    // exist (guests cannot ask xenstored), so the link timeout decides.
    let p = pair_with(libxensock::Config {
        link_timeout: Duration::from_millis(300),
        ..config()
    });
    let e = p.a.connect((4000u32, 80)).unwrap_err();
    assert_eq!(errno(&e), libc::EHOSTUNREACH);
    // The withdrawn offer leaves nothing behind.
    assert!(p.a.status().links.is_empty());
}

#[test]
fn bad_addresses_are_einval() {
    let p = pair();
    for a in ["xen:1", "tcp:1:2", "xen:99999:1"] {
        assert_eq!(errno(&p.a.connect(a).unwrap_err()), libc::EINVAL, "{a}");
    }
    // Own domain and the wildcard port.
    let me = u32::from(p.da.domid);
    assert_eq!(errno(&p.a.connect((me, 1)).unwrap_err()), libc::EINVAL);
    assert_eq!(errno(&p.a.connect("xen:3:any").unwrap_err()), libc::EINVAL);
}

#[test]
fn port_in_use_and_any_port() {
    let p = pair();
    let _l = p.b.bind("xen:self:7007").unwrap();
    assert_eq!(
        errno(&p.b.bind("xen:self:7007").unwrap_err()),
        libc::EADDRINUSE
    );
    let any = p.b.bind("xen:any:any").unwrap();
    assert!(any.local_addr().unwrap().port >= libxensock::EPHEMERAL_PORT_FIRST);
    // Another domain's id is not ours to bind.
    assert_eq!(
        errno(&p.b.bind((u32::from(p.da.domid), 1)).unwrap_err()),
        libc::EADDRNOTAVAIL
    );
}

#[test]
fn listener_backlog_full_refuses() {
    let p = pair();
    let _l =
        p.b.bind_with(
            "xen:self:7008",
            SocketOptions {
                backlog: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    let addr = (u32::from(p.db.domid), 7008);
    let _c1 = p.a.connect(addr).unwrap();
    let _c2 = p.a.connect(addr).unwrap();
    let e = p.a.connect(addr).unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED);
    assert_eq!(p.b.status().rejected, 1);
}

#[test]
fn timeouts() {
    let p = pair();
    let l = p.b.bind("xen:self:7009").unwrap();
    let c = p.a.connect((u32::from(p.db.domid), 7009)).unwrap();
    let (_s, _) = l.accept().unwrap();
    assert_eq!(
        errno(&c.set_read_timeout(Some(Duration::ZERO)).unwrap_err()),
        libc::EINVAL
    );
    c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let mut buf = [0u8; 8];
    let e = (&c).read(&mut buf).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    assert!(matches!(
        l.accept_timeout(Duration::from_millis(20))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::ETIMEDOUT)
    ));
}

fn poll_readable(fd: std::os::fd::RawFd, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

/// `connect_nonblocking` returns at once in the connecting state (as
/// `EINPROGRESS`); the descriptor becomes readable with the answer and
/// `finish_connect` / `take_error` report it.
#[test]
fn nonblocking_connect_completes_through_the_descriptor() {
    use std::os::fd::AsRawFd;
    let p = pair();
    let l = p.b.bind("xen:self:7010").unwrap();
    let bid = u32::from(p.db.domid);
    p.a.prepare_link(bid, Duration::from_secs(5)).unwrap();
    assert!(p.a.link_ready(bid));
    let c =
        p.a.connect_nonblocking((bid, 7010), SocketOptions::default())
            .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.finish_connect() {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing to read or write before the connection is open.
                assert_eq!(
                    (&c).read(&mut [0u8; 1]).unwrap_err().kind(),
                    io::ErrorKind::WouldBlock
                );
                assert!(Instant::now() < deadline, "no answer");
                poll_readable(c.as_raw_fd(), 1000);
            }
            Err(e) => panic!("connect failed: {e}"),
        }
    }
    assert!(c.take_error().unwrap().is_none());
    let (s, _) = l.accept().unwrap();
    (&c).write_all(b"nb").unwrap();
    let mut b = [0u8; 2];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"nb");

    // Nobody listens: the answer is a refusal, reported once it is in.
    let r =
        p.a.connect_nonblocking((bid, 7011), SocketOptions::default())
            .unwrap();
    let err = loop {
        match r.finish_connect() {
            Ok(()) => panic!("connected to a port nobody listens on"),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                assert!(Instant::now() < deadline, "no answer");
                poll_readable(r.as_raw_fd(), 1000);
            }
            Err(e) => break e,
        }
    };
    assert_eq!(errno(&err), libc::ECONNREFUSED);
    assert_eq!(
        r.take_error().unwrap().map(|e| errno(&e)),
        Some(libc::ECONNREFUSED)
    );
}
