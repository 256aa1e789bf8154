// SPDX-License-Identifier: GPL-2.0
//! One direction of a connection: a proto byte ring with its producer and
//! consumer, and the two sockets to wake. The ring carrier; the loopback
//! variant (both ends in this domain) keeps the ring in local memory, the
//! inter-domain one (not yet) in a page granted by the receiver.

use crate::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
use crate::mem::RawRing;
use crate::ring::{Consumer, PeerEnd, Producer, ReaderEnd, RingError};
use crate::sock::XenSock;
use crate::sys::Region;
use kernel::prelude::*;
use kernel::sync::{Arc, Mutex, SpinLock};
use kernel::{new_mutex, new_spinlock};

pub(crate) struct Ends {
    pub(crate) reader: Option<Arc<XenSock>>,
    pub(crate) writer: Option<Arc<XenSock>>,
}

#[pin_data]
pub(crate) struct Pipe {
    #[pin]
    pub(crate) tx: Mutex<Producer<RawRing>>,
    #[pin]
    pub(crate) rx: Mutex<Consumer<RawRing>>,
    #[pin]
    ends: SpinLock<Ends>,
    pub(crate) order: u32,
    /// Must outlive `tx` and `rx` (declared last: dropped last).
    _region: Region,
}

impl Pipe {
    /// A loopback ring of at least `capacity` bytes (from the reader's SO_RCVBUF).
    pub(crate) fn new_local(capacity: usize, domid: u32, conn_id: u32) -> Result<Arc<Pipe>> {
        let g = RingGeometry::for_capacity(capacity);
        let region = Region::alloc(g.region_size()).ok_or(ENOMEM)?;
        let ring = region.ring(g).ok_or(EINVAL)?;
        ring.header().init(&RingIdentity {
            magic: DATA_RING_MAGIC,
            order: g.order(),
            owner_domid: domid,
            peer_domid: domid,
            conn_id,
            epoch: 0,
        });
        Arc::pin_init(
            pin_init!(Pipe {
                tx <- new_mutex!(Producer::new(ring), "af_xen_tx"),
                rx <- new_mutex!(Consumer::new(ring), "af_xen_rx"),
                ends <- new_spinlock!(Ends { reader: None, writer: None }, "af_xen_ends"),
                order: g.order(),
                _region: region,
            }),
            GFP_KERNEL,
        )
    }

    pub(crate) fn set_ends(&self, reader: Option<Arc<XenSock>>, writer: Option<Arc<XenSock>>) {
        // The old values drop after the lock is released: dropping the last
        // reference of a socket may free rings (vfree), which may sleep.
        let old = {
            let mut e = self.ends.lock();
            (core::mem::replace(&mut e.reader, reader), core::mem::replace(&mut e.writer, writer))
        };
        drop(old);
    }

    /// Forget `xs` as an end (it is closing); breaks the Arc cycle.
    pub(crate) fn detach(&self, xs: &XenSock) {
        let (mut r, mut w) = (None, None);
        {
            let mut e = self.ends.lock();
            if e.reader.as_deref().map(|x| core::ptr::eq(x, xs)).unwrap_or(false) {
                r = e.reader.take();
            }
            if e.writer.as_deref().map(|x| core::ptr::eq(x, xs)).unwrap_or(false) {
                w = e.writer.take();
            }
        }
        // dropped outside the spinlock (see set_ends)
        drop((r, w));
    }

    /// Wake whoever reads this ring (data, FIN or reset arrived). The wake
    /// happens under the ends lock, so the sock cannot be freed meanwhile.
    pub(crate) fn wake_reader(&self, mask: u32) {
        let e = self.ends.lock();
        if let Some(r) = e.reader.as_ref() {
            r.sk.wake(mask);
        }
    }

    pub(crate) fn wake_writer(&self, mask: u32) {
        let e = self.ends.lock();
        if let Some(w) = e.writer.as_ref() {
            w.sk.wake(mask);
        }
    }

    pub(crate) fn capacity(&self) -> u32 {
        1u32 << self.order
    }

    /// (readable bytes, producer's end state), validated by proto.
    pub(crate) fn rx_state(&self) -> core::result::Result<(u32, PeerEnd), RingError> {
        let c = self.rx.lock();
        let n = c.readable()?;
        let end = c.peer_end()?;
        Ok((n, end))
    }

    /// (free bytes, consumer's end state), validated by proto.
    pub(crate) fn tx_state(&self) -> core::result::Result<(u32, ReaderEnd), RingError> {
        let mut p = self.tx.lock();
        let n = p.free_space()?;
        let end = p.reader_end()?;
        Ok((n, end))
    }
}
