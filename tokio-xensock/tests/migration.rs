// SPDX-License-Identifier: MIT OR Apache-2.0
//! A tokio program keeps running through migrations of either domain
//! an echo server and a client streaming through it, with no
//! code for the moves; the switch to TCP and back is only a pause.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use libxensock::{Config, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_xensock::{XenListener, XenStream};
use xensock_sim::{DomainConfig, MigrateTo, SimHost};

/// A simulated host with domains "a" and "b" and a transport in each (a
/// 5 s bound for a peer that stopped answering).
fn two_domains() -> (SimHost, Transport, Transport) {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let cfg = Config {
        peer_lost_after: Duration::from_secs(5),
        ..Config::default()
    };
    let a = Transport::sim_with(host.dir(), da.domid, cfg.clone()).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, cfg).unwrap();
    (host, a, b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_through_moves() {
    let (host, a, b) = two_domains();
    let host = Arc::new(host);
    let l = XenListener::bind_on(&b, "xen:self:300").unwrap();
    let server = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let (mut r, mut w) = s.into_split();
        tokio::io::copy(&mut r, &mut w).await.unwrap()
    });
    const TOTAL: usize = 6 << 20;
    let c = XenStream::connect_on(&a, (u32::from(b.domid()), 300))
        .await
        .unwrap();
    let (mut r, mut w) = c.into_split();
    let echoed = Arc::new(AtomicUsize::new(0));
    let writer = tokio::spawn(async move {
        let block: Vec<u8> = (0..40_000u32).map(|i| (i * 13 + 1) as u8).collect();
        let mut sent = 0;
        while sent < TOTAL {
            let n = (TOTAL - sent).min(block.len());
            w.write_all(&block[..n]).await.unwrap();
            sent += n;
        }
        w.shutdown().await.unwrap();
    });
    let progress = echoed.clone();
    let (a2, b2) = (a.clone(), b.clone());
    let reader = tokio::spawn(async move {
        let mut buf = vec![0u8; 65536];
        let mut got = 0usize;
        loop {
            let n = match r.read(&mut buf).await {
                Ok(n) => n,
                Err(e) => panic!(
                    "{e} after {got}\nA {:?}\nB {:?}",
                    a2.status().connections,
                    b2.status().connections
                ),
            };
            if n == 0 {
                return got;
            }
            for (i, &x) in buf[..n].iter().enumerate() {
                let pos = (got + i) % 40_000;
                assert_eq!(x, (pos as u32 * 13 + 1) as u8, "byte {}", got + i);
            }
            got += n;
            progress.store(got, Ordering::Relaxed);
        }
    });
    // The moves: B, then A, then B, from outside the runtime (the
    // toolstack's doing), at thirds of the stream.
    let mover = {
        let (a, b, host) = (a.clone(), b.clone(), host.clone());
        std::thread::spawn(move || {
            for (i, t) in [&b, &a, &b].into_iter().enumerate() {
                while echoed.load(Ordering::Relaxed) < (i + 1) * TOTAL / 4 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                t.suspend();
                let new = host
                    .migrate_domain(t.domid(), MigrateTo::SameHost)
                    .unwrap()
                    .unwrap();
                while t.domid() != new {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
        })
    };
    writer.await.unwrap();
    assert_eq!(reader.await.unwrap(), TOTAL);
    assert_eq!(server.await.unwrap(), TOTAL as u64);
    mover.join().unwrap();
    let st = a.status();
    assert!(st.connections.iter().all(|c| c.carrier.switches() >= 3));
}

/// On the TCP carrier, a writer whose peer closes without reading is told
/// so: its pending write ends in an error instead of waiting for a leg
/// nobody watches any more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writer_learns_of_a_peer_that_closed_on_tcp() {
    let (_host, a, b) = two_domains();
    let l = XenListener::bind_on(&b, "xen:self:301").unwrap();
    let mut c = XenStream::connect_on(&a, (u32::from(b.domid()), 301))
        .await
        .unwrap();
    let (s, _) = l.accept().await.unwrap();
    // Both ends leave their rings for the TCP carrier and stay there.
    a.suspend();
    let block = vec![7u8; 65536];
    // Fill the legs (nobody reads), then the peer closes.
    let filled = tokio::time::timeout(Duration::from_millis(500), async {
        loop {
            c.write_all(&block).await.unwrap();
        }
    })
    .await;
    assert!(filled.is_err(), "the writer never had to wait");
    drop(s);
    // (Without the driver watching the closed leg for it, the writer
    // slept about 30 s, until an unrelated deadline woke it.)
    let outcome = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Err(e) = c.write_all(&block).await {
                return e;
            }
        }
    })
    .await;
    let e = outcome.expect("the writer still waits 20 s after its peer closed");
    assert!(
        matches!(e.raw_os_error(), Some(libc::EPIPE) | Some(libc::ECONNRESET)),
        "{e}"
    );
}
