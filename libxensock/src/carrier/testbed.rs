// SPDX-License-Identifier: MIT OR Apache-2.0
//! Two carrier engines wired together as two domains would be: rings in
//! memfd memory mapped separately by owner and sender, doorbells for event
//! channels, one leg listener per side on loopback TCP.

use std::io;
use std::net::IpAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::time::Duration;

use xensock_proto::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
use xensock_proto::mem::RawRing;

use crate::carrier::{
    Doorbell, Engine, EngineConfig, InitialRings, LegListener, LegListenerConfig, NewRing,
    RingAlloc, RingRegion,
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
    Box::new(move |epoch| MemfdRing::pair(order, identity(owner, peer, conn_id, epoch)))
}

pub struct Pair {
    pub a: Arc<Engine>,
    pub b: Arc<Engine>,
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
}

impl Default for PairOptions {
    fn default() -> Self {
        PairOptions {
            order: 12,
            ip: "127.0.0.1".parse().unwrap(),
            on_ring: true,
            peer_lost_after: Duration::from_secs(20),
        }
    }
}

pub fn listener(ip: IpAddr) -> Arc<LegListener> {
    Arc::new(LegListener::bind(ip, LegListenerConfig::default()).unwrap())
}

/// Engines A (id 11, domain 1) and B (id 22, domain 2).
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
        let ab = MemfdRing::pair(opts.order, identity(2, 1, b_id, 0))?;
        let ba = MemfdRing::pair(opts.order, identity(1, 2, a_id, 0))?;
        (
            Some(InitialRings {
                rx: ba.local,
                tx: ab.for_peer,
            }),
            Some(InitialRings {
                rx: ab.local,
                tx: ba.for_peer,
            }),
        )
    } else {
        (None, None)
    };
    let mut ca = EngineConfig::new(a_id, b_id, COOKIE, Some(lb.local_addr()));
    ca.peer_lost_after = opts.peer_lost_after;
    let mut cb = EngineConfig::new(b_id, a_id, COOKIE, Some(la.local_addr()));
    cb.peer_lost_after = opts.peer_lost_after;
    let kick_b = db.clone();
    let kick_a = da.clone();
    let a = Engine::start(
        ca,
        rings_a,
        la.clone(),
        da,
        Arc::new(move || kick_b.ring()),
        alloc(opts.order, 1, 2, a_id),
    )?;
    let b = Engine::start(
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

/// One mapping of a memfd-backed ring.
pub(crate) struct MemfdRing {
    base: NonNull<u8>,
    len: usize,
    ring: RawRing,
}

// SAFETY: the mapping is only accessed through RawRing (atomics and raw
// copies), which is Send + Sync; `base` is only used to unmap on drop.
unsafe impl Send for MemfdRing {}
// SAFETY: as above.
unsafe impl Sync for MemfdRing {}

impl MemfdRing {
    /// A fresh ring of `order` with `identity` written by the owner, mapped
    /// twice: `(owner's view, sender's view)`.
    pub(crate) fn pair(order: u32, identity: RingIdentity) -> io::Result<NewRing> {
        let geometry = RingGeometry::new(order)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        let len = geometry.region_size();
        // SAFETY: the name is a NUL-terminated literal; no other pointers.
        let fd = unsafe { libc::memfd_create(c"xensock-carrier".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor that we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let local = Self::map(&fd, len, geometry)?;
        local.ring.header().init(&RingIdentity {
            magic: DATA_RING_MAGIC,
            order,
            ..identity
        });
        let peer = Self::map(&fd, len, geometry)?;
        Ok(NewRing {
            local: Arc::new(local),
            for_peer: Arc::new(peer),
        })
    }

    fn map(fd: &OwnedFd, len: usize, geometry: RingGeometry) -> io::Result<MemfdRing> {
        // SAFETY: a fresh shared mapping of a memfd of `len` bytes; no
        // existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: the mapping is page aligned, `len` bytes, and unmapped only
        // when this value drops, after every RawRing copy taken from it is
        // gone (holders keep the Arc next to the ring they use); it is only
        // accessed through RawRing.
        let ring = unsafe { RawRing::from_region(base, len, geometry) }
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        Ok(MemfdRing { base, len, ring })
    }
}

impl RingRegion for MemfdRing {
    fn ring(&self) -> RawRing {
        self.ring
    }
}

impl Drop for MemfdRing {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}
