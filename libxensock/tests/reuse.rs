// SPDX-License-Identifier: MIT OR Apache-2.0
//! Rings kept across connections on a link (docs/protocol.md 6.6): a
//! connect on a warm link costs no grant, map or unmap, a new connection
//! never sees an old one's bytes, and a peer without the feature (as the
//! kernel module today) gets the old behaviour.

mod common;
mod pattern;

use std::io::{Read, Write};
use std::time::Duration;

use common::*;
use libxensock::{LinkStatus, SocketOptions, Transport};
use xensock_sim::{DomainConfig, SimHost};

fn link(t: &Transport) -> LinkStatus {
    t.status().links.into_iter().next().expect("a link")
}

fn idle(p: &Pair) -> bool {
    p.a.status().connections.is_empty() && p.b.status().connections.is_empty()
}

#[test]
fn a_warm_link_reuses_rings_and_no_bytes_leak_between_connections() {
    let p = pair();
    let l = p.b.bind("xen:self:7100").unwrap();
    let addr = (u32::from(p.db.domid), 7100);
    let mut warm = None;
    for i in 0u32..20 {
        let mut c = p.a.connect(addr).unwrap();
        let (mut s, _) = l.accept().unwrap();
        // The first bytes each side reads are this connection's.
        c.write_all(&i.to_le_bytes()).unwrap();
        s.write_all(&(!i).to_le_bytes()).unwrap();
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), i, "connection {i}: stale bytes");
        c.read_exact(&mut b).unwrap();
        assert_eq!(u32::from_le_bytes(b), !i, "connection {i}: stale bytes");
        // Bytes left unread in both rings when the connection closes.
        c.write_all(b"left in b's ring").unwrap();
        s.write_all(b"left in a's ring").unwrap();
        drop(c);
        drop(s);
        // Both rings back in their owners' pools, each mapping kept.
        assert!(eventually(Duration::from_secs(5), || {
            let (la, lb) = (link(&p.a), link(&p.b));
            idle(&p)
                && la.pooled_rings >= 1
                && lb.pooled_rings >= 1
                && la.lent_rings == 0
                && lb.lent_rings == 0
        }));
        let (la, lb) = (link(&p.a), link(&p.b));
        assert!(la.ring_reuse && lb.ring_reuse);
        let st = p.host.stats();
        let now = (st.grants, st.mappings, la.pooled_rings, lb.pooled_rings);
        match warm {
            None => warm = Some(now),
            // Nothing new granted or mapped once the link is warm.
            Some(w) => assert_eq!(now, w, "connection {i}: {st:?}"),
        }
    }
    drop(l);
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
fn a_peer_without_the_feature_gets_rings_released_at_close() {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let old = libxensock::Config {
        ring_reuse: false,
        ..config()
    };
    let a = Transport::sim_with(host.dir(), da.domid, old).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, config()).unwrap();
    let l = b.bind("xen:self:7101").unwrap();
    let addr = (u32::from(db.domid), 7101);
    for i in 0u32..5 {
        let mut c = a.connect(addr).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(&i.to_le_bytes()).unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
        assert_eq!(u32::from_le_bytes(buf), i);
        drop(c);
        drop(s);
        // Only the two link pages stay granted and mapped.
        assert!(
            eventually(Duration::from_secs(5), || {
                let st = host.stats();
                a.status().connections.is_empty()
                    && b.status().connections.is_empty()
                    && st.grants == 2
                    && st.deferred_grants == 0
                    && st.mappings == 2
            }),
            "{:?}",
            host.stats()
        );
        for t in [&a, &b] {
            let l = link(t);
            assert!(!l.ring_reuse);
            assert_eq!((l.pooled_rings, l.lent_rings, l.kept_mappings), (0, 0, 0));
        }
    }
}

#[test]
fn pools_are_bounded_and_retired_rings_are_unmapped() {
    let p = pair();
    let small = SocketOptions {
        recv_buffer: Some(2048),
        backlog: Some(64),
    };
    let l = p.b.bind_with("xen:self:7102", small).unwrap();
    let addr = (u32::from(p.db.domid), 7102);
    let mut keep = Vec::new();
    for _ in 0..20 {
        let c = p.a.connect_with(addr, None, small).unwrap();
        let (s, _) = l.accept().unwrap();
        keep.push((c, s));
    }
    drop(keep);
    // At most 8 idle rings per order on each side; the rest were retired
    // and the peer unmapped them: every mapping left is a link page or a
    // kept ring.
    assert!(
        eventually(Duration::from_secs(5), || {
            let (la, lb) = (link(&p.a), link(&p.b));
            idle(&p)
                && la.lent_rings == 0
                && lb.lent_rings == 0
                && la.pooled_rings == 8
                && lb.pooled_rings == 8
                && la.kept_mappings == 8
                && lb.kept_mappings == 8
                && p.host.stats().mappings == 2 + 16
                && p.host.stats().deferred_grants == 0
        }),
        "a {:?} b {:?} {:?}",
        link(&p.a),
        link(&p.b),
        p.host.stats()
    );
}

/// On a reuse link a close sends its `Close` without a kick unless the peer
/// sleeps on a ring; a peer that does sleep must still see the end at
/// once: a reader blocked on a connection that never carried a byte gets
/// EOF, a writer blocked on a full ring gets EPIPE.
#[test]
fn a_blocked_peer_sees_the_close_of_a_reuse_connection() {
    let p = pair();
    let small = SocketOptions {
        recv_buffer: Some(2048),
        backlog: Some(4),
    };
    let l = p.b.bind_with("xen:self:7103", small).unwrap();
    let addr = (u32::from(p.db.domid), 7103);
    for round in 0..3 {
        // Reader blocked on a fresh connection; the other end closes.
        let c = p.a.connect_with(addr, None, small).unwrap();
        let (s, _) = l.accept().unwrap();
        let reader = std::thread::spawn(move || {
            let mut b = [0u8; 16];
            (&s).read(&mut b).map(|n| (n, s))
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(c);
        let (n, s) = reader.join().unwrap().unwrap();
        assert_eq!(n, 0, "round {round}: EOF");
        drop(s);

        // Writer blocked on the peer's full ring; the reader closes.
        let c = p.a.connect_with(addr, None, small).unwrap();
        let (s, _) = l.accept().unwrap();
        let writer = std::thread::spawn(move || {
            let chunk = [7u8; 1024];
            loop {
                if let Err(e) = (&c).write(&chunk) {
                    return e.raw_os_error();
                }
            }
        });
        std::thread::sleep(Duration::from_millis(20));
        drop(s);
        assert_eq!(writer.join().unwrap(), Some(libc::EPIPE), "round {round}");
        assert!(link(&p.a).ring_reuse);
    }
}
