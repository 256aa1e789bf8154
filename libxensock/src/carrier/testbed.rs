// SPDX-License-Identifier: MIT OR Apache-2.0
//! Two carrier switches wired together as two domains would be: rings in
//! memfd memory mapped separately by owner and sender, doorbells for event
//! channels, one leg listener per side on loopback TCP.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use xensock_proto::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
use xensock_proto::mem::RawRing;

use crate::carrier::{
    Doorbell, InitialRings, LegListener, LegListenerConfig, NewRing, RingAlloc, RingRegion,
    SharedRing, Switch, SwitchConfig,
};

pub const A_ID: u32 = 11;
pub const B_ID: u32 = 22;
pub const COOKIE: u64 = 0x5eed_c00c_1e00_0001;

pub fn identity(owner: u32, peer: u32, conn_id: u32, epoch: u32) -> RingIdentity {
    RingIdentity {
        magic: 0,
        order: 0,
        owner_domid: owner,
        peer_domid: peer,
        conn_id,
        epoch,
    }
}

pub fn alloc(order: u32, owner: u32, peer: u32, conn_id: u32) -> RingAlloc {
    Box::new(move |epoch| MemfdRing::new_ring(order, identity(owner, peer, conn_id, epoch)))
}

pub struct Pair {
    pub a: Arc<Switch>,
    pub b: Arc<Switch>,
    #[cfg_attr(not(test), allow(dead_code))]
    pub la: Arc<LegListener>,
    #[cfg_attr(not(test), allow(dead_code))]
    pub lb: Arc<LegListener>,
}

pub struct PairOptions {
    pub order: u32,
    pub ip: IpAddr,
    pub on_ring: bool,
    pub peer_lost_after: Duration,
    /// Once set, B's mapping of the ring it writes is stale, as after a
    /// save of B that found it holding the mapping.
    pub b_suspended: Option<Arc<AtomicBool>>,
}

impl Default for PairOptions {
    fn default() -> Self {
        PairOptions {
            order: 12,
            ip: "127.0.0.1".parse().unwrap(),
            on_ring: true,
            peer_lost_after: Duration::from_secs(20),
            b_suspended: None,
        }
    }
}

pub fn listener(ip: IpAddr) -> Arc<LegListener> {
    Arc::new(LegListener::bind(ip, LegListenerConfig::default()).unwrap())
}

/// Switches A (id 11, domain 1) and B (id 22, domain 2).
pub fn pair(opts: &PairOptions) -> io::Result<Pair> {
    let la = listener(opts.ip);
    let lb = listener(opts.ip);
    pair_on(opts, la, lb, A_ID, B_ID)
}

pub fn pair_on(
    opts: &PairOptions,
    la: Arc<LegListener>,
    lb: Arc<LegListener>,
    a_id: u32,
    b_id: u32,
) -> io::Result<Pair> {
    let (da, db) = (Doorbell::new()?, Doorbell::new()?);
    let (rings_a, rings_b) = if opts.on_ring {
        // A -> B ring: B owns it; B -> A ring: A owns it.
        let ab = MemfdRing::new_ring(opts.order, identity(2, 1, b_id, 0))?;
        let ba = MemfdRing::new_ring(opts.order, identity(1, 2, a_id, 0))?;
        (
            Some(InitialRings {
                rx: ba.local,
                tx: ab.for_peer,
            }),
            Some(InitialRings {
                rx: ab.local,
                tx: match &opts.b_suspended {
                    Some(flag) => Arc::new(StaleOnce {
                        ring: ba.for_peer,
                        suspended: flag.clone(),
                    }),
                    None => ba.for_peer,
                },
            }),
        )
    } else {
        (None, None)
    };
    let mut ca = SwitchConfig::new(a_id, b_id, COOKIE, Some(lb.local_addr()));
    ca.peer_lost_after = opts.peer_lost_after;
    let mut cb = SwitchConfig::new(b_id, a_id, COOKIE, Some(la.local_addr()));
    cb.peer_lost_after = opts.peer_lost_after;
    let kick_b = db.clone();
    let kick_a = da.clone();
    let a = Switch::start(
        ca,
        rings_a,
        la.clone(),
        da,
        Arc::new(move || kick_b.ring()),
        alloc(opts.order, 1, 2, a_id),
    )?;
    let b = Switch::start(
        cb,
        rings_b,
        lb.clone(),
        db,
        Arc::new(move || kick_a.ring()),
        alloc(opts.order, 2, 1, b_id),
    )?;
    Ok(Pair {
        a: Arc::new(a),
        b: Arc::new(b),
        la,
        lb,
    })
}

/// A mapping that goes stale when its guest is suspended with it.
struct StaleOnce {
    ring: SharedRing,
    suspended: Arc<AtomicBool>,
}

impl RingRegion for StaleOnce {
    fn ring(&self) -> RawRing {
        self.ring.ring()
    }

    fn stale(&self) -> bool {
        self.suspended.load(Ordering::Acquire)
    }
}

pub(crate) use crate::sys::memfd::MemfdRing;

impl RingRegion for MemfdRing {
    fn ring(&self) -> RawRing {
        MemfdRing::ring(self)
    }
}

impl MemfdRing {
    /// A fresh ring of `order` with `identity` written by the owner, as
    /// the owner's and the sender's views.
    pub(crate) fn new_ring(order: u32, identity: RingIdentity) -> io::Result<NewRing> {
        let geometry = RingGeometry::new(order)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let (local, peer) = MemfdRing::pair(geometry)?;
        local.ring().header().init(&RingIdentity {
            magic: DATA_RING_MAGIC,
            order,
            ..identity
        });
        Ok(NewRing {
            local: Arc::new(local),
            for_peer: Arc::new(peer),
        })
    }
}
