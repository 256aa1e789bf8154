//! tokio-xensock across two simulated domains in one process.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use libxensock::{Config, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{Framed, LengthDelimitedCodec, LinesCodec};
use tokio_xensock::{XenListener, XenStream};
use xensock_sim::{DomainConfig, SimHost};

struct Pair {
    a: Transport,
    b: Transport,
    bid: u32,
    host: SimHost,
}

fn pair() -> Pair {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, Config::default()).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, Config::default()).unwrap();
    Pair {
        a,
        b,
        bid: db.domid.into(),
        host,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo() {
    let p = pair();
    let l = XenListener::bind_on(&p.b, "xen:self:100").unwrap();
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
    let mut c = XenStream::connect_on(&p.a, (p.bid, 100)).await.unwrap();
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

#[tokio::test(flavor = "current_thread")]
async fn refused() {
    let p = pair();
    let e = XenStream::connect_on(&p.a, (p.bid, 9)).await.unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNREFUSED));
    drop(p.host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_halves_stream_both_ways_at_once() {
    let p = pair();
    let l = XenListener::bind_on(&p.b, "xen:self:101").unwrap();
    const TOTAL: usize = 8 << 20;
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        // Echo through owned halves in two tasks.
        let (mut r, mut w) = s.into_split();
        let t = tokio::spawn(async move { tokio::io::copy(&mut r, &mut w).await.unwrap() });
        t.await.unwrap()
    });
    let c = XenStream::connect_on(&p.a, (p.bid, 101)).await.unwrap();
    if std::env::var_os("XS_DEBUG").is_some() {
        let (a, b) = (p.a.clone(), p.b.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_secs(3));
            eprintln!(
                "A {:?}\nB {:?}",
                a.status().connections,
                b.status().connections
            );
        });
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_codecs_and_incoming_stream() {
    let p = pair();
    let l = XenListener::bind_on(&p.b, "xen:self:102").unwrap();
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
        let s = XenStream::connect_on(&p.a, (p.bid, 102)).await.unwrap();
        let mut f = Framed::new(s, LinesCodec::new());
        for j in 0..100 {
            f.send(format!("line {i} {j}")).await.unwrap();
            assert_eq!(f.next().await.unwrap().unwrap(), format!("LINE {i} {j}"));
        }
    }
    server.await.unwrap();

    // Length-delimited frames, larger than the ring.
    let l = XenListener::bind_on(&p.b, "xen:self:103").unwrap();
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
    let s = XenStream::connect_on(&p.a, (p.bid, 103)).await.unwrap();
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
