// SPDX-License-Identifier: MIT OR Apache-2.0
//! Core behaviour across two simulated domains in one process. The
//! backend-independent cases are the bodies in `cases/` (shared with
//! `kernel_family.rs`, which runs them over `af_xen.ko` in the lab); the
//! rest are about the user-space transport itself.

mod cases;
mod common;
mod pattern;

use std::io;
use std::time::Duration;

use cases::World;
use common::*;
use libxensock::{SockAddrXen, SocketOptions, XenListener, XenStream};

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

/// The two simulated domains of a [`Pair`]: listeners in b, connects from a.
struct SimWorld(Pair);

impl World for SimWorld {
    fn server_domid(&self) -> u32 {
        self.0.db.domid.into()
    }
    fn client_domid(&self) -> u32 {
        self.0.da.domid.into()
    }
    fn bind_to(&self, addr: SockAddrXen, opts: SocketOptions) -> io::Result<XenListener> {
        self.0.b.bind_with(addr, opts)
    }
    fn connect_with(&self, addr: SockAddrXen, opts: SocketOptions) -> io::Result<XenStream> {
        self.0.a.connect_with(addr, None, opts)
    }
    fn connect_nonblocking(&self, addr: SockAddrXen) -> io::Result<XenStream> {
        // only bringing the link up blocks; do it first
        self.0.a.prepare_link(addr.domid, Duration::from_secs(5))?;
        assert!(self.0.a.link_ready(addr.domid));
        self.0.a.connect_nonblocking(addr, SocketOptions::default())
    }
    fn connect_ready_events(&self) -> i16 {
        libc::POLLIN
    }
    fn rejected(&self) -> Option<u64> {
        Some(self.0.b.status().rejected)
    }
    fn connect_error_sticky(&self) -> bool {
        true
    }
    fn loopback(&self) -> bool {
        false
    }
    fn released(self) -> Result<(), String> {
        let Pair { a, b, host, .. } = self.0;
        drop((a, b));
        if eventually(Duration::from_secs(5), || {
            host.stats().grants_and_channels_released()
        }) {
            Ok(())
        } else {
            Err(format!("{:?}", host.stats()))
        }
    }
}

fn sim() -> SimWorld {
    SimWorld(pair())
}

#[test]
fn echo_across_domains() {
    cases::echo(sim(), 7000);
}

#[test]
fn second_connection_reuses_the_link() {
    let p = pair();
    let l = p.b.bind("xen:self:7001").unwrap();
    let addr = (u32::from(p.db.domid), 7001);
    let c1 = p.a.connect(addr).unwrap();
    let _s1 = l.accept().unwrap();
    let ports_before = p.host.stats().ports;
    let c2 = p.a.connect(addr).unwrap();
    let _s2 = l.accept().unwrap();
    // No new event channels: connections are frames on the link.
    assert_eq!(p.host.stats().ports, ports_before);
    assert_ne!(c1.local_addr().unwrap(), c2.local_addr().unwrap());
    assert_eq!(p.a.status().links.len(), 1);
    assert_eq!(p.a.status().connections.len(), 2);
}

/// A stream of the user-space transport has no socket descriptor to hand
/// out; a descriptor that is not an AF_XEN socket does not become one.
#[test]
fn fd_conversions_refuse_what_is_not_an_af_xen_socket() {
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    let p = pair();
    let l = p.b.bind("xen:self:7013").unwrap();
    let c = p.a.connect((u32::from(p.db.domid), 7013)).unwrap();
    let c = c.into_fd().expect_err("a user-space stream has no socket");
    (&c).write_all(b"still works").unwrap();
    let (s, _) = l.accept().unwrap();
    let mut got = [0u8; 11];
    (&s).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still works");
    assert!(l.into_fd().is_err(), "a user-space listener has no socket");
    let tcp = OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let e = XenListener::try_from(tcp).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().starts_with("not an AF_XEN socket"), "{e}");
    let tcp = OwnedFd::from(std::net::UdpSocket::bind("127.0.0.1:0").unwrap());
    let e = XenStream::try_from(tcp).unwrap_err();
    assert!(e.to_string().starts_with("not an AF_XEN socket"), "{e}");
}

#[test]
fn connect_to_an_unknown_domain_is_unreachable_at_once() {
    // With the agent's table, a domid it does not list fails at once, not
    // after the link timeout (a minute here).
    let w = agent_world(libxensock::Config {
        link_timeout: Duration::from_secs(60),
        ..config()
    });
    let t0 = std::time::Instant::now();
    let e = w.pair.a.connect((4000u32, 80)).unwrap_err();
    assert_eq!(errno(&e), libc::EHOSTUNREACH);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    // Nothing was offered, nothing is left behind.
    assert!(w.pair.a.status().links.is_empty());
    // The listed peer is reachable.
    let l = w.pair.b.bind("xen:self:80").unwrap();
    let _c = w.pair.a.connect((u32::from(w.pair.db.domid), 80)).unwrap();
    let _s = l.accept().unwrap();
}

#[test]
fn without_discovery_an_unknown_domain_is_unreachable_after_the_link_timeout() {
    // No agent and no static list: nothing tells that domain 4000 does not
    // exist (guests cannot ask xenstored), so the link timeout decides.
    let p = pair_with(libxensock::Config {
        link_timeout: Duration::from_millis(300),
        ..config()
    });
    let e = p.a.connect((4000u32, 80)).unwrap_err();
    assert_eq!(errno(&e), libc::EHOSTUNREACH);
    // The withdrawn offer leaves nothing behind.
    assert!(p.a.status().links.is_empty());
}

// ---- the shared cases (cases/), over the simulated host ----------------------

#[test]
fn many_small_writes_and_partial_reads() {
    cases::many_small_writes_and_partial_reads(sim(), 7002);
}

#[test]
fn bidirectional_checksummed_transfer() {
    // XENSOCK_TEST_BIG=1 moves 1 GiB each way (use --release).
    let total: u64 = if std::env::var_os("XENSOCK_TEST_BIG").is_some() {
        1 << 30
    } else {
        32 << 20
    };
    cases::bidirectional_checksummed_transfer(sim(), 7003, total);
}

#[test]
fn half_close() {
    cases::half_close(sim(), 7004);
}

#[test]
fn shutdown_read_makes_peer_writes_fail_with_epipe() {
    cases::shutdown_read_makes_peer_writes_fail_with_epipe(sim(), 7005);
}

#[test]
fn peek_leaves_the_bytes_for_the_next_read() {
    cases::peek_leaves_the_bytes_for_the_next_read(sim(), 7011);
}

#[test]
fn linger_zero_resets_the_peer() {
    cases::linger_zero_resets_the_peer(sim(), 7012);
}

#[test]
fn close_gives_eof_then_epipe() {
    cases::close_gives_eof_then_epipe(sim(), 7006);
}

#[test]
fn a_cloned_listener_accepts_and_the_last_handle_closes_it() {
    cases::a_cloned_listener_accepts_and_the_last_handle_closes_it(sim(), 41);
}

#[test]
fn connect_to_a_port_nobody_listens_on_is_refused() {
    cases::connect_to_a_port_nobody_listens_on_is_refused(sim(), 9);
}

#[test]
fn bad_addresses_are_einval() {
    cases::bad_addresses_are_einval(sim());
}

#[test]
fn port_in_use_and_any_port() {
    let w = sim();
    let other = w.client_domid();
    cases::port_in_use_and_any_port(w, 7007, other);
}

#[test]
fn listener_backlog_full_refuses() {
    cases::listener_backlog_full_refuses(sim(), 7008);
}

#[test]
fn timeouts() {
    cases::timeouts(sim(), 7009);
}

#[test]
fn nonblocking_connect_completes_through_the_descriptor() {
    cases::nonblocking_connect_completes_through_the_descriptor(sim(), 7010);
}
