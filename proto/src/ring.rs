// SPDX-License-Identifier: MIT OR Apache-2.0
//! The single-producer/single-consumer byte ring and its notification
//! protocol.
//!
//! # Indices
//!
//! `prod` and `cons` are free-running byte counters that wrap at 2^32; the
//! data area is a power of two, so a byte at stream position `i` lives at
//! `i & (size - 1)`. `prod - cons` (wrapping) is the number of readable
//! bytes, never more than `size`. Each side keeps its own counter in local
//! memory and only *stores* it to the shared page: a value read back from the
//! page is never trusted, because the peer can scribble on the whole page.
//!
//! # Hostile peer
//!
//! The peer's counter is loaded once per operation and validated against our
//! own: a consumer accepts `prod` only if `0 <= prod - cons <= size`, a
//! producer accepts `cons` only if it did not move backwards and `prod - cons
//! <= size`. Anything else is a [`RingError::Corrupt`]; the caller resets the
//! connection. No input can make these functions panic, loop or touch memory
//! outside the ring.
//!
//! # Notifications (event indices)
//!
//! A side about to sleep publishes an *event index*: "kick me once your
//! counter moves past this value" (`data_event` from the consumer,
//! `space_event` from the producer), issues a full fence, and re-reads the
//! other side's counter; it sleeps only if nothing changed. The other side
//! publishes its counter, issues a full fence, reads the event index and
//! kicks only if its last update crossed it ([`need_event`]). This is the
//! check-after-set sequence of Xen's `ring.h` and virtio's event index: a
//! wakeup cannot be lost, and a burst of writes costs one kick, not one per
//! write. Each event index is written by exactly one side.

use core::sync::atomic::Ordering;

/// A field of the ring header, named for [`RingMemory`] accessors.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    /// Producer's byte counter.
    Prod,
    /// Producer's event index (waiting for space).
    SpaceEvent,
    /// Producer's flags.
    ProdFlags,
    /// Consumer's byte counter.
    Cons,
    /// Consumer's event index (waiting for data).
    DataEvent,
    /// Consumer's flags.
    ConsFlags,
}

/// Access to one ring's shared header fields and data area.
///
/// The ring logic is generic over this so the same code runs over kernel
/// pages, mmap'd grant pages, test buffers ([`crate::mem::RawRing`]) and the
/// loom model's instrumented memory.
///
/// Implementations must make `load`/`store` single atomic accesses with the
/// given ordering and `fence` a sequentially consistent fence, and must keep
/// `write_data`/`read_data` inside the data area for every
/// `offset < data_size()` and `offset + len <= data_size()` (the ring never
/// asks for more).
pub trait RingMemory {
    /// Bytes in the data area; a power of two. This is the local, trusted
    /// value, never read from shared memory.
    fn data_size(&self) -> u32;
    /// Loads a header field once.
    fn load(&self, field: Field, order: Ordering) -> u32;
    /// Stores a header field.
    fn store(&self, field: Field, value: u32, order: Ordering);
    /// A full (`SeqCst`) fence, ordering a store before a later load.
    fn fence(&self);
    /// Copies `src` into the data area at `offset`.
    fn write_data(&self, offset: u32, src: &[u8]);
    /// Copies from the data area at `offset` into `dst`.
    fn read_data(&self, offset: u32, dst: &mut [u8]);
}

/// A ring violation by the peer: the connection must be reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RingError {
    /// The peer's index is inconsistent with ours.
    Corrupt {
        /// Which field was wrong.
        field: Field,
        /// The value read.
        seen: u32,
        /// Our own counter at the time.
        ours: u32,
    },
    /// The peer set flag bits this version does not define.
    UnknownFlags(u32),
}

impl core::fmt::Display for RingError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RingError::Corrupt { field, seen, ours } => {
                write!(
                    f,
                    "peer corrupted ring field {field:?}: read {seen}, local counter {ours}"
                )
            }
            RingError::UnknownFlags(v) => write!(f, "peer set unknown ring flags {v:#x}"),
        }
    }
}

/// Whether an update of a counter from `old` to `new` crossed the event
/// index `event`, i.e. `event` lies in `[old, new)` in wrapping arithmetic.
#[inline]
pub const fn need_event(event: u32, new: u32, old: u32) -> bool {
    new.wrapping_sub(event).wrapping_sub(1) < new.wrapping_sub(old)
}

/// State of the far end as seen by the consumer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerEnd {
    /// The producer finished writing (end of stream after the last byte).
    pub fin: bool,
    /// The producer reset the connection.
    pub reset: bool,
    /// The producer froze this ring for a carrier switch.
    pub frozen: bool,
}

/// State of the far end as seen by the producer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReaderEnd {
    /// The consumer will read no more.
    pub closed: bool,
    /// The consumer reset the connection.
    pub reset: bool,
}

/// The peer's line of a ring as an interrupt handler samples it: the
/// producer's counter and flags for the ring we consume (`consumer`), the
/// consumer's for the ring we produce into. Compared with the last sample,
/// a change says the peer moved the ring or set a flag.
pub fn peer_line<M: RingMemory>(mem: &M, consumer: bool) -> (u32, u32) {
    if consumer {
        (
            mem.load(Field::Prod, Ordering::Acquire),
            mem.load(Field::ProdFlags, Ordering::Acquire),
        )
    } else {
        (
            mem.load(Field::Cons, Ordering::Acquire),
            mem.load(Field::ConsFlags, Ordering::Acquire),
        )
    }
}

/// Whether a ring holds bytes its consumer has not taken (a cheap look
/// for an interrupt handler: the counters are not validated).
pub fn has_unread<M: RingMemory>(mem: &M) -> bool {
    mem.load(Field::Prod, Ordering::Acquire) != mem.load(Field::Cons, Ordering::Relaxed)
}

/// What one [`Producer::send`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    /// `n` bytes written and published; `kick`: the consumer asked to be
    /// notified (the caller kicks its event channel).
    Bytes {
        /// Bytes written.
        n: usize,
        /// Whether to kick the consumer.
        kick: bool,
    },
    /// The ring is full: nothing written.
    Full,
    /// The consumer reset the connection: nothing written.
    ReaderReset,
    /// The consumer reads no more (shut down or closed): nothing written.
    ReaderClosed,
}

/// What one [`Consumer::receive`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// `n` bytes read and consumed; `kick`: the producer asked to be
    /// notified of the space (the caller kicks its event channel).
    Bytes {
        /// Bytes read.
        n: usize,
        /// Whether to kick the producer.
        kick: bool,
    },
    /// Nothing readable; the producer's flags, read before the ring was
    /// found empty (so `fin` here is a true end of stream).
    Empty(PeerEnd),
    /// The producer reset the connection: what was not read is dropped,
    /// as TCP's RST drops it.
    Reset,
}

/// The sending side of a ring.
///
/// `write` publishes data as it goes; `flush` decides, once per burst,
/// whether the consumer asked to be kicked.
pub struct Producer<M: RingMemory> {
    mem: M,
    mask: u32,
    /// Our counter (authoritative; the shared copy is only ever stored).
    prod: u32,
    /// Last `cons` accepted from the peer.
    cons_seen: u32,
    /// `prod` at the last kick decision.
    notified_prod: u32,
    flags: u32,
}

impl<M: RingMemory> Producer<M> {
    /// Attaches to a freshly initialised ring (both counters at 0).
    pub fn new(mem: M) -> Self {
        Self::resume(mem, 0)
    }

    /// Attaches to a ring whose counters both stand at `prod` (a ring the
    /// owner initialised at a non-zero position; tests use it to exercise
    /// counter wrap-around).
    pub fn resume(mem: M, prod: u32) -> Self {
        let mask = mem.data_size().wrapping_sub(1);
        Producer {
            mem,
            mask,
            prod,
            cons_seen: prod,
            notified_prod: prod,
            flags: 0,
        }
    }

    /// The ring's data size.
    pub fn capacity(&self) -> u32 {
        self.mask.wrapping_add(1)
    }

    /// Attaches to a ring a consumer already reads, continuing where it
    /// stands (a link's control ring an earlier incarnation of ours may
    /// have written into).
    pub fn resume_at_consumer(mem: M) -> Self {
        let cons = mem.load(Field::Cons, Ordering::Acquire);
        Self::resume(mem, cons)
    }

    /// Whether the consumer waits for data at our position (its event
    /// index names it): a kick is due after a flag it must see. The fence
    /// pairs with the consumer's re-check after it published the index.
    pub fn consumer_waiting(&self) -> bool {
        self.mem.fence();
        self.mem.load(Field::DataEvent, Ordering::Relaxed) == self.prod
    }

    /// Our byte counter.
    pub fn position(&self) -> u32 {
        self.prod
    }

    /// Shared-memory access, for hosts that need it (e.g. heartbeats).
    pub fn memory(&self) -> &M {
        &self.mem
    }

    fn load_cons(&mut self) -> Result<u32, RingError> {
        let cons = self.mem.load(Field::Cons, Ordering::Acquire);
        let used = self.prod.wrapping_sub(cons);
        let advanced = cons.wrapping_sub(self.cons_seen);
        let outstanding = self.prod.wrapping_sub(self.cons_seen);
        if used > self.capacity() || advanced > outstanding {
            return Err(RingError::Corrupt {
                field: Field::Cons,
                seen: cons,
                ours: self.prod,
            });
        }
        self.cons_seen = cons;
        Ok(cons)
    }

    /// Bytes that can be written now.
    pub fn free_space(&mut self) -> Result<u32, RingError> {
        let cons = self.load_cons()?;
        Ok(self.capacity() - self.prod.wrapping_sub(cons))
    }

    /// Bytes written and not yet consumed.
    pub fn unconsumed(&mut self) -> Result<u32, RingError> {
        let cons = self.load_cons()?;
        Ok(self.prod.wrapping_sub(cons))
    }

    /// Reads the consumer's flags once.
    pub fn reader_end(&self) -> Result<ReaderEnd, RingError> {
        let flags = self.mem.load(Field::ConsFlags, Ordering::Acquire);
        if flags & !super::layout::CONS_FLAGS_KNOWN != 0 {
            return Err(RingError::UnknownFlags(flags));
        }
        Ok(ReaderEnd {
            closed: flags & super::layout::CONS_FLAG_CLOSED != 0,
            reset: flags & super::layout::CONS_FLAG_RESET != 0,
        })
    }

    /// Copies as much of `src` as fits and publishes it. Returns the number
    /// of bytes written (0 when the ring is full). Call [`Producer::flush`]
    /// after the burst to decide on a kick.
    pub fn write(&mut self, src: &[u8]) -> Result<usize, RingError> {
        // Space known from the last load of `cons` is still free (the
        // consumer only ever frees more); reload the peer's cache line only
        // when that is not enough.
        let mut free = self.capacity() - self.prod.wrapping_sub(self.cons_seen);
        if (free as usize) < src.len() {
            free = self.free_space()?;
        }
        let n = (free as usize).min(src.len()) as u32;
        if n == 0 {
            return Ok(0);
        }
        let start = self.prod & self.mask;
        let first = n.min(self.capacity() - start);
        self.mem.write_data(start, &src[..first as usize]);
        if first < n {
            self.mem.write_data(0, &src[first as usize..n as usize]);
        }
        self.prod = self.prod.wrapping_add(n);
        self.mem.store(Field::Prod, self.prod, Ordering::Release);
        Ok(n as usize)
    }

    /// One send step of a stream, as both hosts take it: the consumer's
    /// flags first (a reset or closed reader gets nothing), then as much of
    /// `src` as fits, published, and whether to kick.
    pub fn send(&mut self, src: &[u8]) -> Result<Sent, RingError> {
        let end = self.reader_end()?;
        if end.reset {
            return Ok(Sent::ReaderReset);
        }
        if end.closed {
            return Ok(Sent::ReaderClosed);
        }
        match self.write(src)? {
            0 => Ok(Sent::Full),
            n => Ok(Sent::Bytes {
                n,
                kick: self.flush(),
            }),
        }
    }

    /// Space known free without reading the peer's line again (what the
    /// last [`Producer::free_space`] or write saw, minus what was written
    /// since). [`Producer::stage`] and [`Producer::commit`] stay within it.
    pub fn known_free(&self) -> u32 {
        self.capacity() - self.prod.wrapping_sub(self.cons_seen)
    }

    /// Copies `src` into the ring `offset` bytes after the current position
    /// *without publishing it*: the consumer cannot see it until
    /// [`Producer::commit`]. Used to publish a whole record at once (see
    /// [`crate::record`]). Returns `false`, writing nothing, unless
    /// `offset + src.len()` fits in [`Producer::known_free`].
    pub fn stage(&mut self, offset: u32, src: &[u8]) -> bool {
        let Ok(len) = u32::try_from(src.len()) else {
            return false;
        };
        match offset.checked_add(len) {
            Some(end) if end <= self.known_free() => {}
            _ => return false,
        }
        if len == 0 {
            return true;
        }
        let start = self.prod.wrapping_add(offset) & self.mask;
        let first = len.min(self.capacity() - start);
        self.mem.write_data(start, &src[..first as usize]);
        if first < len {
            self.mem.write_data(0, &src[first as usize..]);
        }
        true
    }

    /// Publishes `n` bytes staged with [`Producer::stage`] (one store of
    /// `prod`). Returns `false`, publishing nothing, if `n` exceeds
    /// [`Producer::known_free`].
    pub fn commit(&mut self, n: u32) -> bool {
        if n > self.known_free() {
            return false;
        }
        if n > 0 {
            self.prod = self.prod.wrapping_add(n);
            self.mem.store(Field::Prod, self.prod, Ordering::Release);
        }
        true
    }

    /// Ends a burst: returns `true` if the consumer asked to be kicked since
    /// the last flush (the caller then notifies the event channel).
    pub fn flush(&mut self) -> bool {
        if self.prod == self.notified_prod {
            return false;
        }
        self.mem.fence();
        let event = self.mem.load(Field::DataEvent, Ordering::Relaxed);
        let kick = need_event(event, self.prod, self.notified_prod);
        self.notified_prod = self.prod;
        kick
    }

    /// Before sleeping for space: asks to be kicked once at least `want`
    /// bytes are free (clamped to `1..=capacity`) and re-checks. Returns
    /// `Ok(true)` if the caller may sleep, `Ok(false)` if space appeared.
    pub fn prepare_wait(&mut self, want: u32) -> Result<bool, RingError> {
        let want = want.clamp(1, self.capacity());
        // Kick once `cons >= prod - capacity + want`, i.e. once `cons` moves
        // past the value just below that.
        let event = self
            .prod
            .wrapping_sub(self.capacity())
            .wrapping_add(want)
            .wrapping_sub(1);
        self.mem.store(Field::SpaceEvent, event, Ordering::Relaxed);
        self.mem.fence();
        let free = self.free_space()?;
        let reader = self.reader_end()?;
        Ok(free < want && !reader.closed && !reader.reset)
    }

    /// Copies the written-but-unconsumed bytes (oldest first) into `dst`,
    /// for a carrier switch: the ring is the retransmission buffer. Returns
    /// how many bytes were copied; `dst` must hold [`Producer::capacity`]
    /// bytes to be sure to get them all.
    pub fn read_back(&mut self, dst: &mut [u8]) -> Result<usize, RingError> {
        let cons = self.load_cons()?;
        let n = (self.prod.wrapping_sub(cons) as usize).min(dst.len()) as u32;
        let start = cons & self.mask;
        let first = n.min(self.capacity() - start);
        self.mem.read_data(start, &mut dst[..first as usize]);
        if first < n {
            self.mem.read_data(0, &mut dst[first as usize..n as usize]);
        }
        Ok(n as usize)
    }

    fn set_flag(&mut self, flag: u32) {
        self.flags |= flag;
        self.mem
            .store(Field::ProdFlags, self.flags, Ordering::Release);
    }

    /// Marks the end of the stream after the bytes written so far. The
    /// caller always kicks afterwards: a sleeping consumer waits for data,
    /// not for flags.
    pub fn finish(&mut self) {
        self.set_flag(super::layout::PROD_FLAG_FIN);
    }

    /// Marks the ring frozen for a carrier switch; nothing more is written.
    pub fn freeze(&mut self) {
        self.set_flag(super::layout::PROD_FLAG_FROZEN);
    }

    /// Marks the connection reset.
    pub fn reset(&mut self) {
        self.set_flag(super::layout::PROD_FLAG_RESET);
    }

    /// Gives back the memory handle.
    pub fn into_memory(self) -> M {
        self.mem
    }
}

/// The receiving side of a ring.
pub struct Consumer<M: RingMemory> {
    mem: M,
    mask: u32,
    cons: u32,
    /// Last `prod` accepted from the peer.
    prod_seen: u32,
    notified_cons: u32,
    flags: u32,
}

impl<M: RingMemory> Consumer<M> {
    /// Attaches to a freshly initialised ring.
    pub fn new(mem: M) -> Self {
        Self::resume(mem, 0)
    }

    /// Attaches to a ring whose counters both stand at `cons` (see
    /// [`Producer::resume`]).
    pub fn resume(mem: M, cons: u32) -> Self {
        let mask = mem.data_size().wrapping_sub(1);
        Consumer {
            mem,
            mask,
            cons,
            prod_seen: cons,
            notified_cons: cons,
            flags: 0,
        }
    }

    /// The ring's data size.
    pub fn capacity(&self) -> u32 {
        self.mask.wrapping_add(1)
    }

    /// Whether the producer waits for space we would free (its event
    /// index lies within a ring ahead of our position): a kick is due after
    /// a flag it must see. The fence pairs with the producer's re-check.
    pub fn producer_waiting(&self) -> bool {
        self.mem.fence();
        let ev = self.mem.load(Field::SpaceEvent, Ordering::Relaxed);
        ev.wrapping_sub(self.cons) < self.capacity()
    }

    /// Our byte counter.
    pub fn position(&self) -> u32 {
        self.cons
    }

    /// Shared-memory access, for hosts that need it.
    pub fn memory(&self) -> &M {
        &self.mem
    }

    fn load_prod(&self) -> Result<u32, RingError> {
        let prod = self.mem.load(Field::Prod, Ordering::Acquire);
        if prod.wrapping_sub(self.cons) > self.capacity() {
            return Err(RingError::Corrupt {
                field: Field::Prod,
                seen: prod,
                ours: self.cons,
            });
        }
        Ok(prod)
    }

    /// Bytes readable now.
    pub fn readable(&self) -> Result<u32, RingError> {
        Ok(self.load_prod()?.wrapping_sub(self.cons))
    }

    /// Reads the producer's flags once. Read flags *before* deciding that
    /// `readable() == 0` means end of stream: `fin` is set after the last
    /// `prod` store, so `fin` then `readable() == 0` is a true EOF.
    pub fn peer_end(&self) -> Result<PeerEnd, RingError> {
        let flags = self.mem.load(Field::ProdFlags, Ordering::Acquire);
        if flags & !super::layout::PROD_FLAGS_KNOWN != 0 {
            return Err(RingError::UnknownFlags(flags));
        }
        Ok(PeerEnd {
            fin: flags & super::layout::PROD_FLAG_FIN != 0,
            reset: flags & super::layout::PROD_FLAG_RESET != 0,
            frozen: flags & super::layout::PROD_FLAG_FROZEN != 0,
        })
    }

    fn copy_out(&self, avail: u32, dst: &mut [u8]) -> u32 {
        let n = (avail as usize).min(dst.len()) as u32;
        let start = self.cons & self.mask;
        let first = n.min(self.capacity() - start);
        self.mem.read_data(start, &mut dst[..first as usize]);
        if first < n {
            self.mem.read_data(0, &mut dst[first as usize..n as usize]);
        }
        n
    }

    /// Copies readable bytes into `dst` without consuming them.
    pub fn peek(&self, dst: &mut [u8]) -> Result<usize, RingError> {
        let avail = self.readable()?;
        Ok(self.copy_out(avail, dst) as usize)
    }

    /// Copies readable bytes starting `offset` bytes after the current
    /// position into `dst`, without consuming anything. Returns how many
    /// were copied (0 if fewer than `offset` bytes are readable).
    pub fn peek_at(&self, offset: u32, dst: &mut [u8]) -> Result<usize, RingError> {
        let avail = self.readable()?;
        if offset >= avail {
            return Ok(0);
        }
        let n = ((avail - offset) as usize).min(dst.len()) as u32;
        let start = self.cons.wrapping_add(offset) & self.mask;
        let first = n.min(self.capacity() - start);
        self.mem.read_data(start, &mut dst[..first as usize]);
        if first < n {
            self.mem.read_data(0, &mut dst[first as usize..n as usize]);
        }
        Ok(n as usize)
    }

    /// Copies readable bytes into `dst` and consumes them. Returns 0 when the
    /// ring is empty. Call [`Consumer::flush`] after the burst.
    pub fn read(&mut self, dst: &mut [u8]) -> Result<usize, RingError> {
        // Bytes known from the last load of `prod` are still there; reload
        // the peer's cache line only when they do not fill `dst`.
        let mut avail = self.prod_seen.wrapping_sub(self.cons);
        if (avail as usize) < dst.len() {
            avail = self.readable()?;
            self.prod_seen = self.cons.wrapping_add(avail);
        }
        let n = self.copy_out(avail, dst);
        self.consume(n);
        Ok(n as usize)
    }

    /// One receive step of a stream, as both hosts take it: the
    /// producer's flags first (a reset drops what is unread), then as much
    /// as `dst` holds, consumed, and whether to kick. `dst` must not be
    /// empty (an empty read says nothing about the ring).
    pub fn receive(&mut self, dst: &mut [u8]) -> Result<Received, RingError> {
        let end = self.peer_end()?;
        if end.reset {
            return Ok(Received::Reset);
        }
        match self.read(dst)? {
            0 => Ok(Received::Empty(end)),
            n => Ok(Received::Bytes {
                n,
                kick: self.flush(),
            }),
        }
    }

    /// [`Consumer::receive`] without consuming (`MSG_PEEK`): the flags
    /// first, then as much as `dst` holds, left in the ring (no kick).
    pub fn receive_peek(&self, dst: &mut [u8]) -> Result<Received, RingError> {
        let end = self.peer_end()?;
        if end.reset {
            return Ok(Received::Reset);
        }
        match self.peek(dst)? {
            0 => Ok(Received::Empty(end)),
            n => Ok(Received::Bytes { n, kick: false }),
        }
    }

    /// Consumes `n` bytes without copying them, at most what is readable.
    /// Returns how many were consumed.
    pub fn skip(&mut self, n: u32) -> Result<u32, RingError> {
        let avail = self.readable()?;
        self.prod_seen = self.cons.wrapping_add(avail);
        let n = n.min(avail);
        self.consume(n);
        Ok(n)
    }

    // Invariant: cons <= prod_seen <= cons + capacity (wrapping), since `n`
    // never exceeds the bytes known readable.
    fn consume(&mut self, n: u32) {
        if n > 0 {
            self.cons = self.cons.wrapping_add(n);
            self.mem.store(Field::Cons, self.cons, Ordering::Release);
        }
    }

    /// Ends a burst: returns `true` if the producer asked to be kicked.
    pub fn flush(&mut self) -> bool {
        if self.cons == self.notified_cons {
            return false;
        }
        self.mem.fence();
        let event = self.mem.load(Field::SpaceEvent, Ordering::Relaxed);
        let kick = need_event(event, self.cons, self.notified_cons);
        self.notified_cons = self.cons;
        kick
    }

    /// Before sleeping for data: asks to be kicked on the next byte and
    /// re-checks. Returns `Ok(true)` if the caller may sleep.
    pub fn prepare_wait(&mut self) -> Result<bool, RingError> {
        self.mem
            .store(Field::DataEvent, self.cons, Ordering::Relaxed);
        self.mem.fence();
        let avail = self.readable()?;
        let end = self.peer_end()?;
        Ok(avail == 0 && !end.fin && !end.reset && !end.frozen)
    }

    /// Before sleeping until at least `want` bytes are readable (clamped to
    /// `1..=capacity`; e.g. the rest of a record): asks to be kicked once
    /// `prod` reaches `cons + want` and re-checks. Returns `Ok(true)` if the
    /// caller may sleep. `prepare_wait_for(1)` is [`Consumer::prepare_wait`].
    pub fn prepare_wait_for(&mut self, want: u32) -> Result<bool, RingError> {
        let want = want.clamp(1, self.capacity());
        self.mem.store(
            Field::DataEvent,
            self.cons.wrapping_add(want - 1),
            Ordering::Relaxed,
        );
        self.mem.fence();
        let avail = self.readable()?;
        let end = self.peer_end()?;
        Ok(avail < want && !end.fin && !end.reset && !end.frozen)
    }

    fn set_flag(&mut self, flag: u32) {
        self.flags |= flag;
        self.mem
            .store(Field::ConsFlags, self.flags, Ordering::Release);
    }

    /// Tells the producer nothing more will be read. Kick afterwards.
    pub fn close(&mut self) {
        self.set_flag(super::layout::CONS_FLAG_CLOSED);
    }

    /// Marks the connection reset. Kick afterwards.
    pub fn reset(&mut self) {
        self.set_flag(super::layout::CONS_FLAG_RESET);
    }

    /// Gives back the memory handle.
    pub fn into_memory(self) -> M {
        self.mem
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn need_event_matches_crossing() {
        assert!(need_event(5, 6, 5));
        assert!(!need_event(5, 5, 4));
        assert!(need_event(4, 5, 4));
        assert!(!need_event(10, 9, 0));
        // across the wrap
        assert!(need_event(u32::MAX, 1, u32::MAX - 1));
        assert!(!need_event(2, 1, u32::MAX));
        // no movement never kicks
        assert!(!need_event(3, 3, 3));
    }
}
