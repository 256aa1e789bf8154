// SPDX-License-Identifier: MIT OR Apache-2.0
//! Record framing: `SOCK_SEQPACKET` messages over the byte ring.
//!
//! A connection of type seqpacket (`ctrl::SockType::SeqPacket`) uses the
//! same rings as a stream; each message is one *record*: an 8-byte header
//! and the payload, back to back in the ring (wrapping like any bytes).
//!
//! ```text
//! 0                 4                 8
//! ┌─────────────────┬─────────────────┬──────────────── len bytes ─┐
//! │ len u32 (LE)    │ flags u32 (LE)  │ payload                    │
//! └─────────────────┴─────────────────┴────────────────────────────┘
//! ```
//!
//! * `flags` bit 0 is [`RECORD_FLAG_EOR`] (the sender passed `MSG_EOR`; the
//!   receiver reports it in `msg_flags`); every other bit is zero.
//! * A record never exceeds the ring: `len <= capacity - 8`
//!   ([`max_payload`]). A larger message is refused at the sender
//!   (`EMSGSIZE`); messages are not fragmented, so a record is always
//!   readable as a whole once published.
//! * The producer stages the payload and the header and publishes them with
//!   **one** store of `prod` ([`write_record`], or [`stage_payload`] then
//!   [`commit`] for hosts copying from user memory piece by piece), so an
//!   honest consumer never sees part of a record. A sender that faults half
//!   way (`EFAULT`) publishes nothing.
//! * The consumer reads a header once, validates it ([`RecordHeader::decode`]:
//!   length within the ring, no unknown flag) and never re-reads it. A bad
//!   header is a protocol violation: the host resets the connection, as for
//!   any [`RingError`]. A peer that publishes part of a record only delays
//!   itself: [`next_record`] reports how many bytes must be readable and
//!   the host sleeps with [`crate::ring::Consumer::prepare_wait_for`].
//! * End of stream (FIN) is only valid between records; FIN with part of a
//!   record unread is reported by hosts as a reset.

use super::ring::{Consumer, Producer, RingError, RingMemory};

/// Bytes of a record header.
pub const RECORD_HEADER_SIZE: u32 = 8;
/// Header flag: the message ended a record (`MSG_EOR` at the sender).
pub const RECORD_FLAG_EOR: u32 = 1 << 0;
/// Every header flag this version understands.
pub const RECORD_FLAGS_KNOWN: u32 = RECORD_FLAG_EOR;

/// Largest payload a record can carry in a ring of `capacity` bytes.
pub const fn max_payload(capacity: u32) -> u32 {
    capacity.saturating_sub(RECORD_HEADER_SIZE)
}

/// A record header, as written or as validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    /// Payload bytes after the header.
    pub len: u32,
    /// `RECORD_FLAG_*`.
    pub flags: u32,
}

/// Why a record cannot be sent, or why one read from the peer is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RecordError {
    /// Longer than the ring can hold (sender: `EMSGSIZE`; from the peer:
    /// protocol violation, reset).
    TooLong {
        /// The length asked for or read.
        len: u64,
        /// [`max_payload`] of the ring.
        max: u32,
    },
    /// Header flag bits this version does not define (reset).
    UnknownFlags(u32),
    /// The ring itself was violated (reset).
    Ring(RingError),
}

impl From<RingError> for RecordError {
    fn from(e: RingError) -> Self {
        RecordError::Ring(e)
    }
}

impl core::fmt::Display for RecordError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            RecordError::TooLong { len, max } => {
                write!(f, "record of {len} bytes exceeds the ring's {max}")
            }
            RecordError::UnknownFlags(x) => write!(f, "unknown record flags {x:#x}"),
            RecordError::Ring(e) => write!(f, "{e}"),
        }
    }
}

impl RecordHeader {
    /// The header's wire bytes.
    pub fn encode(&self) -> [u8; RECORD_HEADER_SIZE as usize] {
        let mut b = [0u8; RECORD_HEADER_SIZE as usize];
        b[..4].copy_from_slice(&self.len.to_le_bytes());
        b[4..].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// Validates header bytes read (once) from a ring of `capacity` bytes.
    pub fn decode(
        b: &[u8; RECORD_HEADER_SIZE as usize],
        capacity: u32,
    ) -> Result<Self, RecordError> {
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let flags = u32::from_le_bytes([b[4], b[5], b[6], b[7]]);
        if flags & !RECORD_FLAGS_KNOWN != 0 {
            return Err(RecordError::UnknownFlags(flags));
        }
        let max = max_payload(capacity);
        if len > max {
            return Err(RecordError::TooLong {
                len: len as u64,
                max,
            });
        }
        Ok(RecordHeader { len, flags })
    }

    /// Header plus payload: the ring bytes the record takes.
    pub const fn total(&self) -> u32 {
        RECORD_HEADER_SIZE + self.len
    }
}

/// Checks that a message of `len` bytes can ever be sent into a ring of
/// `capacity` bytes (else `EMSGSIZE`), and returns it as a `u32`.
pub fn check_len(len: usize, capacity: u32) -> Result<u32, RecordError> {
    let max = max_payload(capacity);
    match u32::try_from(len) {
        Ok(l) if l <= max => Ok(l),
        _ => Err(RecordError::TooLong {
            len: len as u64,
            max,
        }),
    }
}

/// Whether a record of `len` payload bytes fits in the free space now
/// (reads the consumer's index once, validated).
pub fn fits<M: RingMemory>(p: &mut Producer<M>, len: u32) -> Result<bool, RecordError> {
    let free = p.free_space()?;
    Ok(len
        .checked_add(RECORD_HEADER_SIZE)
        .is_some_and(|t| t <= free))
}

/// Stages payload bytes at `offset` within the record being built (not
/// visible to the consumer yet). Call after [`fits`] returned `true`.
/// Returns `false` if they do not fit the free space.
pub fn stage_payload<M: RingMemory>(p: &mut Producer<M>, offset: u32, src: &[u8]) -> bool {
    match offset.checked_add(RECORD_HEADER_SIZE) {
        Some(at) => p.stage(at, src),
        None => false,
    }
}

/// Writes the header of the staged record and publishes header and payload
/// with one store of `prod`. Returns `false`, publishing nothing, if the
/// record does not fit the free space. Flush and kick afterwards.
pub fn commit<M: RingMemory>(p: &mut Producer<M>, h: RecordHeader) -> bool {
    if h.len > max_payload(p.capacity()) {
        return false;
    }
    p.stage(0, &h.encode()) && p.commit(h.total())
}

/// Sends one message: `Ok(true)` if published, `Ok(false)` if it does not
/// fit the free space now (wait for `RECORD_HEADER_SIZE + len` bytes of
/// space), `Err(TooLong)` if it never will.
pub fn write_record<M: RingMemory>(
    p: &mut Producer<M>,
    flags: u32,
    payload: &[u8],
) -> Result<bool, RecordError> {
    if flags & !RECORD_FLAGS_KNOWN != 0 {
        return Err(RecordError::UnknownFlags(flags));
    }
    let len = check_len(payload.len(), p.capacity())?;
    if !fits(p, len)? {
        return Ok(false);
    }
    Ok(stage_payload(p, 0, payload) && commit(p, RecordHeader { len, flags }))
}

/// What the consumer finds at its position.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// No whole record yet: sleep until `need` bytes are readable
    /// ([`crate::ring::Consumer::prepare_wait_for`]).
    Incomplete {
        /// Readable bytes needed: the header, or header plus payload.
        need: u32,
    },
    /// A whole record, validated.
    Ready(RecordHeader),
}

/// Looks at the record at the consumer's position: reads the header once
/// and validates it. Consumes nothing.
pub fn next_record<M: RingMemory>(c: &Consumer<M>) -> Result<Next, RecordError> {
    let avail = c.readable()?;
    if avail < RECORD_HEADER_SIZE {
        return Ok(Next::Incomplete {
            need: RECORD_HEADER_SIZE,
        });
    }
    let mut b = [0u8; RECORD_HEADER_SIZE as usize];
    if c.peek(&mut b)? != b.len() {
        return Ok(Next::Incomplete {
            need: RECORD_HEADER_SIZE,
        });
    }
    let h = RecordHeader::decode(&b, c.capacity())?;
    // avail may have grown since; what matters is that the record is there.
    if c.readable()? < h.total() {
        return Ok(Next::Incomplete { need: h.total() });
    }
    Ok(Next::Ready(h))
}

/// Copies payload bytes of the ready record `h` from `offset` within the
/// payload into `dst`. Returns how many were copied.
pub fn read_payload<M: RingMemory>(
    c: &Consumer<M>,
    h: &RecordHeader,
    offset: u32,
    dst: &mut [u8],
) -> Result<usize, RecordError> {
    if offset >= h.len {
        return Ok(0);
    }
    let n = ((h.len - offset) as usize).min(dst.len());
    Ok(c.peek_at(RECORD_HEADER_SIZE + offset, &mut dst[..n])?)
}

/// Consumes the ready record `h` (whatever part of it was read). Flush and
/// kick afterwards.
pub fn consume<M: RingMemory>(c: &mut Consumer<M>, h: &RecordHeader) -> Result<(), RecordError> {
    let done = c.skip(h.total())?;
    if done != h.total() {
        // next_record saw it whole and readable bytes never shrink: only
        // reachable if the caller passed another record's header.
        return Err(RecordError::TooLong {
            len: h.total() as u64,
            max: done,
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(unsafe_code)] // tests build rings over their own buffers
mod tests {
    extern crate std;
    use super::*;
    use crate::layout::{RingGeometry, RingIdentity, DATA_RING_MAGIC};
    use crate::mem::RawRing;
    use core::ptr::NonNull;
    use std::boxed::Box;

    #[repr(C, align(4096))]
    struct Pages([u8; 3 * 4096]);

    /// A ring of `order` (11 or 12) in `mem`, both counters at `start`.
    fn ring(mem: &mut Pages, order: u32, start: u32) -> RawRing {
        let g = RingGeometry::new(order).unwrap();
        let base = NonNull::new(mem.0.as_mut_ptr()).unwrap();
        // SAFETY: mem outlives the ring in each test and is used only through it.
        let r = unsafe { RawRing::from_region(base, mem.0.len(), g) }.unwrap();
        r.header().init(&RingIdentity {
            magic: DATA_RING_MAGIC,
            order,
            owner_domid: 1,
            peer_domid: 2,
            conn_id: 1,
            epoch: 0,
        });
        use core::sync::atomic::Ordering::Relaxed;
        r.header().producer.prod.store(start, Relaxed);
        r.header().consumer.cons.store(start, Relaxed);
        r
    }

    #[test]
    fn header_round_trip_and_rejections() {
        let h = RecordHeader {
            len: 300,
            flags: RECORD_FLAG_EOR,
        };
        assert_eq!(RecordHeader::decode(&h.encode(), 2048), Ok(h));
        assert_eq!(h.encode(), [44, 1, 0, 0, 1, 0, 0, 0]);
        let long = RecordHeader {
            len: 2041,
            flags: 0,
        };
        assert_eq!(
            RecordHeader::decode(&long.encode(), 2048),
            Err(RecordError::TooLong {
                len: 2041,
                max: 2040
            })
        );
        let max = RecordHeader {
            len: 2040,
            flags: 0,
        };
        assert_eq!(RecordHeader::decode(&max.encode(), 2048), Ok(max));
        let flags = RecordHeader { len: 1, flags: 2 };
        assert_eq!(
            RecordHeader::decode(&flags.encode(), 2048),
            Err(RecordError::UnknownFlags(2))
        );
        assert_eq!(check_len(2040, 2048), Ok(2040));
        assert!(check_len(2041, 2048).is_err());
        assert!(check_len(usize::MAX, 2048).is_err());
    }

    #[test]
    fn records_keep_their_boundaries_across_the_wrap() {
        let mut mem = Box::new(Pages([0; 3 * 4096]));
        let r = ring(&mut mem, 11, u32::MAX - 100);
        let mut tx = Producer::resume(r, u32::MAX - 100);
        let mut rx = Consumer::resume(r, u32::MAX - 100);
        for round in 0..20u32 {
            let a = [round as u8; 700];
            let b = [!(round as u8); 5];
            assert_eq!(write_record(&mut tx, RECORD_FLAG_EOR, &a), Ok(true));
            assert_eq!(write_record(&mut tx, 0, &b), Ok(true));
            let mut buf = [0u8; 2048];
            let Next::Ready(h) = next_record(&rx).unwrap() else {
                panic!("no record")
            };
            assert_eq!(
                h,
                RecordHeader {
                    len: 700,
                    flags: RECORD_FLAG_EOR
                }
            );
            assert_eq!(read_payload(&rx, &h, 0, &mut buf).unwrap(), 700);
            assert!(buf[..700].iter().all(|&x| x == round as u8));
            consume(&mut rx, &h).unwrap();
            let Next::Ready(h) = next_record(&rx).unwrap() else {
                panic!("no record")
            };
            assert_eq!(h.len, 5);
            // a short read of the second: the rest goes with the record
            assert_eq!(read_payload(&rx, &h, 0, &mut buf[..2]).unwrap(), 2);
            assert_eq!(read_payload(&rx, &h, 3, &mut buf[2..]).unwrap(), 2);
            assert!(buf[..4].iter().all(|&x| x == !(round as u8)));
            consume(&mut rx, &h).unwrap();
            assert_eq!(next_record(&rx), Ok(Next::Incomplete { need: 8 }));
        }
    }

    #[test]
    fn nothing_is_visible_until_commit_and_full_rings_refuse() {
        let mut mem = Box::new(Pages([0; 3 * 4096]));
        let r = ring(&mut mem, 11, 0);
        let mut tx = Producer::new(r);
        let rx = Consumer::new(r);
        assert!(fits(&mut tx, 100).unwrap());
        assert!(stage_payload(&mut tx, 0, &[1; 60]));
        assert!(stage_payload(&mut tx, 60, &[2; 40]));
        assert_eq!(rx.readable(), Ok(0));
        assert!(commit(&mut tx, RecordHeader { len: 100, flags: 0 }));
        assert_eq!(
            next_record(&rx),
            Ok(Next::Ready(RecordHeader { len: 100, flags: 0 }))
        );
        // 108 used: a record of 2048 - 108 - 8 + 1 payload bytes does not fit now
        assert_eq!(write_record(&mut tx, 0, &[0; 1933]), Ok(false));
        assert_eq!(write_record(&mut tx, 0, &[0; 1932]), Ok(true));
        assert!(matches!(
            write_record(&mut tx, 0, &[0; 2041]),
            Err(RecordError::TooLong { .. })
        ));
        assert_eq!(
            write_record(&mut tx, 4, &[0; 1]),
            Err(RecordError::UnknownFlags(4))
        );
    }

    #[test]
    fn partial_records_from_a_peer_are_waited_for() {
        let mut mem = Box::new(Pages([0; 3 * 4096]));
        let r = ring(&mut mem, 11, 0);
        // a peer that publishes header and payload separately
        let mut tx = Producer::new(r);
        let mut rx = Consumer::new(r);
        assert_eq!(tx.write(&[5, 0, 0]).unwrap(), 3);
        assert_eq!(next_record(&rx), Ok(Next::Incomplete { need: 8 }));
        assert_eq!(tx.write(&[0, 0, 0, 0, 0, 9, 9]).unwrap(), 7);
        assert_eq!(next_record(&rx), Ok(Next::Incomplete { need: 13 }));
        // asks for a kick when the 13th byte arrives, not before
        assert_eq!(rx.prepare_wait_for(13), Ok(true));
        tx.flush();
        tx.write(&[9, 9]).unwrap();
        assert!(!tx.flush(), "12 of 13 bytes: no kick yet");
        tx.write(&[9]).unwrap();
        assert!(tx.flush(), "13th byte: kick");
        assert_eq!(rx.prepare_wait_for(13), Ok(false));
        assert_eq!(
            next_record(&rx),
            Ok(Next::Ready(RecordHeader { len: 5, flags: 0 }))
        );
        consume(&mut rx, &RecordHeader { len: 5, flags: 0 }).unwrap();
        // a hostile length: refused, never read past
        tx.write(
            &RecordHeader {
                len: 4000,
                flags: 0,
            }
            .encode(),
        )
        .unwrap();
        assert!(matches!(
            next_record(&rx),
            Err(RecordError::TooLong { len: 4000, .. })
        ));
    }
}
