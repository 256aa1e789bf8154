// SPDX-License-Identifier: MIT OR Apache-2.0
//! A hostile peer, as a unit test: the stream's hook that scribbles on the
//! peer's ring exists only in test builds.

use std::io::{Read, Write};
use std::time::Duration;

use crate::{SockAddrXen, Transport};
use xensock_sim::DomainConfig;

fn config() -> crate::Config {
    crate::Config {
        link_timeout: Duration::from_millis(1500),
        ..crate::Config::default()
    }
}

fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn scribbling_peer_resets_only_the_victim_connection() {
    let host = xensock_sim::SimHost::start().unwrap();
    let victim_dom = host.create_domain(DomainConfig::new("victim")).unwrap();
    let hostile_dom = host.create_domain(DomainConfig::new("hostile")).unwrap();
    let other_dom = host.create_domain(DomainConfig::new("other")).unwrap();
    let victim = Transport::sim_with(host.dir(), victim_dom.domid, config()).unwrap();
    let hostile = Transport::sim_with(host.dir(), hostile_dom.domid, config()).unwrap();
    let other = Transport::sim_with(host.dir(), other_dom.domid, config()).unwrap();
    let l = victim.bind("xen:self:8002").unwrap();
    let vaddr = SockAddrXen::new(victim_dom.domid.into(), 8002);
    let bad = hostile.connect(vaddr).unwrap();
    let (mut bad_s, _) = l.accept().unwrap();
    let good = hostile.connect(vaddr).unwrap();
    let (mut good_s, _) = l.accept().unwrap();
    let third = other.connect(vaddr).unwrap();
    let (mut third_s, _) = l.accept().unwrap();

    // The hostile domain moves `prod` of the victim's receive ring far
    // beyond anything it wrote.
    assert!(bad.scribble_peer_ring(128, 0x7fff_0000));
    let mut buf = [0u8; 8];
    let e = bad_s.read(&mut buf).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ECONNRESET));
    assert_eq!(victim.status().ring_errors, 1);
    // The hostile side learns about it.
    assert!(eventually(Duration::from_secs(2), || (&bad)
        .write(b"x")
        .is_err()));

    // Everything else still works.
    for (c, s) in [(&good, &mut good_s), (&third, &mut third_s)] {
        let mut c = c;
        c.write_all(b"still fine").unwrap();
        let mut got = [0u8; 10];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"still fine");
        s.write_all(b"back").unwrap();
        let mut got = [0u8; 4];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"back");
    }
    let again = hostile.connect(vaddr).unwrap();
    let (_again_s, _) = l.accept().unwrap();
    drop(again);
    assert_eq!(victim.status().links.len(), 2);
    assert_eq!(victim.status().links_lost, 0);
}
