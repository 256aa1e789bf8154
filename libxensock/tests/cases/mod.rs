// SPDX-License-Identifier: MIT OR Apache-2.0
//! Behaviour cases shared by the backends: the same test bodies run over
//! the user-space transport on the simulated host (`tests/basic.rs`, two
//! simulated domains) and over the kernel family (`tests/kernel_family.rs`,
//! `af_xen.ko` loaded: loopback connections inside one domain, run in the
//! lab by `tests/lab/kmod-rust`). A [`World`] gives a body its two sides.

#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, RawFd};
use std::thread;
use std::time::{Duration, Instant};

use libxensock::{SockAddrXen, SocketOptions, ToXenAddr, XenListener, XenStream, DOMID_SELF};

/// The two sides of a test: listeners in the server's domain, connects
/// from the client's.
pub trait World: Sync {
    /// The domain listeners bind in.
    fn server_domid(&self) -> u32;
    /// The domain connects come from.
    fn client_domid(&self) -> u32;
    fn bind_to(&self, addr: SockAddrXen, opts: SocketOptions) -> io::Result<XenListener>;
    fn connect_with(&self, addr: SockAddrXen, opts: SocketOptions) -> io::Result<XenStream>;
    /// A connect that does not wait for the answer (`EINPROGRESS`).
    fn connect_nonblocking(&self, addr: SockAddrXen) -> io::Result<XenStream>;
    /// What a connecting stream's descriptor reports when the answer is in
    /// (`POLLIN`: the user-space transport's eventfd; `POLLOUT`: a socket).
    fn connect_ready_events(&self) -> i16;
    /// Connections the server side refused so far, where the backend
    /// counts them.
    fn rejected(&self) -> Option<u64>;
    /// Whether a failed non-blocking connect keeps reporting its error
    /// from `take_error` (the user-space transport) or reports it once
    /// (a socket's `SO_ERROR`).
    fn connect_error_sticky(&self) -> bool;
    /// Whether a connect to our own domain is a loopback connection (the
    /// kernel family) or `EINVAL` (the user-space transport).
    fn loopback(&self) -> bool;
    /// Ends the world (dropping what it holds) and says whether every
    /// resource of its connections was given back, waiting up to a bound.
    fn released(self) -> Result<(), String>
    where
        Self: Sized;

    /// Binds `port` in the server's domain ("xen:self:<port>").
    fn bind_with(&self, port: u32, opts: SocketOptions) -> io::Result<XenListener> {
        self.bind_to(SockAddrXen::new(DOMID_SELF, port), opts)
    }
    fn bind(&self, port: u32) -> io::Result<XenListener> {
        self.bind_with(port, SocketOptions::default())
    }
    fn connect(&self, port: u32) -> io::Result<XenStream> {
        self.connect_with(self.addr(port), SocketOptions::default())
    }
    fn addr(&self, port: u32) -> SockAddrXen {
        SockAddrXen::new(self.server_domid(), port)
    }
}

pub fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// Polls `f` until it is true or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
}

pub fn echo<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    assert_eq!(
        l.local_addr().unwrap(),
        SockAddrXen::new(w.server_domid(), port)
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
    let mut c = w.connect(port).unwrap();
    assert_eq!(c.peer_addr().unwrap(), w.addr(port));
    assert_eq!(c.local_addr().unwrap().domid, w.client_domid());
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
    w.released().unwrap();
}

/// Tiny writes and reads through 2 KiB rings, checksummed.
pub fn many_small_writes_and_partial_reads<W: World>(w: W, port: u32) {
    let small = SocketOptions {
        recv_buffer: Some(2048),
        ..Default::default()
    };
    let l = w.bind_with(port, small).unwrap();
    let writes = 20_000u32;
    thread::scope(|sc| {
        let writer = sc.spawn(|| {
            let mut c = w.connect_with(w.addr(port), small).unwrap();
            let mut h = FNV_INIT;
            for i in 0..writes {
                let len = (i % 13) as usize + 1;
                let chunk: Vec<u8> = (0..len).map(|k| (i as usize + k) as u8).collect();
                fnv(&mut h, &chunk);
                c.write_all(&chunk).unwrap();
            }
            h
        });
        let (s, _) = l.accept().unwrap();
        assert_eq!(s.recv_buffer_size(), 2048);
        // everything is read before the writer is joined: its ring is small
        let (total, h) = read_in_small_pieces(&s);
        let expect: usize = (0..writes).map(|i| (i % 13) as usize + 1).sum();
        assert_eq!(total, expect);
        assert_eq!(h, writer.join().unwrap());
    });
}

fn read_in_small_pieces(mut s: &XenStream) -> (usize, u64) {
    let mut h = FNV_INIT;
    let mut total = 0usize;
    let mut i = 0usize;
    loop {
        let mut buf = vec![0u8; i % 7 + 1];
        i += 1;
        let n = s.read(&mut buf).unwrap();
        if n == 0 {
            return (total, h);
        }
        fnv(&mut h, &buf[..n]);
        total += n;
    }
}

/// `total` bytes each way at once, each direction checksummed.
pub fn bidirectional_checksummed_transfer<W: World>(w: W, port: u32, total: u64) {
    let l = w.bind(port).unwrap();
    let c = w.connect(port).unwrap();
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
    drop((c, l));
    w.released().unwrap();
}

pub fn half_close<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let mut c = w.connect(port).unwrap();
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

/// `peek` returns what a read would, and the read then returns the same
/// bytes; it waits as a read waits, says `WouldBlock` in non-blocking
/// mode and 0 at the end of the stream.
pub fn peek_leaves_the_bytes_for_the_next_read<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let mut c = w.connect(port).unwrap();
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        s.peek(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );
    s.set_nonblocking(false).unwrap();
    // a blocking peek waits for the bytes
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        c.write_all(b"hello peek").unwrap();
        c
    });
    let n = s.peek(&mut buf).unwrap();
    assert!(n > 0 && buf[..n] == b"hello peek"[..n], "{n}");
    let mut c = t.join().unwrap();
    assert!(eventually(Duration::from_secs(5), || s
        .peek(&mut buf)
        .unwrap()
        == 10));
    assert_eq!(&buf[..10], b"hello peek");
    // peeking twice changes nothing; the read gets the same bytes
    assert_eq!(s.peek(&mut buf[..4]).unwrap(), 4);
    let mut got = [0u8; 10];
    (&s).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello peek");
    c.write_all(b"!").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    assert!(eventually(Duration::from_secs(5), || s
        .peek(&mut buf)
        .unwrap()
        == 1));
    assert_eq!((&s).read(&mut buf).unwrap(), 1);
    assert_eq!(s.peek(&mut buf).unwrap(), 0, "end of stream");
    drop((c, s, l));
    w.released().unwrap();
}

/// `SO_LINGER` 0 makes the close abortive: the peer's read gets
/// `ECONNRESET` (what it had not read is dropped) and its write too; any
/// other linger leaves the usual close (the bytes, then end of stream).
pub fn linger_zero_resets_the_peer<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let mut c = w.connect(port).unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(c.linger().unwrap(), None);
    c.set_linger(Some(Duration::ZERO)).unwrap();
    assert_eq!(c.linger().unwrap(), Some(Duration::ZERO));
    c.write_all(b"dropped").unwrap();
    drop(c);
    let mut buf = [0u8; 16];
    let r = (&s).read(&mut buf);
    assert_eq!(
        r.as_ref().map_err(errno).err(),
        Some(libc::ECONNRESET),
        "read after the peer's abortive close: {r:?}"
    );
    // a linger with time: the usual close
    let mut c = w.connect(port).unwrap();
    let (s2, _) = l.accept().unwrap();
    c.set_linger(Some(Duration::from_secs(1))).unwrap();
    c.write_all(b"kept").unwrap();
    drop(c);
    let mut got = Vec::new();
    (&s2).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"kept");
    drop((s, s2, l));
    w.released().unwrap();
}

pub fn shutdown_read_makes_peer_writes_fail_with_epipe<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let c = w.connect(port).unwrap();
    let (s, _) = l.accept().unwrap();
    s.shutdown(Shutdown::Read).unwrap();
    let mut buf = [0u8; 4];
    assert_eq!((&s).read(&mut buf).unwrap(), 0);
    assert_eq!(errno(&(&c).write(b"data").unwrap_err()), libc::EPIPE);
}

pub fn close_gives_eof_then_epipe<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let mut c = w.connect(port).unwrap();
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

/// `port` has no listener; `port + 1` had one that went away.
/// A clone of a listener accepts as well as the original, after the
/// original is gone; the listener closes with its last handle.
pub fn a_cloned_listener_accepts_and_the_last_handle_closes_it<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let clone = l.try_clone().unwrap();
    assert!(l.take_error().unwrap().is_none());
    drop(l);
    let mut c = w.connect(port).unwrap();
    let (mut s, _) = clone.accept_timeout(Duration::from_secs(20)).unwrap();
    c.write_all(b"via the clone").unwrap();
    let mut buf = [0u8; 13];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"via the clone");
    drop((c, s));
    drop(clone);
    // nobody listens any more
    let e = w.connect(port).unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED, "{e}");
    w.released().unwrap();
}

pub fn connect_to_a_port_nobody_listens_on_is_refused<W: World>(w: W, port: u32) {
    let e = w.connect(port).unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED);
    let l = w.bind(port + 1).unwrap();
    drop(l);
    let e = w.connect(port + 1).unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED);
}

pub fn bad_addresses_are_einval<W: World>(w: W) {
    // refused by the address parser, whichever backend
    for a in ["xen:1", "tcp:1:2", "xen:99999:1"] {
        let e = a.to_xen_addr().unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{a}");
        assert!(e.to_string().contains(a), "{e}");
    }
    // The wildcard port.
    let any = SockAddrXen::new(w.server_domid(), libxensock::PORT_ANY);
    let e = w.connect_with(any, SocketOptions::default()).unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL);
    // Our own domain: a loopback connection where the backend has them
    // (ECONNREFUSED, nobody listens on port 1), else EINVAL.
    let me = SockAddrXen::new(w.client_domid(), 1);
    let e = w.connect_with(me, SocketOptions::default()).unwrap_err();
    let want = if w.loopback() {
        libc::ECONNREFUSED
    } else {
        libc::EINVAL
    };
    assert_eq!(errno(&e), want);
}

/// `other_domid`: a domain whose id is not ours to bind.
pub fn port_in_use_and_any_port<W: World>(w: W, port: u32, other_domid: u32) {
    let _l = w.bind(port).unwrap();
    assert_eq!(errno(&w.bind(port).unwrap_err()), libc::EADDRINUSE);
    let any = w.bind(libxensock::PORT_ANY).unwrap();
    assert!(any.local_addr().unwrap().port >= libxensock::EPHEMERAL_PORT_FIRST);
    // Another domain's id is not ours to bind.
    let other = SockAddrXen::new(other_domid, port + 1);
    let e = w.bind_to(other, SocketOptions::default()).unwrap_err();
    assert_eq!(errno(&e), libc::EADDRNOTAVAIL);
    // Our own id is.
    let own = SockAddrXen::new(w.server_domid(), port + 2);
    let l = w.bind_to(own, SocketOptions::default()).unwrap();
    assert_eq!(l.local_addr().unwrap(), own);
}

pub fn listener_backlog_full_refuses<W: World>(w: W, port: u32) {
    let before = w.rejected();
    let _l = w
        .bind_with(
            port,
            SocketOptions {
                backlog: Some(2),
                ..Default::default()
            },
        )
        .unwrap();
    let _c1 = w.connect(port).unwrap();
    let _c2 = w.connect(port).unwrap();
    let e = w.connect(port).unwrap_err();
    assert_eq!(errno(&e), libc::ECONNREFUSED);
    if let (Some(b), Some(a)) = (before, w.rejected()) {
        assert_eq!(a - b, 1);
    }
}

pub fn timeouts<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let c = w.connect(port).unwrap();
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

fn poll_for(fd: RawFd, events: i16, ms: i32) -> bool {
    let mut pfd = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    // SAFETY: one valid pollfd for the duration of the call.
    unsafe { libc::poll(&mut pfd, 1, ms) == 1 }
}

/// Waits for a non-blocking connect's answer through the descriptor.
fn finish(w: &impl World, c: &XenStream, deadline: Instant) -> io::Result<()> {
    loop {
        match c.finish_connect() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                // Nothing to read before the connection is open.
                assert_eq!(
                    (&*c).read(&mut [0u8; 1]).unwrap_err().kind(),
                    io::ErrorKind::WouldBlock
                );
                assert!(Instant::now() < deadline, "no answer");
                poll_for(c.as_raw_fd(), w.connect_ready_events(), 1000);
            }
            r => return r,
        }
    }
}

/// A non-blocking connect (as `EINPROGRESS`) completes through the
/// descriptor; `finish_connect` / `take_error` report it. `port + 1`:
/// nobody listens there.
pub fn nonblocking_connect_completes_through_the_descriptor<W: World>(w: W, port: u32) {
    let l = w.bind(port).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let c = w.connect_nonblocking(w.addr(port)).unwrap();
    finish(&w, &c, deadline).unwrap();
    assert!(c.take_error().unwrap().is_none());
    // and on every later call
    c.finish_connect().unwrap();
    let (s, _) = l.accept().unwrap();
    (&c).write_all(b"nb").unwrap();
    let mut b = [0u8; 2];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"nb");

    // Nobody listens: the answer is a refusal, reported once it is in (a
    // loopback connect knows at once and says so from the connect).
    let err = match w.connect_nonblocking(w.addr(port + 1)) {
        Ok(r) => {
            let e = finish(&w, &r, deadline).unwrap_err();
            // the transport keeps reporting it; a socket's SO_ERROR
            // reports it once, as TCP's does
            let again = r.take_error().unwrap().map(|e| errno(&e));
            let want = w.connect_error_sticky().then_some(libc::ECONNREFUSED);
            assert_eq!(again, want);
            e
        }
        Err(e) => {
            assert!(w.loopback(), "refused before the answer: {e}");
            e
        }
    };
    assert_eq!(errno(&err), libc::ECONNREFUSED);
}

/// Writes `total` bytes of a checksummed pattern, returns the checksum.
pub fn send_pattern(mut w: impl Write, total: u64, seed: u64) -> u64 {
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

pub fn recv_all(mut r: impl Read) -> (u64, u64) {
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
pub struct Sum(u64, u64);
impl Sum {
    pub fn add(&mut self, data: &[u8]) {
        for &b in data {
            self.1 += 1;
            self.0 = self.0.rotate_left(5) ^ u64::from(b) ^ self.1;
        }
    }
}

// not every test binary that includes this module uses them
#[allow(unused_imports)]
pub use crate::pattern::{fnv, Pattern, FNV_INIT};
