// SPDX-License-Identifier: MIT OR Apache-2.0
//! tokio streams and listeners through the guest's `xensock daemon`
//! (here served in this process for one simulated domain).

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use libxensock::{BackendKind, Transport};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use xensock_sim::{DomainConfig, SimHost};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_and_listeners_go_through_the_daemon() {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim(host.dir(), da.domid).unwrap();
    let b = Transport::sim(host.dir(), db.domid).unwrap();
    let dir = std::env::temp_dir().join(format!("xensock-daemon-tokio-{}", std::process::id()));
    let sock = dir.join("daemon.sock");
    // the only test of this binary: no other reads the variable
    std::env::set_var(libxensock::daemon::ENV_DAEMON_SOCKET, &sock);
    {
        let (b, sock) = (b.clone(), sock.clone());
        std::thread::spawn(move || libxensock::daemon::serve(&b, &sock));
    }
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < Duration::from_secs(10));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // An echo server of domain a (its own transport).
    let l = tokio_xensock::XenListener::bind_on(&a, "xen:self:5").unwrap();
    tokio::spawn(async move {
        let (mut s, _) = l.accept().await.unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        s.write_all(&buf).await.unwrap();
        s.shutdown().await.unwrap();
    });
    // Domain b's program connects through the daemon.
    let mut s = tokio_xensock::XenStream::connect((u32::from(da.domid), 5))
        .await
        .unwrap();
    assert_eq!(s.peer_addr().unwrap().domid, u32::from(da.domid));
    let data: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
    let (mut r, mut w) = s.split();
    let (_, got) = tokio::join!(
        async {
            w.write_all(&data).await.unwrap();
            w.shutdown().await.unwrap();
        },
        async {
            let mut got = Vec::new();
            r.read_to_end(&mut got).await.unwrap();
            got
        }
    );
    assert!(got == data, "echo through the daemon differs");

    // A listener of b through the daemon; a connects to it.
    let l = tokio_xensock::XenListener::bind("xen:self:6").unwrap();
    assert_eq!(l.local_addr().unwrap().domid, u32::from(db.domid));
    let client = std::thread::spawn(move || {
        let c = a.connect((u32::from(db.domid), 6)).unwrap();
        (&c).write_all(b"through the daemon").unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut back = String::new();
        (&c).read_to_string(&mut back).unwrap();
        back
    });
    let (mut s, _) = l.accept().await.unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    s.write_all(&buf).await.unwrap();
    s.shutdown().await.unwrap();
    assert_eq!(client.join().unwrap(), "through the daemon");
    let std_l = libxensock::XenListener::bind("xen:self:7").unwrap();
    assert_eq!(std_l.backend_kind(), BackendKind::Daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
