// SPDX-License-Identifier: MIT OR Apache-2.0
//! Properties of record framing (SOCK_SEQPACKET over the byte ring):
//! messages come out whole, in order, with their flags, for any ring size,
//! message sizes, read sizes and counter start; a short read loses only the
//! rest of its own message; staged bytes stay invisible until commit; and
//! nothing a peer writes makes the reader panic, read past the ring or
//! accept a record longer than the ring.

mod common;

use common::Region;
use proptest::prelude::*;
use std::collections::VecDeque;
use xensock_proto::layout::MIN_RING_ORDER;
use xensock_proto::record::{
    self, max_payload, Next, RecordError, RecordHeader, RECORD_FLAG_EOR, RECORD_HEADER_SIZE,
};
use xensock_proto::ring::{Consumer, Producer};

fn message(seq: usize, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (seq.wrapping_mul(31) ^ i.wrapping_mul(7)) as u8)
        .collect()
}

#[derive(Clone, Debug)]
enum Op {
    /// send a message of this size (modulo what the ring can ever hold)
    Send(usize, bool),
    /// receive with a buffer of this size
    Recv(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        ((0usize..20_000), any::<bool>()).prop_map(|(n, eor)| Op::Send(n, eor)),
        (0usize..20_000).prop_map(Op::Recv),
    ]
}

fn start() -> impl Strategy<Value = u32> {
    prop_oneof![Just(0u32), Just(u32::MAX - 50), any::<u32>()]
}

proptest! {
    #[test]
    fn messages_come_out_whole_and_in_order(
        order in MIN_RING_ORDER..=15u32,
        start in start(),
        ops in proptest::collection::vec(op(), 1..150),
    ) {
        let region = Region::new(order, start);
        let mut tx = Producer::resume(region.ring, start);
        let mut rx = Consumer::resume(region.ring, start);
        let cap = tx.capacity();
        let mut in_flight: VecDeque<(usize, Vec<u8>, bool)> = VecDeque::new();
        let mut seq = 0usize;
        for op in ops {
            match op {
                Op::Send(n, eor) => {
                    let n = n % (max_payload(cap) as usize + 1);
                    let m = message(seq, n);
                    let flags = if eor { RECORD_FLAG_EOR } else { 0 };
                    let used: u32 = in_flight.iter().map(|(_, m, _)| m.len() as u32 + RECORD_HEADER_SIZE).sum();
                    let fits = used + RECORD_HEADER_SIZE + n as u32 <= cap;
                    prop_assert_eq!(record::write_record(&mut tx, flags, &m), Ok(fits));
                    if fits {
                        in_flight.push_back((seq, m, eor));
                        seq += 1;
                    }
                }
                Op::Recv(room) => {
                    match record::next_record(&rx).unwrap() {
                        Next::Incomplete { need } => {
                            prop_assert!(in_flight.is_empty());
                            prop_assert_eq!(need, RECORD_HEADER_SIZE);
                        }
                        Next::Ready(h) => {
                            let (_, want, eor) = in_flight.pop_front().unwrap();
                            prop_assert_eq!(h.len as usize, want.len());
                            prop_assert_eq!(h.flags & RECORD_FLAG_EOR != 0, eor);
                            let mut buf = vec![0u8; room];
                            let mut off = 0usize;
                            // read in pieces, as a host copying to user memory does
                            while off < room.min(want.len()) {
                                let k = (room.min(want.len()) - off).min(4096);
                                let got = record::read_payload(&rx, &h, off as u32, &mut buf[off..off + k]).unwrap();
                                prop_assert_eq!(got, k);
                                off += got;
                            }
                            let n = room.min(want.len());
                            prop_assert_eq!(&buf[..n], &want[..n]);
                            record::consume(&mut rx, &h).unwrap();
                        }
                    }
                }
            }
        }
        // drain: everything still in flight comes out whole
        while let Some((_, want, _)) = in_flight.pop_front() {
            let Next::Ready(h) = record::next_record(&rx).unwrap() else {
                return Err(TestCaseError::fail("record missing"));
            };
            let mut buf = vec![0u8; want.len()];
            prop_assert_eq!(record::read_payload(&rx, &h, 0, &mut buf).unwrap(), want.len());
            prop_assert_eq!(buf, want);
            record::consume(&mut rx, &h).unwrap();
        }
        prop_assert_eq!(rx.readable(), Ok(0));
    }

    #[test]
    fn staged_bytes_are_invisible_until_commit(
        order in MIN_RING_ORDER..=13u32,
        start in start(),
        len in 0usize..8000,
        pieces in 1usize..7,
    ) {
        let region = Region::new(order, start);
        let mut tx = Producer::resume(region.ring, start);
        let rx = Consumer::resume(region.ring, start);
        let len = len % (max_payload(tx.capacity()) as usize + 1);
        let m = message(1, len);
        prop_assert!(record::fits(&mut tx, len as u32).unwrap());
        let step = len.div_ceil(pieces).max(1);
        for (k, chunk) in m.chunks(step).enumerate() {
            prop_assert!(record::stage_payload(&mut tx, (k * step) as u32, chunk));
            prop_assert_eq!(rx.readable(), Ok(0));
        }
        let header = RecordHeader { len: len as u32, flags: 0 };
        prop_assert!(record::commit(&mut tx, header));
        prop_assert_eq!(rx.readable(), Ok(RECORD_HEADER_SIZE + len as u32));
        let Next::Ready(h) = record::next_record(&rx).unwrap() else {
            return Err(TestCaseError::fail("record missing"));
        };
        let mut buf = vec![0u8; len];
        prop_assert_eq!(record::read_payload(&rx, &h, 0, &mut buf).unwrap(), len);
        prop_assert_eq!(buf, m);
    }

    /// A hostile peer writes arbitrary bytes (published in arbitrary
    /// pieces): the reader only ever gets validated records no longer than
    /// the ring, an error, or a request to wait; never a panic.
    #[test]
    fn hostile_bytes_never_yield_an_invalid_record(
        order in MIN_RING_ORDER..=13u32,
        start in start(),
        bytes in proptest::collection::vec(any::<u8>(), 0..6000),
        cut in 0usize..6000,
    ) {
        let region = Region::new(order, start);
        let mut tx = Producer::resume(region.ring, start);
        let mut rx = Consumer::resume(region.ring, start);
        let cap = tx.capacity();
        let bytes = &bytes[..bytes.len().min(cap as usize)];
        let cut = cut.min(bytes.len());
        tx.write(&bytes[..cut]).unwrap();
        let mut published = cut;
        for _ in 0..64 {
            match record::next_record(&rx) {
                Ok(Next::Ready(h)) => {
                    prop_assert!(h.len <= max_payload(cap));
                    prop_assert_eq!(h.flags & !RECORD_FLAG_EOR, 0);
                    prop_assert!(rx.readable().unwrap() >= h.total());
                    record::consume(&mut rx, &h).unwrap();
                }
                Ok(Next::Incomplete { need }) => {
                    prop_assert!(need >= RECORD_HEADER_SIZE && need <= cap);
                    if published == bytes.len() {
                        break;
                    }
                    published += tx.write(&bytes[published..]).unwrap();
                }
                Err(RecordError::TooLong { max, .. }) => {
                    prop_assert_eq!(max, max_payload(cap));
                    break;
                }
                Err(RecordError::UnknownFlags(f)) => {
                    prop_assert!(f & !RECORD_FLAG_EOR != 0);
                    break;
                }
                Err(e) => {
                    return Err(TestCaseError::fail(format!("ring error from honest indices: {e}")));
                }
            }
        }
    }
}

#[test]
fn emsgsize_is_decided_by_the_ring_not_the_free_space() {
    let region = Region::new(12, 0);
    let mut tx = Producer::new(region.ring);
    let big = vec![0u8; 4096 - 8 + 1];
    assert!(matches!(
        record::write_record(&mut tx, 0, &big),
        Err(RecordError::TooLong {
            len: 4089,
            max: 4088
        })
    ));
    assert_eq!(record::write_record(&mut tx, 0, &big[..4088]), Ok(true));
    // now full: the next one waits (Ok(false)), it is not too long
    assert_eq!(record::write_record(&mut tx, 0, &big[..1]), Ok(false));
}
