// SPDX-License-Identifier: GPL-2.0
//! One direction of a connection (`Pipe`): a proto byte ring with its
//! producer and consumer, and the two sockets to wake. The ring is in local
//! memory (loopback, both ends in this domain), in pages this domain granted
//! (its receive ring) or in the peer's pages mapped here (the ring it
//! writes). The receive ring's size.

use super::{Link, XenSock};
use crate::link::wake::PipeWake;
use crate::proto::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
use crate::proto::mem::RawRing;
use crate::proto::ring::{Consumer, PeerEnd, Producer, ReaderEnd, RingError};
use crate::sys::{CopyRoutine, Grant, GrantedPages, MappedPages, Mapping, Msg, Region, Sk};
use core::sync::atomic::{AtomicU32, Ordering};
use kernel::prelude::*;
use kernel::sync::{Arc, Mutex, SpinLock};
use kernel::{new_mutex, new_spinlock};

pub(crate) struct Ends {
    pub(crate) reader: Option<Arc<XenSock>>,
    pub(crate) writer: Option<Arc<XenSock>>,
}

#[pin_data(PinnedDrop)]
pub(crate) struct Pipe {
    #[pin]
    pub(crate) tx: Mutex<Producer<RawRing>>,
    #[pin]
    pub(crate) rx: Mutex<Consumer<RawRing>>,
    #[pin]
    ends: SpinLock<Ends>,
    pub(crate) order: u32,
    /// The ring's epoch (RingIdentity; 0 at connect and loopback, then the
    /// carrier's next ring): a switch guard names the ring it holds by it.
    pub(crate) epoch: u32,
    /// The ring itself, for copies straight between it and user memory
    /// (`write_msg`, `read_msg`); offsets come from `tx`/`rx`'s counters.
    ring: RawRing,
    /// Inter-domain: the link whose event channel carries this ring's kicks.
    pub(crate) link: Option<Arc<Link>>,
    /// Inter-domain: this ring in the link's wake table (wake.rs).
    wake: Option<Arc<PipeWake>>,
    /// How writes copy user memory into the ring (`XENSOCK_COPY_ROUTINE`,
    /// a `sys::CopyRoutine`; copy_from_iter unless the socket asked).
    copy: AtomicU32,
    /// Must outlive `tx` and `rx` (declared last: dropped last).
    _mem: RingBacking,
}

#[pinned_drop]
impl PinnedDrop for Pipe {
    fn drop(self: Pin<&mut Self>) {
        // out of the interrupt's sight before the ring's memory goes
        if let (Some(l), Some(w)) = (&self.link, &self.wake) {
            l.wake.remove(w);
        }
    }
}

/// Bytes moved per step of sendmsg/recvmsg: each step publishes its bytes
/// (one store of the counter, one kick decision). One 64 KiB write is one
/// step; with rings of 128 KiB and more the peer copies out the previous
/// step while we copy in the next, and under TCG the per-step cost (lock,
/// fence, counter loads) is not negligible against the copy.
const STEP: usize = 64 * 1024;

/// Short names for the data path's cost counters (sys/counters.rs).
mod counters {
    pub(super) use crate::sys::counters::*;
    pub(super) use crate::sys::Timer;
}

/// An event-channel notification for a data ring, counted and timed (the
/// notify is a hypercall: under TCG a trap into emulated Xen).
fn data_kick(l: &Link) {
    let t = counters::Timer::start();
    l.kick();
    counters::add(&counters::DATA_KICKS, 1);
    t.stop(&counters::KICK_NS);
}

/// What one `Pipe::write_msg` step did.
pub(crate) enum Wrote {
    /// this many bytes are in the ring, published
    Bytes(usize),
    /// the ring is full
    Full,
    /// the reader closed (EPIPE) or reset the connection
    Closed,
    Reset,
    /// the user's buffer faulted before any byte was copied
    Fault,
}

/// What one `Pipe::read_msg` step did.
pub(crate) enum Read {
    /// this many bytes went to the user (consumed unless peeking); `short`
    /// if the user's buffer faulted part way
    Bytes(usize, bool),
    /// nothing readable; the producer's end state (read before the counter:
    /// FIN then empty is a true end of stream)
    Empty(PeerEnd),
    /// the producer reset the connection (unread data is dropped)
    Reset,
    /// the connection's switch does not read this ring (it left it, or
    /// reads a newer one), or TCP bytes come first: nothing was read
    /// (the switch decides where to read)
    OffRing,
    /// the switch refused to count bytes taken off the ring (a read after
    /// the switch): the connection must reset, the count is lost
    Untracked,
}

/// Who counts the bytes a ring read takes (the switch, while it carries
/// the direction on this ring: `switch::RingReader`).
pub(crate) trait TakenCount {
    /// Records `n` bytes taken; Err: the count is refused (the connection
    /// must reset).
    fn taken(&mut self, n: usize) -> core::result::Result<(), ()>;
}

/// A ring read's counter, asked under the ring's consumer lock with the
/// ring's epoch.
pub(crate) enum Counted<G> {
    /// nobody counts: the connection only ever reads this ring
    Uncounted,
    /// this one counts, and holds the direction on the ring for the read
    By(G),
    /// the direction is not on this ring (or TCP bytes come first): no read
    Elsewhere,
}

/// The reads of a connection that has no switch count nothing.
pub(crate) enum NoCount {}

impl TakenCount for NoCount {
    fn taken(&mut self, _n: usize) -> core::result::Result<(), ()> {
        match *self {}
    }
}

/// Where a ring's memory lives. The variants only own it: their fields
/// are never read, and dropping them ends the grant or the mapping.
#[allow(dead_code)]
pub(crate) enum RingBacking {
    /// loopback: local memory
    Local(Region),
    /// our receive ring, granted to the peer
    Granted(Grant),
    /// the peer's receive ring, mapped
    Mapped(Mapping),
    /// our large receive ring: header page, directory page, data pages
    GrantedLarge(Grant, Grant, GrantedPages),
    /// the peer's large receive ring: header page, data pages
    MappedLarge(Mapping, MappedPages),
}

/// Largest ring order we grant or map: header page + at most
/// max_map_pages() data pages (proto's MAX_RING_ORDER, 4 MiB).
fn max_order() -> u32 {
    let mut o = 12;
    while (1usize << (o + 1 - 12)) <= crate::sys::max_map_pages()
        && o < crate::proto::layout::MAX_RING_ORDER
    {
        o += 1;
    }
    o
}

/// Receive ring size for a socket: what SO_RCVBUF asked for (the kernel
/// stores twice the requested value, as for every family), or the
/// `default_ring_kib` module parameter when SO_RCVBUF was never set. Rounded
/// up to a power of two and clamped to proto's 2 KiB..4 MiB by
/// `RingGeometry::for_capacity`.
pub(crate) fn rx_ring_capacity(sk: &crate::sys::Sk) -> usize {
    if sk.rcvbuf_locked() {
        sk.rcvbuf().max(0) as usize / 2
    } else {
        crate::sys::default_ring_bytes()
    }
}

/// Receive ring size of an inter-domain connection: as `rx_ring_capacity`,
/// but a stream without SO_RCVBUF gets the `large_ring_kib` ring while this
/// module's grants, that ring's included, stay within `large_ring_grants`
/// (as TCP grows its buffers until tcp_mem says memory is tight): one
/// stream at a time then streams as `SO_RCVBUF` 1 MiB would let it, and
/// 1000 default connections still cost what they did, 34 grants each
/// past the first few. A check, not a reservation: connects racing each
/// other may pass the budget by a ring each, which only makes it soft.
pub(crate) fn remote_rx_ring_capacity(sk: &crate::sys::Sk, stream: bool) -> usize {
    let base = rx_ring_capacity(sk);
    if sk.rcvbuf_locked() || !stream {
        return base;
    }
    let large = crate::sys::large_ring_bytes();
    if large <= base {
        return base;
    }
    let mut g = RingGeometry::for_capacity(large);
    if g.order() > max_order() {
        match RingGeometry::new(max_order()) {
            Ok(m) => g = m,
            Err(_) => return base,
        }
    }
    let granted = crate::sys::counters::GRANTS.load(Ordering::Relaxed).max(0) as usize;
    if granted.saturating_add(g.total_grants()) <= crate::sys::large_ring_grants() {
        large
    } else {
        base
    }
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
        Self::over(ring, g.order(), 0, None, RingBacking::Local(region), None)
    }

    /// The pipe of a ring in `mem` (which must outlive it: the pipe owns it);
    /// inter-domain, `wake` puts the ring in the link's wake table.
    fn over(
        ring: RawRing,
        order: u32,
        epoch: u32,
        link: Option<Arc<Link>>,
        mem: RingBacking,
        wake: Option<Arc<PipeWake>>,
    ) -> Result<Arc<Pipe>> {
        let in_pipe = wake.clone();
        let p = Arc::pin_init(
            pin_init!(Pipe {
                tx <- new_mutex!(Producer::new(ring), "af_xen_tx"),
                rx <- new_mutex!(Consumer::new(ring), "af_xen_rx"),
                ends <- new_spinlock!(Ends { reader: None, writer: None }, "af_xen_ends"),
                order,
                epoch,
                ring,
                link,
                wake: in_pipe,
                copy: AtomicU32::new(CopyRoutine::Iter as u32),
                _mem: mem,
            }),
            GFP_KERNEL,
        )?;
        if let (Some(l), Some(w)) = (&p.link, &wake) {
            l.wake.add(w)?;
        }
        Ok(p)
    }

    /// Our receive ring for a connection with the link's peer, of at least
    /// `capacity` bytes (SO_RCVBUF) up to what the peer can map, granted to
    /// it. Returns the pipe and the RingGrant to announce.
    /// `epoch`: 0 at connect, then the carrier's next ring (migration).
    pub(crate) fn new_granted(
        link: &Arc<Link>,
        me: u32,
        conn_id: u32,
        capacity: usize,
        epoch: u32,
    ) -> Result<(Arc<Pipe>, crate::proto::ctrl::RingGrant)> {
        let mut g = RingGeometry::for_capacity(capacity);
        if g.order() > max_order() {
            g = RingGeometry::new(max_order()).map_err(|_| EINVAL)?;
        }
        let id = RingIdentity {
            magic: DATA_RING_MAGIC,
            order: g.order(),
            owner_domid: me,
            peer_domid: link.peer,
            conn_id,
            epoch,
        };
        let (ring, rg, mem) = if g.is_compact() {
            let grant = Grant::new(link.peer)?;
            let ring = grant.ring(g).ok_or(EINVAL)?;
            let rg = crate::proto::ctrl::RingGrant {
                order: g.order() as u8,
                epoch,
                header_ref: grant.gref,
                dir_ref: 0,
            };
            (ring, rg, RingBacking::Granted(grant))
        } else {
            let header = Grant::new(link.peer)?;
            let dir = Grant::new(link.peer)?;
            let data = GrantedPages::new(link.peer, g.data_pages())?;
            dir.directory().write_refs(&data.refs).map_err(|_| EINVAL)?;
            if crate::sys::test_hooks::take_inject_bad_dir() {
                // test hook: the last data page's ref is one Xen will refuse
                let mut refs = KVec::with_capacity(data.refs.len(), GFP_KERNEL)?;
                for r in data.refs.iter() {
                    refs.push(*r, GFP_KERNEL)?;
                }
                if let Some(last) = refs.last_mut() {
                    *last = 0xffff_fff0;
                }
                pr_warn!("inject_bad_dir: offering a grant directory with an invalid ref\n");
                dir.directory().write_refs(&refs).map_err(|_| EINVAL)?;
            }
            let ring = header.large_ring(&data, g).ok_or(EINVAL)?;
            let rg = crate::proto::ctrl::RingGrant {
                order: g.order() as u8,
                epoch,
                header_ref: header.gref,
                dir_ref: dir.gref,
            };
            (ring, rg, RingBacking::GrantedLarge(header, dir, data))
        };
        ring.header().init(&id);
        let wake = PipeWake::new(ring, true)?;
        Ok((
            Self::over(ring, g.order(), epoch, Some(link.clone()), mem, Some(wake))?,
            rg,
        ))
    }

    /// The peer's receive ring (named in its ConnectRequest/Accept), mapped
    /// and checked against what the frame announced. `epoch`: the one the
    /// frame must name (0 at connect, a RingOffer's on a switch back).
    pub(crate) fn new_mapped(
        link: &Arc<Link>,
        me: u32,
        rg: &crate::proto::ctrl::RingGrant,
        peer_conn: u32,
        epoch: u32,
    ) -> Result<Arc<Pipe>> {
        let order = rg.order as u32;
        if rg.epoch != epoch || order < crate::proto::layout::MIN_RING_ORDER || order > max_order()
        {
            return Err(EINVAL);
        }
        let g = RingGeometry::new(order).map_err(|_| EINVAL)?;
        let (ring, mem) = if g.is_compact() {
            if rg.dir_ref != 0 {
                return Err(EINVAL);
            }
            let map = Mapping::map(link.peer, rg.header_ref)?;
            let ring = map.ring(g).ok_or(EINVAL)?;
            (ring, RingBacking::Mapped(map))
        } else {
            let n = g.data_pages();
            let mut refs = KVec::with_capacity(n, GFP_KERNEL)?;
            for _ in 0..n {
                refs.push(0u32, GFP_KERNEL)?;
            }
            {
                // the directory is read once, then unmapped
                let dir = Mapping::map(link.peer, rg.dir_ref)?;
                dir.directory()
                    .read_refs(&mut refs[..n])
                    .map_err(|_| EINVAL)?;
            }
            let header = Mapping::map(link.peer, rg.header_ref)?;
            let data = MappedPages::map(link.peer, &refs[..n])?;
            let ring = header.large_ring(&data, g).ok_or(EINVAL)?;
            (ring, RingBacking::MappedLarge(header, data))
        };
        ring.header()
            .verify(&RingIdentity {
                magic: DATA_RING_MAGIC,
                order: g.order(),
                owner_domid: link.peer,
                peer_domid: me,
                conn_id: peer_conn,
                epoch,
            })
            .map_err(|_| EINVAL)?;
        let wake = PipeWake::new(ring, false)?;
        Self::over(ring, g.order(), epoch, Some(link.clone()), mem, Some(wake))
    }

    /// Test mode (hostile_test): a bogus grant reference in the first
    /// directory slot of our large ring, so the peer cannot map it.
    #[cfg(afx_test_hooks)]
    pub(crate) fn test_spoil_directory(&self) {
        if let RingBacking::GrantedLarge(_, dir, _) = &self._mem {
            dir.directory().refs[0].store(0xFFFF_FFF0, core::sync::atomic::Ordering::Release);
        }
    }

    pub(crate) fn is_remote(&self) -> bool {
        self.link.is_some()
    }

    /// Inter-domain: `sk` is the socket the event-channel interrupt wakes
    /// when the peer moves this ring (set from the socket's own calls).
    pub(crate) fn set_owner(&self, sk: &Sk) {
        if let Some(w) = &self.wake {
            w.set_owner(sk);
        }
    }

    /// One step of sendmsg: copies up to `max` bytes (at most `STEP`) of
    /// `msg` straight into the ring, publishes them and kicks the peer if
    /// it asked. The reader's flags are checked first, once per step.
    pub(crate) fn write_msg(
        &self,
        msg: &mut Msg,
        max: usize,
    ) -> core::result::Result<Wrote, RingError> {
        let t = counters::Timer::start();
        let r = self.write_msg_untimed(msg, max);
        t.stop(&counters::STEP_NS);
        r
    }

    fn write_msg_untimed(
        &self,
        msg: &mut Msg,
        max: usize,
    ) -> core::result::Result<Wrote, RingError> {
        let (got, kick) = {
            let mut p = self.tx.lock();
            let end = p.reader_end()?;
            if end.reset {
                return Ok(Wrote::Reset);
            }
            if end.closed {
                return Ok(Wrote::Closed);
            }
            let want = max.min(STEP);
            // reloads (and validates) the peer's `cons` every step: a
            // corrupted index is caught by the next send, not by the next
            // ring-full
            let free = p.free_space()?;
            if free == 0 {
                return Ok(Wrote::Full);
            }
            let n = want.min(free as usize) as u32;
            let cap = p.capacity();
            let start = p.position() & (cap - 1);
            let first = n.min(cap - start);
            let how = self.copy_routine();
            let t = counters::Timer::start();
            let mut got = msg.copy_into_ring(&self.ring, start, first as usize, how);
            if got == first as usize && first < n {
                got += msg.copy_into_ring(&self.ring, 0, (n - first) as usize, how);
            }
            t.stop(&counters::TX_COPY_NS);
            counters::add(&counters::TX_COPY_BYTES, got as i64);
            if got == 0 {
                return Ok(Wrote::Fault);
            }
            // got <= n <= known free space: commit cannot refuse
            p.commit(got as u32);
            let kick = p.flush();
            drop(p);
            (got, kick)
        };
        match &self.link {
            None => self.wake_reader(crate::sys::poll::POLLIN | crate::sys::poll::POLLRDNORM),
            Some(l) if kick => data_kick(l),
            Some(_) => {}
        }
        Ok(Wrote::Bytes(got))
    }

    /// One step of recvmsg: copies up to `max` readable bytes (at most
    /// `STEP`) straight from the ring to `msg`; unless `peek`, consumes
    /// what reached the user and kicks the peer if it waits for space.
    /// `sw`, an inter-domain stream's switch, is held for the step under
    /// the consumer lock (one take: whether it reads this very ring with
    /// no TCP bytes ahead, then what was taken; carrier::ring_reader).
    pub(crate) fn read_msg<G: TakenCount>(
        &self,
        msg: &mut Msg,
        max: usize,
        peek: bool,
        count: impl FnOnce(u32) -> Counted<G>,
    ) -> core::result::Result<Read, RingError> {
        let t = counters::Timer::start();
        let r = self.read_msg_untimed(msg, max, peek, count);
        t.stop(&counters::STEP_NS);
        r
    }

    fn read_msg_untimed<G: TakenCount>(
        &self,
        msg: &mut Msg,
        max: usize,
        peek: bool,
        count: impl FnOnce(u32) -> Counted<G>,
    ) -> core::result::Result<Read, RingError> {
        let (out, short, kick) = {
            let mut c = self.rx.lock();
            // under the consumer: who counts what this read takes
            let mut on_ring = match count(self.epoch) {
                Counted::By(g) => Some(g),
                Counted::Uncounted => None,
                Counted::Elsewhere => return Ok(Read::OffRing),
            };
            let end = c.peer_end()?;
            if end.reset {
                return Ok(Read::Reset);
            }
            let avail = c.readable()?;
            if avail == 0 {
                return Ok(Read::Empty(end));
            }
            let n = (avail as usize)
                .min(max)
                .min(if peek { usize::MAX } else { STEP }) as u32;
            let cap = c.capacity();
            let start = c.position() & (cap - 1);
            let first = n.min(cap - start);
            let t = counters::Timer::start();
            let mut out = msg.copy_from_ring(&self.ring, start, first as usize);
            if out == first as usize && first < n {
                out += msg.copy_from_ring(&self.ring, 0, (n - first) as usize);
            }
            t.stop(&counters::RX_COPY_NS);
            counters::add(&counters::RX_COPY_BYTES, out as i64);
            if peek {
                return Ok(Read::Bytes(out, out < n as usize));
            }
            c.skip(out as u32)?;
            if let Some(g) = on_ring.as_mut() {
                if g.taken(out).is_err() {
                    return Ok(Read::Untracked);
                }
            }
            drop(on_ring);
            (out, out < n as usize, c.flush())
        };
        match &self.link {
            None if out > 0 => {
                self.wake_writer(crate::sys::poll::POLLOUT | crate::sys::poll::POLLWRNORM)
            }
            Some(l) if kick => data_kick(l),
            _ => {}
        }
        Ok(Read::Bytes(out, short))
    }

    /// After a burst of writes: wake a local reader, or kick the peer if it asked.
    pub(crate) fn after_write(&self) {
        match &self.link {
            None => self.wake_reader(crate::sys::poll::POLLIN | crate::sys::poll::POLLRDNORM),
            Some(l) => {
                if self.tx.lock().flush() {
                    l.kick();
                }
            }
        }
    }

    /// After consuming: wake a local writer, or kick the peer if it asked.
    pub(crate) fn after_read(&self) {
        match &self.link {
            None => self.wake_writer(crate::sys::poll::POLLOUT | crate::sys::poll::POLLWRNORM),
            Some(l) => {
                if self.rx.lock().flush() {
                    l.kick();
                }
            }
        }
    }

    /// After a flag change (FIN, CLOSED, RESET): always kick a remote peer.
    pub(crate) fn kick(&self) {
        if let Some(l) = &self.link {
            l.kick();
        }
    }

    pub(crate) fn set_ends(&self, reader: Option<Arc<XenSock>>, writer: Option<Arc<XenSock>>) {
        // The old values drop after the lock is released: dropping the last
        // reference of a socket may free rings (vfree), which may sleep.
        let old = {
            let mut e = self.ends.lock();
            (
                core::mem::replace(&mut e.reader, reader),
                core::mem::replace(&mut e.writer, writer),
            )
        };
        drop(old);
    }

    /// Forget `xs` as an end (it is closing); breaks the Arc cycle and
    /// stops the interrupt's wakes for it.
    pub(crate) fn detach(&self, xs: &XenSock) {
        if let Some(w) = &self.wake {
            w.clear_owner(&xs.sk);
        }
        let (mut r, mut w) = (None, None);
        {
            let mut e = self.ends.lock();
            if e.reader
                .as_deref()
                .map(|x| core::ptr::eq(x, xs))
                .unwrap_or(false)
            {
                r = e.reader.take();
            }
            if e.writer
                .as_deref()
                .map(|x| core::ptr::eq(x, xs))
                .unwrap_or(false)
            {
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

    /// How writes to this ring copy from user memory.
    fn copy_routine(&self) -> CopyRoutine {
        if self.copy.load(Ordering::Relaxed) == CopyRoutine::Nocache as u32 {
            CopyRoutine::Nocache
        } else {
            CopyRoutine::Iter
        }
    }

    /// `XENSOCK_COPY_ROUTINE`: another copy routine for writes to this
    /// ring; the same bytes either way, only the instructions differ.
    pub(crate) fn set_copy_routine(&self, how: CopyRoutine) {
        self.copy.store(how as u32, Ordering::Relaxed);
    }

    /// A writer (or poller) of this ring waits until `want` bytes are
    /// free: asks the interrupt to wake it on the peer's next read
    /// (wake.rs, space_wanted), then publishes its event index and
    /// re-checks. Ok(true): sleep; Ok(false): the space is there.
    pub(crate) fn tx_prepare_wait(&self, want: u32) -> core::result::Result<bool, RingError> {
        if let Some(w) = &self.wake {
            w.want_space();
        }
        self.tx.lock().prepare_wait(want)
    }

    /// Busy-poll condition of a reader: data, the end of the stream, a
    /// reset, or a broken ring (which the next read reports). Not a freeze
    /// (see [`Pipe::rx_prepare_wait`]).
    pub(crate) fn rx_pending(&self) -> bool {
        match self.rx_state() {
            Ok((n, end)) => n > 0 || end.fin || end.reset,
            Err(_) => true,
        }
    }

    /// A reader of this ring waits until `want` bytes are readable: asks
    /// the peer for a kick then, and re-checks. Ok(true): sleep.
    ///
    /// A reader sleeps on a ring the peer froze (it moves;
    /// docs/migration.md) with nothing more to read: nothing happens on
    /// that ring any more. One that follows moves is woken when its switch
    /// leaves the ring (the sender's `TxFreeze` comes over TCP, and the
    /// TCP work item wakes the socket), one that cannot (loopback,
    /// SOCK_SEQPACKET) when the link's loss resets its connection. Woken
    /// by the flag, it would find nothing to read and wait again: a spin
    /// that, on a one-vCPU guest without preemption, kept the work item
    /// that takes the `TxFreeze` from running (the user-space transport
    /// sets the flag when it freezes a ring), and held the CPU for good
    /// once the frozen ring's peer had gone.
    pub(crate) fn rx_prepare_wait(&self, want: u32) -> core::result::Result<bool, RingError> {
        let mut c = self.rx.lock();
        if c.prepare_wait_for(want)? {
            return Ok(true);
        }
        let end = c.peer_end()?;
        Ok(end.frozen && !end.fin && !end.reset && c.readable()? < want.clamp(1, c.capacity()))
    }

    /// Busy-poll condition of a writer: `want` bytes free, or the reader
    /// gone, or a broken ring.
    pub(crate) fn tx_free_at_least(&self, want: u32) -> bool {
        match self.tx_state() {
            Ok((free, end)) => free >= want || end.closed || end.reset,
            Err(_) => true,
        }
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
