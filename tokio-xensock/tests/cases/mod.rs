// SPDX-License-Identifier: MIT OR Apache-2.0
//! tokio-xensock behaviour cases shared by the backends: the same bodies run
//! over the user-space transport on the simulated host (`tests/tokio.rs`)
//! and over the kernel family (`tests/tokio_kernel_family.rs`, `af_xen.ko`
//! loaded, loopback connections in one domain, run in the lab by
//! `tests/lab/kmod-rust`). A [`World`] gives a body its two sides.

#![allow(dead_code)]

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use libxensock::SocketOptions;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{Framed, LengthDelimitedCodec, LinesCodec};
use tokio_xensock::{XenListener, XenStream};

/// Listeners in the server's domain, connects from the client's.
pub trait World: Send + Sync + 'static {
    /// Binds `port` in the server's domain (inside a runtime).
    fn bind_with(&self, port: u32, opts: SocketOptions) -> io::Result<XenListener>;
    /// Connects to `port` of the server's domain.
    fn connect(&self, port: u32) -> impl Future<Output = io::Result<XenStream>> + Send + 'static;
    /// Whatever may use tokio's blocking pool once per domain pair (the
    /// user-space transport's first link setup), done beforehand.
    fn prepare(&self);

    fn bind(&self, port: u32) -> io::Result<XenListener> {
        self.bind_with(port, SocketOptions::default())
    }
}

pub async fn echo<W: World>(w: &W, port: u32) {
    let l = w.bind(port).unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = vec![0u8; 4096];
        loop {
            let n = s.read(&mut buf).await.unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).await.unwrap();
        }
    });
    let mut c = w.connect(port).await.unwrap();
    c.write_all(b"hello tokio").await.unwrap();
    let mut got = [0u8; 11];
    c.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"hello tokio");
    c.shutdown().await.unwrap();
    let mut rest = Vec::new();
    c.read_to_end(&mut rest).await.unwrap();
    assert!(rest.is_empty());
    server.await.unwrap();
}

/// The readiness calls of tokio's `TcpStream`: `readable`/`try_read`,
/// `writable`/`try_write`, `take_error`, and `into_std` back to a
/// blocking stream.
pub async fn readiness_and_try_calls<W: World>(w: &W, port: u32) {
    let l = w.bind(port).unwrap();
    let c = w.connect(port).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    let mut buf = [0u8; 64];
    // nothing sent yet
    assert_eq!(
        c.try_read(&mut buf).unwrap_err().kind(),
        std::io::ErrorKind::WouldBlock
    );
    s.writable().await.unwrap();
    let mut sent = 0;
    while sent < 5 {
        match s.try_write(&b"ready"[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => s.writable().await.unwrap(),
            Err(e) => panic!("{e}"),
        }
    }
    let mut got = Vec::new();
    while got.len() < 5 {
        c.readable().await.unwrap();
        match c.try_read(&mut buf) {
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(got, b"ready");
    // peek waits for bytes and leaves them for the read
    let peeker = async {
        let mut p = [0u8; 64];
        let n = c.peek(&mut p).await.unwrap();
        p[..n].to_vec()
    };
    let (peeked, ()) = tokio::join!(peeker, async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        s.writable().await.unwrap();
        assert_eq!(s.try_write(b"p").unwrap(), 1);
    });
    assert_eq!(peeked, b"p");
    c.readable().await.unwrap();
    assert_eq!(c.try_read(&mut buf).unwrap(), 1);
    assert_eq!(&buf[..1], b"p");
    assert!(c.take_error().unwrap().is_none());
    let r = s.ready(tokio::io::Interest::WRITABLE).await.unwrap();
    assert!(r.is_writable(), "{r:?}");
    // back to a blocking stream, as TcpStream::into_std (non-blocking)
    let mut std_c = c.into_std().unwrap();
    std_c.set_nonblocking(false).unwrap();
    drop(s);
    let mut rest = Vec::new();
    std::io::Read::read_to_end(&mut std_c, &mut rest).unwrap();
    assert!(rest.is_empty(), "EOF after the peer closed");
}

/// `port`: nobody listens there.
pub async fn refused<W: World>(w: &W, port: u32) {
    let e = w.connect(port).await.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED));
}

pub async fn split_halves_stream_both_ways_at_once<W: World>(w: &W, port: u32) {
    let l = w.bind(port).unwrap();
    const TOTAL: usize = 8 << 20;
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        // Echo through owned halves in two tasks.
        let (mut r, mut w) = s.into_split();
        let t = tokio::spawn(async move { tokio::io::copy(&mut r, &mut w).await.unwrap() });
        t.await.unwrap()
    });
    let c = w.connect(port).await.unwrap();
    let (mut r, mut w) = c.into_split();
    let writer = tokio::spawn(async move {
        let block: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
        let mut sent = 0;
        while sent < TOTAL {
            // Vectored writes of two slices.
            let (x, y) = block.split_at(1000);
            let n = w
                .write_vectored(&[std::io::IoSlice::new(x), std::io::IoSlice::new(y)])
                .await
                .unwrap();
            assert!(n > 0);
            sent += n;
            if n < block.len() {
                w.write_all(&block[n..]).await.unwrap();
                sent += block.len() - n;
            }
        }
        drop(w); // shuts the write direction down
        sent
    });
    let mut got = 0usize;
    let mut buf = vec![0u8; 65536];
    let mut pos = 0u32;
    loop {
        let n = r.read(&mut buf).await.unwrap();
        if n == 0 {
            break;
        }
        for &b in &buf[..n] {
            assert_eq!(b, ((pos % 65536) * 7) as u8);
            pos += 1;
        }
        got += n;
    }
    let sent = writer.await.unwrap();
    assert_eq!(got, sent);
    assert_eq!(server.await.unwrap(), sent as u64);
}

/// Lines on `port`, length-delimited frames larger than the ring on `port + 1`.
pub async fn framed_codecs_and_incoming_stream<W: World>(w: &W, port: u32) {
    let l = w.bind(port).unwrap();
    let server = tokio::spawn(async move {
        let mut incoming = l.incoming();
        for _ in 0..2 {
            let s = incoming.next().await.unwrap().unwrap();
            tokio::spawn(async move {
                let mut f = Framed::new(s, LinesCodec::new());
                while let Some(line) = f.next().await {
                    let line = line.unwrap();
                    f.send(line.to_uppercase()).await.unwrap();
                }
            });
        }
    });
    for i in 0..2 {
        let s = w.connect(port).await.unwrap();
        let mut f = Framed::new(s, LinesCodec::new());
        for j in 0..100 {
            f.send(format!("line {i} {j}")).await.unwrap();
            assert_eq!(f.next().await.unwrap().unwrap(), format!("LINE {i} {j}"));
        }
    }
    server.await.unwrap();

    // Length-delimited frames, larger than the ring.
    let l = w.bind(port + 1).unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut f = Framed::new(s, LengthDelimitedCodec::new());
        let mut n = 0;
        while let Some(frame) = f.next().await {
            let frame = frame.unwrap();
            assert!(frame.iter().all(|&b| b == frame.len() as u8));
            n += 1;
        }
        n
    });
    let s = w.connect(port + 1).await.unwrap();
    let mut f = Framed::new(s, LengthDelimitedCodec::new());
    for len in [1usize, 100, 5000, 300_000, 1 << 20, 7] {
        f.send(Bytes::from(vec![len as u8; len])).await.unwrap();
    }
    SinkExt::<Bytes>::close(&mut f).await.unwrap();
    drop(f);
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(20), server)
            .await
            .unwrap()
            .unwrap(),
        6
    );
}

#[path = "../../../examples/rust/hyper_http1.rs"]
mod hyper_http1;

/// The hyper HTTP/1 example's server and client (examples/hyper_http1.rs)
/// over a connection of this world.
pub async fn hyper_http1_serves_requests<W: World>(w: &W, port: u32) {
    let l = w.bind(port).unwrap();
    let c = w.connect(port).await.unwrap();
    let bodies = hyper_http1::exchange(l, c, 5).await.unwrap();
    assert_eq!(bodies.len(), 5);
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(
            b,
            &format!("hello over xensock: /item/{i} ({} bytes)", i * 1000)
        );
    }
}

/// Many connects in flight at once on one runtime thread: the handshake is
/// a non-blocking connect completed through the stream's descriptor, so
/// every task gets to send its request before the first answer is in. A
/// connect that blocked the thread (or ran one at a time on the blocking
/// pool) would never have two in flight, and would start blocking-pool
/// threads.
pub fn concurrent_connects_on_a_current_thread_runtime<W: World>(w: W, port: u32) {
    let n = 64;
    w.prepare();
    let w = Arc::new(w);
    let blocking_threads = Arc::new(AtomicUsize::new(0));
    let started = blocking_threads.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(move || {
            started.fetch_add(1, Ordering::Relaxed);
        })
        .build()
        .unwrap();
    let (max_in_flight, echoed) = rt.block_on(async {
        let l = w
            .bind_with(
                port,
                SocketOptions {
                    backlog: Some(n + 1),
                    ..Default::default()
                },
            )
            .unwrap();
        let server = tokio::spawn(async move {
            let mut served = Vec::new();
            for _ in 0..n {
                let (mut s, _) = l.accept().await.unwrap();
                served.push(tokio::spawn(async move {
                    let mut b = [0u8; 4];
                    s.read_exact(&mut b).await.unwrap();
                    s.write_all(&b).await.unwrap();
                }));
            }
            for t in served {
                t.await.unwrap();
            }
        });
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let mut clients = Vec::new();
        for i in 0..n as u32 {
            let (in_flight, max) = (in_flight.clone(), max.clone());
            let connect = w.connect(port);
            clients.push(tokio::spawn(async move {
                in_flight.fetch_add(1, Ordering::SeqCst);
                let mut s = tokio::time::timeout(Duration::from_secs(10), connect)
                    .await
                    .expect("connect timed out")
                    .unwrap();
                max.fetch_max(in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
                in_flight.fetch_sub(1, Ordering::SeqCst);
                s.write_all(&i.to_le_bytes()).await.unwrap();
                let mut b = [0u8; 4];
                s.read_exact(&mut b).await.unwrap();
                u32::from_le_bytes(b) == i
            }));
        }
        let mut echoed = 0;
        for c in clients {
            echoed += usize::from(c.await.unwrap());
        }
        server.await.unwrap();
        (max.load(Ordering::SeqCst), echoed)
    });
    assert_eq!(echoed, n, "every connection carries its own bytes");
    assert!(
        max_in_flight > 1,
        "connects ran one at a time (at most {max_in_flight} in flight)"
    );
    assert_eq!(
        blocking_threads.load(Ordering::Relaxed),
        0,
        "a connect used tokio's blocking pool"
    );
}

/// A task whose reads and writes all succeed at once still lets the other
/// tasks of its runtime run: each operation takes a unit of tokio's
/// cooperative budget, as tokio's own sockets do. Without it a writer that
/// never met a full buffer never returned `Pending` and held its worker
/// (on a multi-thread runtime with the I/O driver and the timers: the lab's
/// tokio stream on the TCP carrier).
/// Run on a current-thread runtime, where nothing else can take over.
pub async fn writes_that_never_block_leave_room_for_other_tasks<W: World>(w: &W, port: u32) {
    const WRITES: usize = 1000;
    let l = w.bind(port).unwrap();
    let server = tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut got = Vec::new();
        s.read_to_end(&mut got).await.unwrap();
        got.len()
    });
    let mut c = w.connect(port).await.unwrap();
    let ticks = Arc::new(AtomicUsize::new(0));
    let t = ticks.clone();
    let ticker = tokio::spawn(async move {
        loop {
            t.fetch_add(1, Ordering::Relaxed);
            tokio::task::yield_now().await;
        }
    });
    let before = ticks.load(Ordering::Relaxed);
    // 1000 bytes in one-byte writes: far less than any ring or buffer, so
    // none of them has to wait
    for _ in 0..WRITES {
        c.write_all(b"x").await.unwrap();
    }
    let during = ticks.load(Ordering::Relaxed) - before;
    ticker.abort();
    c.shutdown().await.unwrap();
    assert_eq!(server.await.unwrap(), WRITES);
    assert!(
        during > 0,
        "no other task ran during {WRITES} writes that did not have to wait"
    );
}
