// SPDX-License-Identifier: MIT OR Apache-2.0
//! Malformed input to the sim's xenstored and control sockets: wrong
//! lengths, missing NULs, huge payloads, unknown types. Every reply must be
//! well-formed, or the connection closed; the daemon must keep serving.

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use proptest::prelude::*;
use xensock_sim::{DomainConfig, SimHost, SimXen};
use xensock_xenif::xs_wire::{Header, MsgType, XsErrno, HEADER_LEN, PAYLOAD_MAX};
use xensock_xenif::{Access, XenBackend};

fn msg(ty: u32, req: u32, tx: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Header {
        msg_type: ty,
        req_id: req,
        tx_id: tx,
        len: payload.len() as u32,
    }
    .encode()
    .to_vec();
    m.extend_from_slice(payload);
    m
}

/// Sends `bytes`, closes the write side, and parses everything the daemon
/// sends until it closes. Panics on any malformed reply.
fn exchange(sock: &Path, bytes: &[u8]) -> Vec<(Header, Vec<u8>)> {
    let mut s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    // The daemon may close early (oversized header); later writes may fail.
    let _ = s.write_all(bytes);
    let _ = s.shutdown(Shutdown::Write);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let mut replies = Vec::new();
    let mut rest = &out[..];
    while !rest.is_empty() {
        assert!(rest.len() >= HEADER_LEN, "truncated reply header");
        let h = Header::decode(rest[..HEADER_LEN].try_into().unwrap());
        let len = h.len as usize;
        assert!(len <= PAYLOAD_MAX, "oversized reply {h:?}");
        assert!(rest.len() >= HEADER_LEN + len, "truncated reply payload");
        let p = rest[HEADER_LEN..HEADER_LEN + len].to_vec();
        match h.msg_type() {
            Some(MsgType::Error) => assert!(
                XsErrno::from_name(&p).is_some() && p.ends_with(b"\0"),
                "bad error payload {p:?}"
            ),
            Some(MsgType::WatchEvent) => assert_eq!(p.iter().filter(|&&b| b == 0).count(), 2),
            Some(_) => {}
            None => panic!("reply of unknown type {h:?}"),
        }
        replies.push((h, p));
        rest = &rest[HEADER_LEN + len..];
    }
    replies
}

fn alive(sock: &Path) {
    let r = exchange(
        sock,
        &msg(MsgType::Read as u32, 77, 0, b"/local/domain/0/name\0"),
    );
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].0.req_id, 77);
    assert_eq!(r[0].1, b"Domain-0");
}

fn error_of(sock: &Path, ty: u32, tx: u32, payload: &[u8]) -> XsErrno {
    let r = exchange(sock, &msg(ty, 5, tx, payload));
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0.req_id, 5);
    assert_eq!(r[0].0.msg_type(), Some(MsgType::Error), "{r:?}");
    XsErrno::from_name(&r[0].1).unwrap()
}

#[test]
fn specific_malformed_requests_get_the_right_errors() {
    let host = SimHost::start().unwrap();
    let g = host.create_domain(DomainConfig::new("g")).unwrap();
    let s0 = host.dom0().xenstored_path();
    let s1 = g.xenstored_path();
    use MsgType as M;
    let cases: &[(&Path, u32, u32, &[u8], XsErrno)] = &[
        (&s0, 20, 0, b"", XsErrno::NoSys),     // XS_RESTRICT, removed
        (&s0, 23, 0, b"/x\0", XsErrno::NoSys), // past the last type
        (&s0, 0xffff, 0, b"", XsErrno::NoSys), // XS_INVALID
        (&s0, M::WatchEvent as u32, 0, b"/a\0t\0", XsErrno::NoSys),
        (&s0, M::Error as u32, 0, b"EINVAL\0", XsErrno::NoSys),
        (
            &s0,
            M::Read as u32,
            0,
            b"/local/domain/0/name",
            XsErrno::Inval,
        ), // no NUL
        (&s0, M::Read as u32, 0, b"/a\0/b\0", XsErrno::Inval), // two strings
        (&s0, M::Read as u32, 0, b"", XsErrno::Inval),
        (&s0, M::Read as u32, 0, b"/bad path\0", XsErrno::Inval),
        (&s0, M::Read as u32, 0, b"/\xff\xfe\0", XsErrno::Inval),
        (&s0, M::Write as u32, 0, b"/no-nul-at-all", XsErrno::Inval),
        (&s0, M::Watch as u32, 0, b"/only-path\0", XsErrno::Inval),
        (
            &s0,
            M::Unwatch as u32,
            0,
            b"/not\0watched\0",
            XsErrno::NoEnt,
        ),
        (&s0, M::SetPerms as u32, 0, b"/local\0", XsErrno::Inval),
        (&s0, M::SetPerms as u32, 0, b"/local\0x5\0", XsErrno::Inval),
        (&s0, M::SetPerms as u32, 0, b"@nosuch\0n0\0", XsErrno::Inval),
        (&s0, M::TransactionEnd as u32, 0, b"T\0", XsErrno::NoEnt),
        (&s0, M::TransactionEnd as u32, 99, b"X\0", XsErrno::NoEnt),
        (&s0, M::Read as u32, 12345, b"/local\0", XsErrno::NoEnt), // unknown tx
        (&s0, M::TransactionStart as u32, 0, b"", XsErrno::Inval),
        (
            &s0,
            M::Introduce as u32,
            0,
            b"5\x00123\x001\x00",
            XsErrno::NoSys,
        ),
        (
            &s1,
            M::Introduce as u32,
            0,
            b"5\x00123\x001\x00",
            XsErrno::Acces,
        ),
        (&s1, M::Control as u32, 0, b"print\0", XsErrno::Acces),
        (&s1, M::IsDomainIntroduced as u32, 0, b"0\0", XsErrno::Acces),
        (
            &s1,
            M::SetPerms as u32,
            0,
            b"@releaseDomain\0r1\0",
            XsErrno::Acces,
        ),
        (&s1, M::Rm as u32, 0, b"/\0", XsErrno::Acces),
        (&s0, M::Rm as u32, 0, b"/\0", XsErrno::Inval),
    ];
    for (sock, ty, tx, p, want) in cases {
        assert_eq!(
            error_of(sock, *ty, *tx, p),
            *want,
            "type {ty} tx {tx} payload {p:?}"
        );
    }
    // A reply larger than the maximum is refused with E2BIG.
    let mut big = b"/big\0".to_vec();
    big.extend(std::iter::repeat_n(b'x', PAYLOAD_MAX - big.len()));
    let r = exchange(&s0, &msg(M::Write as u32, 1, 0, &big));
    assert_eq!(r[0].0.msg_type(), Some(M::Write));
    let names: Vec<u8> = (0..200)
        .flat_map(|i| format!("/d/{i:0>40}\0").into_bytes())
        .collect();
    for chunk in names.split_inclusive(|&b| b == 0) {
        exchange(&s0, &msg(M::Mkdir as u32, 1, 0, chunk));
    }
    assert_eq!(
        error_of(&s0, M::Directory as u32, 0, b"/d\0"),
        XsErrno::TooBig
    );
    // ...and DIRECTORY_PART still lists it, in chunks.
    let r = exchange(&s0, &msg(M::DirectoryPart as u32, 1, 0, b"/d\x000\x00"));
    assert_eq!(r[0].0.msg_type(), Some(M::DirectoryPart));
    alive(&s0);
}

#[test]
fn oversized_length_closes_the_connection_only() {
    let host = SimHost::start().unwrap();
    let s = host.dom0().xenstored_path();
    let mut m = msg(MsgType::Read as u32, 1, 0, b"");
    m[12..16].copy_from_slice(&((PAYLOAD_MAX as u32) + 1).to_ne_bytes());
    // No reply, connection closed, even with a valid request behind it.
    m.extend(msg(MsgType::Read as u32, 2, 0, b"/local\0"));
    assert!(exchange(&s, &m).is_empty());
    let mut huge = msg(MsgType::Write as u32, 1, 0, b"");
    huge[12..16].copy_from_slice(&u32::MAX.to_ne_bytes());
    assert!(exchange(&s, &huge).is_empty());
    alive(&s);
}

#[test]
fn truncated_messages_then_eof_are_harmless() {
    let host = SimHost::start().unwrap();
    let s = host.dom0().xenstored_path();
    let full = msg(MsgType::Write as u32, 1, 0, b"/t\0value");
    for cut in 0..full.len() {
        assert!(exchange(&s, &full[..cut]).is_empty(), "cut at {cut}");
    }
    alive(&s);
}

fn arb_message() -> impl Strategy<Value = Vec<u8>> {
    let ty = prop_oneof![0u32..24, any::<u32>()];
    let tx = prop_oneof![Just(0u32), 0u32..4, any::<u32>()];
    let payload = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..64),
        "(/[a-z@]{0,6}){0,4}\0[a-z0-9 ]{0,8}\0?".prop_map(|s| s.into_bytes()),
        proptest::collection::vec(any::<u8>(), 0..5000),
    ];
    // How the header length relates to the payload actually sent.
    let lie = prop_oneof![4 => Just(0i64), 1 => -8i64..8, 1 => Just(1 << 20)];
    (ty, any::<u32>(), tx, payload, lie).prop_map(|(ty, req, tx, p, lie)| {
        let mut m = msg(ty, req, tx, &p);
        let claimed = (p.len() as i64 + lie).clamp(0, u32::MAX as i64) as u32;
        m[12..16].copy_from_slice(&claimed.to_ne_bytes());
        m
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn random_message_sequences_never_break_xenstored(
        msgs in proptest::collection::vec(arb_message(), 1..6),
        as_guest in any::<bool>(),
    ) {
        let host = HOST.with(|h| h.clone());
        let (sock, dom0) = (
            if as_guest { host.1.clone() } else { host.0.clone() },
            host.0.clone(),
        );
        let bytes: Vec<u8> = msgs.concat();
        exchange(&sock, &bytes);
        alive(&dom0);
    }
}

thread_local! {
    // One host per test thread, shared by the proptest cases.
    static HOST: (std::path::PathBuf, std::path::PathBuf) = {
        let host = Box::leak(Box::new(SimHost::start().unwrap()));
        let g = host.create_domain(DomainConfig::new("fuzz")).unwrap();
        (host.dom0().xenstored_path(), g.xenstored_path())
    };
}

/// Sends raw packets to a control socket.
fn control_packets(path: &Path, packets: &[Vec<u8>]) {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: plain socket(2) call.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    assert!(fd >= 0);
    // SAFETY: sockaddr_un is plain old data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_os_str().as_bytes()) {
        *d = *s as libc::c_char;
    }
    // SAFETY: connect with a valid sockaddr_un of its full size.
    let rc = unsafe {
        libc::connect(
            fd,
            std::ptr::addr_of!(addr).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as u32,
        )
    };
    assert_eq!(rc, 0);
    let mut buf = vec![0u8; 65536];
    for p in packets {
        // SAFETY: sends from a live buffer; reads into a live buffer.
        unsafe {
            libc::send(fd, p.as_ptr().cast(), p.len(), libc::MSG_NOSIGNAL);
            let mut tv = libc::timeval {
                tv_sec: 5,
                tv_usec: 0,
            };
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                std::ptr::addr_of_mut!(tv).cast(),
                std::mem::size_of::<libc::timeval>() as u32,
            );
            libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
        }
    }
    // SAFETY: closing our own descriptor.
    unsafe { libc::close(fd) };
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
    #[test]
    fn random_control_messages_never_break_the_host(
        packets in proptest::collection::vec(
            prop_oneof![
                proptest::collection::vec(any::<u8>(), 0..40),
                (1u32..1000, 1u8..12, proptest::collection::vec(any::<u8>(), 0..40))
                    .prop_map(|(r, op, rest)| {
                        let mut v = r.to_le_bytes().to_vec();
                        v.push(op);
                        v.extend(rest);
                        v
                    }),
            ],
            1..8,
        )
    ) {
        CTL.with(|(host, a, b)| {
            control_packets(&a.control_path(), &packets);
            // Still serving: a grant and a map work.
            let xa = SimXen::connect(host.dir(), a.domid).unwrap();
            let xb = SimXen::connect(host.dir(), b.domid).unwrap();
            let g = xa.grant(b.domid, 1, Access::ReadWrite).unwrap();
            let m = xb.map(a.domid, xensock_xenif::GrantedRegion::refs(&g), Access::ReadOnly).unwrap();
            drop((m, g));
        });
    }
}

thread_local! {
    static CTL: (&'static SimHost, xensock_sim::SimDomain, xensock_sim::SimDomain) = {
        let host: &'static SimHost = Box::leak(Box::new(SimHost::start().unwrap()));
        let a = host.create_domain(DomainConfig::new("a")).unwrap();
        let b = host.create_domain(DomainConfig::new("b")).unwrap();
        (host, a, b)
    };
}
