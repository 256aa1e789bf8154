// SPDX-License-Identifier: MIT OR Apache-2.0
//! The backend-independent behaviour cases of `cases/` (the bodies
//! `basic.rs` runs on the simulated host) over the kernel family: with
//! `af_xen.ko` loaded, every socket is an AF_XEN socket and both ends live
//! in this domain (the module's loopback connections: both rings in local
//! memory, the same socket calls and errno paths as across domains).
//!
//! Every test is `#[ignore]`d: it needs the module, which only the lab has.
//! `tests/lab/kmod-rust` runs this binary in domu2 with `--ignored
//! --test-threads=1` and reports each test as `@@RESULT kfam-<name>`. Run by
//! hand where `af_xen.ko` is loaded:
//! `cargo test -p libxensock --test kernel_family -- --ignored --test-threads=1`.

mod cases;
mod pattern;

use std::io;
use std::time::Duration;

use cases::{eventually, World};
use libxensock::{BackendKind, SockAddrXen, SocketOptions, XenListener, XenStream};

/// Both sides in this domain, over the kernel family.
struct KernelWorld {
    me: u32,
    start: Stats,
}

/// The module's resource counters (/proc/net/af_xen_stats).
#[derive(Debug, PartialEq, Eq, Default, Clone, Copy)]
struct Stats {
    sockets: i64,
    grants: i64,
    maps: i64,
}

fn stats() -> Stats {
    let text = std::fs::read_to_string("/proc/net/af_xen_stats").expect("af_xen_stats");
    let mut s = Stats::default();
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let (Some(k), Some(v)) = (it.next(), it.next().and_then(|v| v.parse().ok())) else {
            continue;
        };
        match k {
            "sockets" => s.sockets = v,
            "grants" => s.grants = v,
            "maps" => s.maps = v,
            _ => {}
        }
    }
    s
}

fn kernel() -> KernelWorld {
    let report = libxensock::backend();
    assert_eq!(
        report.kind,
        BackendKind::Kernel,
        "af_xen.ko is not loaded: {report}"
    );
    // our domid, as the module reports it for a bound socket
    let probe = XenListener::bind((libxensock::DOMID_SELF, libxensock::PORT_ANY)).unwrap();
    let me = probe.local_addr().unwrap().domid;
    drop(probe);
    KernelWorld { me, start: stats() }
}

impl World for KernelWorld {
    fn server_domid(&self) -> u32 {
        self.me
    }
    fn client_domid(&self) -> u32 {
        self.me
    }
    fn bind_to(&self, addr: SockAddrXen, opts: SocketOptions) -> io::Result<XenListener> {
        XenListener::bind_with(addr, opts)
    }
    fn connect_with(&self, addr: SockAddrXen, opts: SocketOptions) -> io::Result<XenStream> {
        XenStream::connect_with(addr, opts)
    }
    fn connect_nonblocking(&self, addr: SockAddrXen) -> io::Result<XenStream> {
        XenStream::connect_nonblocking(addr, SocketOptions::default())
    }
    fn connect_ready_events(&self) -> i16 {
        libc::POLLOUT
    }
    fn rejected(&self) -> Option<u64> {
        None
    }
    fn connect_error_sticky(&self) -> bool {
        false
    }
    fn loopback(&self) -> bool {
        true
    }
    fn released(self) -> Result<(), String> {
        let want = self.start;
        if eventually(Duration::from_secs(5), || stats() == want) {
            Ok(())
        } else {
            Err(format!(
                "module counters {:?}, at the start {:?}",
                stats(),
                want
            ))
        }
    }
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn echo_across_domains() {
    cases::echo(kernel(), 7000);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn many_small_writes_and_partial_reads() {
    cases::many_small_writes_and_partial_reads(kernel(), 7002);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn bidirectional_checksummed_transfer() {
    cases::bidirectional_checksummed_transfer(kernel(), 7003, 32 << 20);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn half_close() {
    cases::half_close(kernel(), 7004);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn peek_leaves_the_bytes_for_the_next_read() {
    cases::peek_leaves_the_bytes_for_the_next_read(kernel(), 7011);
}

/// Descriptors in and out: a listener and a stream given up as sockets
/// and taken back work on; a TCP socket, or a stream where a listener is
/// wanted, is refused saying what it is.
#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn sockets_made_elsewhere_become_streams_and_listeners() {
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    let w = kernel();
    let l = w.bind(7013).unwrap();
    let l = XenListener::try_from(l.into_fd().unwrap()).unwrap();
    let c = XenStream::connect(w.addr(7013)).unwrap();
    let c = XenStream::try_from(c.into_fd().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    (&c).write_all(b"adopted").unwrap();
    let mut got = [0u8; 7];
    (&s).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"adopted");
    let e = XenListener::try_from(s.into_fd().unwrap()).unwrap_err();
    assert!(e.to_string().contains("not a listening socket"), "{e}");
    let tcp = OwnedFd::from(std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let e = XenStream::try_from(tcp).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().starts_with("not an AF_XEN socket"), "{e}");
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn linger_zero_resets_the_peer() {
    cases::linger_zero_resets_the_peer(kernel(), 7012);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn shutdown_read_makes_peer_writes_fail_with_epipe() {
    cases::shutdown_read_makes_peer_writes_fail_with_epipe(kernel(), 7005);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn close_gives_eof_then_epipe() {
    cases::close_gives_eof_then_epipe(kernel(), 7006);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn a_cloned_listener_accepts_and_the_last_handle_closes_it() {
    cases::a_cloned_listener_accepts_and_the_last_handle_closes_it(kernel(), 41);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn connect_to_a_port_nobody_listens_on_is_refused() {
    cases::connect_to_a_port_nobody_listens_on_is_refused(kernel(), 9);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn bad_addresses_are_einval() {
    cases::bad_addresses_are_einval(kernel());
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn port_in_use_and_any_port() {
    let w = kernel();
    // a domain that is not this one
    let other = if w.me == 1 { 2 } else { 1 };
    cases::port_in_use_and_any_port(w, 7007, other);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn listener_backlog_full_refuses() {
    cases::listener_backlog_full_refuses(kernel(), 7008);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn timeouts() {
    cases::timeouts(kernel(), 7009);
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn nonblocking_connect_completes_through_the_descriptor() {
    cases::nonblocking_connect_completes_through_the_descriptor(kernel(), 7010);
}
