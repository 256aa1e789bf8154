// SPDX-License-Identifier: GPL-2.0
//! A byte queue of fixed capacity: stream bytes for the outbound leg, the
//! peer's bytes not read yet.

use super::*;

/// A fixed-size byte FIFO (the kernel's Vec has no deque).
pub(super) struct Fifo {
    pub(super) buf: KVVec<u8>,
    /// buf.len(), never 0: the index arithmetic has no division panic
    /// (objtool saw `consume` fall through into the next function)
    pub(super) cap: core::num::NonZeroUsize,
    pub(super) head: usize,
    pub(super) len: usize,
}

impl Fifo {
    pub(super) fn new(cap: usize) -> core::result::Result<Fifo, i32> {
        let nz = core::num::NonZeroUsize::new(cap).ok_or(e::EINVAL)?;
        let buf = KVVec::from_elem(0u8, cap, GFP_KERNEL).map_err(|_| e::ENOMEM)?;
        Ok(Fifo {
            buf,
            cap: nz,
            head: 0,
            len: 0,
        })
    }
    pub(super) fn len(&self) -> usize {
        self.len
    }
    pub(super) fn room(&self) -> usize {
        self.buf.len() - self.len
    }
    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }
    /// The first contiguous run of queued bytes.
    pub(super) fn front(&self) -> &[u8] {
        let end = (self.head + self.len).min(self.buf.len());
        &self.buf[self.head..end]
    }
    pub(super) fn consume(&mut self, n: usize) {
        let n = n.min(self.len);
        self.head = (self.head + n) % self.cap;
        self.len -= n;
        if self.len == 0 {
            self.head = 0;
        }
    }
    /// The free bytes right after the queued ones, up to the buffer's end
    /// (a receive straight into the queue; `commit` then counts them).
    pub(super) fn tail_room(&mut self) -> &mut [u8] {
        let cap = self.buf.len();
        if self.len == cap {
            return &mut [];
        }
        let tail = (self.head + self.len) % self.cap;
        let end = if tail >= self.head { cap } else { self.head };
        &mut self.buf[tail..end]
    }
    /// Counts `n` bytes written into `tail_room` as queued.
    pub(super) fn commit(&mut self, n: usize) {
        self.len += n.min(self.room());
    }
    /// Appends `n` bytes copied straight from the user's iovecs (writes
    /// before the leg is up); returns the bytes copied (short on a fault),
    /// 0 when they do not fit.
    pub(super) fn push_from(&mut self, msg: &mut Msg, n: usize) -> usize {
        if n == 0 || n > self.room() {
            return 0;
        }
        // the free space right after the queued bytes, wrapping at the end
        let cap = self.buf.len();
        let start = (self.head + self.len) % self.cap;
        let first = n.min(cap - start);
        let mut got = msg.copy_from(&mut self.buf[start..start + first]);
        if got == first && first < n {
            got += msg.copy_from(&mut self.buf[..n - first]);
        }
        self.len += got;
        got
    }
    /// Appends all of `b`, or nothing when it does not fit.
    pub(super) fn push(&mut self, b: &[u8]) -> bool {
        if b.len() > self.room() {
            return false;
        }
        let cap = self.buf.len();
        let tail = (self.head + self.len) % self.cap;
        let first = b.len().min(cap - tail);
        self.buf[tail..tail + first].copy_from_slice(&b[..first]);
        self.buf[..b.len() - first].copy_from_slice(&b[first..]);
        self.len += b.len();
        true
    }
}
