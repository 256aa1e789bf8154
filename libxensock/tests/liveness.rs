// SPDX-License-Identifier: MIT OR Apache-2.0
//! Peer death, hostile peers, non-blocking mode with epoll, many
//! connections.

mod common;
mod pattern;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use common::*;
use libxensock::{SocketOptions, Transport, XenStream};
use xensock_sim::DomainConfig;

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Run as a child process (a process of another sim domain) by the
/// peer-death tests: connects to `XENSOCK_TEST_CONNECT` through the
/// process-wide transport (chosen from the environment), says `connected`
/// and writes until it is killed.
#[test]
#[ignore = "helper: run as a child process by peer_process_killed_mid_transfer"]
fn child_writer() {
    let Ok(addr) = std::env::var("XENSOCK_TEST_CONNECT") else {
        return;
    };
    let mut s = XenStream::connect(addr.as_str()).unwrap();
    println!("connected");
    io::stdout().flush().unwrap();
    let buf = [0x5au8; 16384];
    loop {
        if s.write_all(&buf).is_err() {
            return;
        }
    }
}

#[test]
fn peer_process_killed_mid_transfer() {
    let host = xensock_sim::SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, config()).unwrap();
    let l = a.bind("xen:self:8000").unwrap();
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_writer",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(db.env())
        .env("XENSOCK_TEST_CONNECT", format!("xen:{}:8000", da.domid))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let (mut s, peer) = l.accept().unwrap();
    assert_eq!(peer.domid, u32::from(db.domid));
    let mut line = String::new();
    while !line.contains("connected") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited");
    }
    let mut buf = vec![0u8; 65536];
    let mut got = 0;
    while got < 1 << 20 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0);
        assert!(buf[..n].iter().all(|&b| b == 0x5a));
        got += n;
    }
    // Kill the peer mid-transfer; drain what is in the ring until the
    // reset (or EOF) arrives.
    let killed = Instant::now();
    child.kill().unwrap();
    let end = loop {
        match s.read(&mut buf) {
            Ok(0) => break Ok(0),
            Ok(_) => continue,
            Err(e) => break Err(e),
        }
    };
    let latency = killed.elapsed();
    child.wait().unwrap();
    match end {
        Ok(0) => {}
        Err(e) => assert_eq!(errno(&e), libc::ECONNRESET),
        Ok(_) => unreachable!(),
    }
    let bound = Duration::from_millis(100) * slack();
    assert!(
        latency < bound,
        "peer death seen after {latency:?} (bound {bound:?})"
    );
    assert_eq!(a.status().links_lost, 1);
    // Writing now fails too.
    assert!((&s).write(b"x").is_err());
    drop((s, l, a));
    assert!(
        eventually(Duration::from_secs(5), || host
            .stats()
            .grants_and_channels_released()),
        "{:?}",
        host.stats()
    );
}

#[test]
fn peer_domain_destroyed() {
    let p = pair();
    let l = p.b.bind("xen:self:8001").unwrap();
    let c = p.a.connect((u32::from(p.db.domid), 8001)).unwrap();
    let (_s, _) = l.accept().unwrap();
    let reader = thread::spawn(move || {
        let mut buf = [0u8; 16];
        let r = (&c).read(&mut buf);
        (r.map_err(|e| errno(&e)), Instant::now(), c)
    });
    thread::sleep(Duration::from_millis(50));
    let t0 = Instant::now();
    p.host.destroy_domain(p.db.domid).unwrap();
    let (r, seen, c) = reader.join().unwrap();
    assert!(matches!(r, Ok(0) | Err(libc::ECONNRESET)), "{r:?}");
    let latency = seen - t0;
    let bound = Duration::from_millis(100) * slack();
    assert!(latency < bound, "domain destruction seen after {latency:?}");
    drop((c, l, _s));
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

fn epoll_wait_one(ep: i32, ms: i32) -> Option<u64> {
    let mut ev = libc::epoll_event { events: 0, u64: 0 };
    // SAFETY: one valid epoll_event.
    let n = unsafe { libc::epoll_wait(ep, &mut ev, 1, ms) };
    (n == 1).then_some(ev.u64)
}

#[test]
fn nonblocking_with_epoll() {
    let p = pair();
    let l = p.b.bind("xen:self:8003").unwrap();
    l.set_nonblocking(true).unwrap();
    assert_eq!(l.accept().unwrap_err().kind(), io::ErrorKind::WouldBlock);
    // SAFETY: plain syscall.
    let ep = unsafe { libc::epoll_create1(0) };
    assert!(ep >= 0);
    let add = |fd: i32, token: u64| {
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: token,
        };
        // SAFETY: valid descriptors and event.
        let rc = unsafe { libc::epoll_ctl(ep, libc::EPOLL_CTL_ADD, fd, &mut ev) };
        assert_eq!(rc, 0);
    };
    add(l.as_raw_fd(), 1);
    let c = p.a.connect((u32::from(p.db.domid), 8003)).unwrap();
    c.set_nonblocking(true).unwrap();
    assert_eq!(epoll_wait_one(ep, 2000), Some(1));
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    add(s.as_raw_fd(), 2);
    let mut buf = [0u8; 4096];
    assert_eq!(
        (&s).read(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    // Nothing to report yet.
    assert_eq!(epoll_wait_one(ep, 50), None);
    (&c).write_all(b"ping").unwrap();
    assert_eq!(epoll_wait_one(ep, 2000), Some(2));
    assert_eq!((&s).read(&mut buf).unwrap(), 4);
    assert_eq!(&buf[..4], b"ping");
    // The mio/tokio contract: drain until WouldBlock before waiting for the
    // next edge.
    assert_eq!(
        (&s).read(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    // Fill the client's send ring until WouldBlock, then wait for space
    // with epoll while the server drains.
    let cfd = c.as_raw_fd();
    add(cfd, 3);
    let chunk = [1u8; 8192];
    let mut written = 0usize;
    loop {
        match (&c).write(&chunk) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert!(written >= c.send_buffer_size());
    let mut drained = 0usize;
    let mut more_written = 0usize;
    let deadline = Instant::now() + Duration::from_secs(10);
    while drained < written + more_written || more_written == 0 {
        assert!(Instant::now() < deadline);
        match epoll_wait_one(ep, 1000) {
            Some(2) => loop {
                match (&s).read(&mut buf) {
                    Ok(n) => drained += n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            },
            Some(3) => {
                if more_written == 0 {
                    match (&c).write(&chunk) {
                        Ok(n) => more_written += n,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            Some(_) => {}
            None => {
                // Level check: the server side may have data it was not
                // told about only if an edge was lost.
                assert_eq!(
                    (&s).read(&mut buf).unwrap_err().kind(),
                    io::ErrorKind::WouldBlock,
                    "an edge was lost"
                );
            }
        }
    }
    assert!(more_written > 0);
    // EOF is an event too.
    drop(c);
    assert!(epoll_wait_one(ep, 2000).is_some());
    assert!(eventually(Duration::from_secs(2), || matches!(
        (&s).read(&mut buf),
        Ok(0)
    )));
    // SAFETY: closing our epoll descriptor.
    unsafe { libc::close(ep) };
}

#[test]
fn thousand_concurrent_connections() {
    let n: usize = std::env::var("XENSOCK_TEST_CONNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000);
    let p = pair();
    let small = SocketOptions {
        recv_buffer: Some(2048),
        backlog: Some(n + 1),
    };
    let l = p.b.bind_with("xen:self:8004", small).unwrap();
    let addr = (u32::from(p.db.domid), 8004);
    let mut clients = Vec::with_capacity(n);
    let mut servers = Vec::with_capacity(n);
    for _ in 0..n {
        clients.push(p.a.connect_with(addr, None, small).unwrap());
        servers.push(l.accept().unwrap().0);
    }
    assert_eq!(p.a.status().connections.len(), n);
    // Every connection carries its own bytes.
    for (i, c) in clients.iter().enumerate() {
        (&*c).write_all(&(i as u32).to_le_bytes()).unwrap();
    }
    for (i, s) in servers.iter().enumerate() {
        let mut b = [0u8; 4];
        (&*s).read_exact(&mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), i as u32);
    }
    // Two compact rings per connection: one grant, one mapping per side.
    let st = p.host.stats();
    assert!(st.grants >= 2 * n && st.grants < 2 * n + 16, "{st:?}");
    drop(clients);
    drop(servers);
    assert!(eventually(Duration::from_secs(10), || p
        .a
        .status()
        .connections
        .is_empty()
        && p.b.status().connections.is_empty()));
}
