//! Issue #7 on the user-space transport: connections survive their
//! domains' migrations on the simulated host (TCP carrier, back to a ring).

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::Duration;

use common::*;
use libxensock::{Carrier, XenStream};
use xensock_sim::MigrateTo;

/// Writes `total` pattern bytes in `chunk`-sized writes, then FIN; returns
/// the checksum of what it wrote.
fn writer(s: XenStream, seed: u64, total: usize, chunk: usize) -> thread::JoinHandle<u64> {
    thread::spawn(move || {
        let mut p = Pattern::new(seed);
        let mut h = FNV_INIT;
        let mut buf = vec![0u8; chunk];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk);
            p.fill(&mut buf[..n]);
            (&s).write_all(&buf[..n]).unwrap();
            fnv(&mut h, &buf[..n]);
            left -= n;
        }
        s.shutdown(Shutdown::Write).unwrap();
        h
    })
}

/// Reads to end of stream; returns (bytes, checksum).
fn reader(s: XenStream) -> thread::JoinHandle<(usize, u64)> {
    thread::spawn(move || {
        let mut h = FNV_INIT;
        let mut got = 0;
        let mut buf = vec![0u8; 50_000];
        loop {
            let n = (&s).read(&mut buf).unwrap();
            if n == 0 {
                return (got, h);
            }
            fnv(&mut h, &buf[..n]);
            got += n;
        }
    })
}

#[test]
fn same_host_migration_moves_to_tcp_and_back() {
    let p = pair();
    let l = p.b.bind("xen:self:7000").unwrap();
    let c = p.a.connect((u32::from(p.db.domid), 7000)).unwrap();
    let (s, _) = l.accept().unwrap();
    let total = 8 << 20;
    let wa = writer(c.try_clone().unwrap(), 1, total, 7000);
    let wb = writer(s.try_clone().unwrap(), 2, total, 9000);
    let ra = reader(c.try_clone().unwrap());
    let rb = reader(s.try_clone().unwrap());
    thread::sleep(Duration::from_millis(20));
    assert_eq!(p.b.suspend(), 1);
    let new = p
        .host
        .migrate_domain(p.db.domid, MigrateTo::SameHost)
        .unwrap()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || p.b.domid() == new));
    let (ha, hb) = (wa.join().unwrap(), wb.join().unwrap());
    let (na, ga) = ra.join().unwrap();
    let (nb, gb) = rb.join().unwrap();
    assert_eq!((na, ga), (total, hb));
    assert_eq!((nb, gb), (total, ha));
    thread::sleep(Duration::from_millis(300));
    for t in [&p.a, &p.b] {
        let st = t.status();
        for c in &st.connections {
            eprintln!("dom{} {} -> {}: {}", st.domid, c.local, c.peer, c.carrier);
        }
        eprintln!(
            "{:?}",
            st.links
                .iter()
                .map(|l| (l.peer, l.up, l.connections))
                .collect::<Vec<_>>()
        );
    }
    let sa = p.a.status();
    let cs = sa
        .connections
        .iter()
        .find(|x| x.carrier != Carrier::Ring)
        .unwrap();
    assert!(cs.carrier.switches() >= 1);
}
