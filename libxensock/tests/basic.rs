//! Core behaviour across two simulated domains.

mod common;

use std::io::{Read, Write};
use std::net::Shutdown;
use std::thread;
use std::time::Duration;

use common::*;
use libxensock::{SockAddrXen, SocketOptions};

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
