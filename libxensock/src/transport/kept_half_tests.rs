// SPDX-License-Identifier: MIT OR Apache-2.0
//! A peer that keeps its half of the link across our links, as the kernel
//! module does: its control ring's consumer stands wherever our earlier
//! processes left it, and each new link of ours must go on from there.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xensock_discovery::xs::XsClient;
use xensock_proto::ctrl::{self, Channel, Message};
use xensock_proto::layout::{RingGeometry, LINK_RING_ORDER};
use xensock_proto::link::{node, HalfPath, LinkState, LINK_VERSION};
use xensock_proto::ring::Consumer;
use xensock_sim::{DomainConfig, SimHost, SimXen};
use xensock_xenif::xs_wire::{Perm, PermAccess};
use xensock_xenif::{DomId, XenBackend};

use super::{Config, Transport};
use crate::backend::Dyn;
use crate::rings::{grant_ring, OwnedRing};

/// The module's half of a link: granted once, consumed by the test.
struct KeptHalf {
    _ring: OwnedRing,
    rx: Consumer<xensock_proto::mem::RawRing>,
    _chan: <SimXen as XenBackend>::Channel,
    _xen: Dyn<SimXen>,
}

impl KeptHalf {
    fn advertise(host: &SimHost, me: DomId, peer: DomId) -> KeptHalf {
        let xen = Dyn(SimXen::connect(host.dir(), me).unwrap());
        let geometry = RingGeometry::new(LINK_RING_ORDER).unwrap();
        let ring = grant_ring(&xen, me, peer, geometry, 0, true).unwrap();
        let chan = xen.0.alloc_unbound(peer).unwrap();
        let port = xensock_xenif::EventChannel::local_port(&chan);
        // what the module writes: no generation, no peer-generation
        write_half(host, me, peer, ring.grant.header_ref, port);
        let rx = Consumer::new(ring.ring);
        KeptHalf {
            _ring: ring,
            rx,
            _chan: chan,
            _xen: xen,
        }
    }

    /// Reads whole frames until one is a `ConnectRequest`.
    fn connect_request_arrives(&mut self, within: Duration) -> bool {
        let end = std::time::Instant::now() + within;
        while std::time::Instant::now() < end {
            let mut buf = [0u8; ctrl::MAX_CONTROL_FRAME];
            let got = self.rx.peek(&mut buf).unwrap();
            if got >= ctrl::HEADER_LEN {
                let h = ctrl::decode_header(&buf[..got], Channel::Link).unwrap();
                if got >= h.frame_len() {
                    self.rx.skip(h.frame_len() as u32).unwrap();
                    self.rx.flush();
                    if let Ok((Message::ConnectRequest { .. }, _)) =
                        ctrl::decode(&buf[..h.frame_len()], Channel::Link)
                    {
                        return true;
                    }
                    continue;
                }
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }
}

/// Writes `owner`'s half of its link with `peer` as the module does (no
/// generation, no peer-generation), in a directory only `peer` may read.
fn write_half(host: &SimHost, owner: DomId, peer: DomId, ring_ref: u32, port: u32) {
    let xs = XsClient::open_path(host.domain(owner).unwrap().xenstored_path()).unwrap();
    let half = HalfPath {
        owner: owner.into(),
        peer: peer.into(),
    }
    .to_string();
    xs.mkdir(&half).unwrap();
    xs.set_perms(
        &half,
        &[
            Perm::new(PermAccess::None, u32::from(owner)),
            Perm::new(PermAccess::Read, u32::from(peer)),
        ],
    )
    .unwrap();
    for (name, value) in [
        (node::VERSION, LINK_VERSION.to_string()),
        (node::RING_REF, ring_ref.to_string()),
        (node::EVENT_CHANNEL, port.to_string()),
        (node::STATE, LinkState::Initialised.as_str().to_string()),
    ] {
        xs.write(&format!("{half}/{name}"), value).unwrap();
    }
}

fn config() -> Config {
    Config {
        link_timeout: Duration::from_millis(1500),
        connect_timeout: Duration::from_millis(1000),
        ..Config::default()
    }
}

/// Each process of a domain makes its own link and ends it when it exits;
/// the module on the other side keeps its half and the consumer position
/// of its control ring. A process that wrote that ring from position 0
/// would find it overrun at its first frame and take the link down at
/// once: no connection to the module's guest until the module is
/// reloaded.
#[test]
fn a_process_after_another_reaches_a_peer_that_kept_its_half() {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let mut kept = KeptHalf::advertise(&host, db.domid, da.domid);
    for process in 0..3 {
        let a = Transport::sim_with(host.dir(), da.domid, config()).unwrap();
        // nobody answers: the request is all we look for
        let e = a.connect((u32::from(db.domid), 7)).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ETIMEDOUT), "process {process}");
        assert!(
            kept.connect_request_arrives(Duration::from_secs(5)),
            "process {process}: no ConnectRequest in the kept half's ring"
        );
        let st = a.status();
        assert_eq!(st.links_lost, 0, "process {process}: {st:?}");
        drop(a);
    }
}

/// A peer whose half names a page we cannot map (broken or hostile): the
/// connect fails at once, with a clear log line, and its half is left
/// alone for a while. Retried at every event, each attempt's own half
/// would make the next event: some 500 links made and ended a second.
#[test]
fn a_half_that_cannot_be_attached_is_not_retried_at_once() {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    // a grant reference and port that name nothing
    write_half(&host, db.domid, da.domid, 77, 5);
    // every change to our own half, seen from dom0
    let ours = HalfPath {
        owner: da.domid.into(),
        peer: db.domid.into(),
    }
    .to_string();
    let dom0 = XsClient::open_path(host.dom0().xenstored_path()).unwrap();
    let mut watch = dom0.watch(&ours).unwrap();
    let changes = Arc::new(AtomicUsize::new(0));
    let counted = changes.clone();
    std::thread::spawn(move || {
        while watch.recv().is_ok() {
            counted.fetch_add(1, Ordering::Relaxed);
        }
    });
    let a = Transport::sim_with(host.dir(), da.domid, config()).unwrap();
    let t0 = std::time::Instant::now();
    let e = a.connect((u32::from(db.domid), 7)).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EHOSTUNREACH));
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    std::thread::sleep(Duration::from_millis(500));
    let n = changes.load(Ordering::Relaxed);
    assert!(n < 20, "our half changed {n} times in 0.5 s");
    assert!(a.status().links.is_empty());
}
