// SPDX-License-Identifier: MIT OR Apache-2.0
//! What travels on a BTL connection. Each connection carries one
//! direction: the connecting rank sends a [`Hello`] naming itself, then
//! frames; the accepting rank only reads. A frame is an 8-byte
//! [`FrameHeader`] and its payload (one Open MPI fragment, delivered to
//! the active-message callback of its tag).

use crate::error::Error;

/// Bytes of a hello.
pub const HELLO_LEN: usize = 16;
/// Bytes of a frame header.
pub const HEADER_LEN: usize = 8;
const MAGIC: [u8; 4] = *b"XSMB";
const VERSION: u16 = 1;

/// The first bytes on a connection: who is sending.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The sender's Open MPI process name (jobid << 32 | vpid).
    pub name: u64,
}

impl Hello {
    /// The hello's bytes.
    pub fn encode(&self) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        b[..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[8..].copy_from_slice(&self.name.to_le_bytes());
        b
    }

    /// Reads a hello, refusing anything but this version's.
    pub fn decode(b: &[u8; HELLO_LEN]) -> Result<Hello, Error> {
        if b[..4] != MAGIC {
            return Err(Error::Protocol(
                "the connection does not start with a BTL hello".into(),
            ));
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != VERSION || b[6..8] != [0, 0] {
            return Err(Error::Protocol(format!(
                "hello of version {version}, this BTL speaks {VERSION}"
            )));
        }
        let mut name = [0u8; 8];
        name.copy_from_slice(&b[8..]);
        Ok(Hello {
            name: u64::from_le_bytes(name),
        })
    }
}

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// A fragment for the active-message callback of `tag`.
    Data,
    /// The sender closes the connection on purpose (`del_procs`,
    /// finalize): end-of-stream after it is not a lost peer.
    Bye,
}

/// A frame's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Payload bytes that follow.
    pub len: u32,
    /// Open MPI's active-message tag.
    pub tag: u8,
    /// Data or bye.
    pub kind: FrameKind,
}

impl FrameHeader {
    /// A data frame of `len` bytes for `tag`.
    pub fn data(tag: u8, len: usize) -> Result<FrameHeader, Error> {
        let len = u32::try_from(len).map_err(|_| Error::TooLarge {
            len,
            limit: u32::MAX as usize,
        })?;
        Ok(FrameHeader {
            len,
            tag,
            kind: FrameKind::Data,
        })
    }

    /// The bye frame.
    pub fn bye() -> FrameHeader {
        FrameHeader {
            len: 0,
            tag: 0,
            kind: FrameKind::Bye,
        }
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..4].copy_from_slice(&self.len.to_le_bytes());
        b[4] = self.tag;
        b[5] = match self.kind {
            FrameKind::Data => 0,
            FrameKind::Bye => 1,
        };
        b
    }

    /// Reads a header the peer wrote, checked against what this rank
    /// accepts (`limit` payload bytes): a peer writing garbage is refused
    /// here, never trusted further.
    pub fn decode(b: &[u8; HEADER_LEN], limit: usize) -> Result<FrameHeader, Error> {
        let len = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        let kind = match b[5] {
            0 => FrameKind::Data,
            1 if len == 0 => FrameKind::Bye,
            k => {
                return Err(Error::Protocol(format!(
                    "frame of kind {k} and {len} bytes"
                )))
            }
        };
        if b[6..8] != [0, 0] {
            return Err(Error::Protocol(
                "frame header with reserved bytes set".into(),
            ));
        }
        if len as usize > limit {
            return Err(Error::TooLarge {
                len: len as usize,
                limit,
            });
        }
        Ok(FrameHeader {
            len,
            tag: b[4],
            kind,
        })
    }
}

/// The first frame in `bytes` (what has arrived and not been delivered):
/// its header and its whole size (header and payload), `None` until all
/// of it is there, or the error that ends the connection.
pub fn next_frame(bytes: &[u8], limit: usize) -> Result<Option<(FrameHeader, usize)>, Error> {
    let Some(head) = bytes.first_chunk::<HEADER_LEN>() else {
        return Ok(None);
    };
    let h = FrameHeader::decode(head, limit)?;
    let size = HEADER_LEN + h.len as usize;
    Ok((bytes.len() >= size).then_some((h, size)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn hello_round_trips_and_refuses_strangers() {
        let h = Hello {
            name: 0x1234_5678_0000_0003,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        let mut b = h.encode();
        b[0] = b'Y';
        assert!(Hello::decode(&b).is_err());
        let mut b = h.encode();
        b[4] = 2;
        assert!(Hello::decode(&b).is_err());
    }

    #[test]
    fn headers_round_trip_and_respect_the_limit() {
        let h = FrameHeader::data(0x41, 1000).unwrap();
        assert_eq!(FrameHeader::decode(&h.encode(), 1000).unwrap(), h);
        assert!(matches!(
            FrameHeader::decode(&h.encode(), 999),
            Err(Error::TooLarge {
                len: 1000,
                limit: 999
            })
        ));
        let bye = FrameHeader::bye();
        assert_eq!(FrameHeader::decode(&bye.encode(), 0).unwrap(), bye);
        let mut b = bye.encode();
        b[0] = 1; // a bye with a payload
        assert!(FrameHeader::decode(&b, 10).is_err());
    }

    #[test]
    fn frames_come_out_whole_and_garbage_is_refused() {
        let mut stream = FrameHeader::data(7, 3).unwrap().encode().to_vec();
        stream.extend_from_slice(b"abc");
        stream.extend_from_slice(&FrameHeader::bye().encode());
        assert_eq!(next_frame(&stream[..5], 64).unwrap(), None);
        assert_eq!(next_frame(&stream[..10], 64).unwrap(), None);
        let (h, size) = next_frame(&stream, 64).unwrap().unwrap();
        assert_eq!((h.tag, h.len, size), (7, 3, 11));
        let (bye, size) = next_frame(&stream[11..], 64).unwrap().unwrap();
        assert_eq!((bye.kind, size), (FrameKind::Bye, HEADER_LEN));
        // a header announcing more than this rank accepts ends the connection
        assert!(next_frame(&[0xff; 16], 64).is_err());
        assert!(next_frame(&[0, 0, 0, 0, 1, 9, 0, 0], 64).is_err());
    }

    proptest! {
        /// However a stream of frames is cut into reads, the frames that
        /// come out are the ones that went in.
        #[test]
        fn frames_survive_any_cut(
            frames in proptest::collection::vec((any::<u8>(), proptest::collection::vec(any::<u8>(), 0..40)), 0..8),
            cuts in proptest::collection::vec(1usize..50, 0..20),
        ) {
            let mut stream = Vec::new();
            for (tag, body) in &frames {
                stream.extend_from_slice(&FrameHeader::data(*tag, body.len()).unwrap().encode());
                stream.extend_from_slice(body);
            }
            let mut got = Vec::new();
            let (mut start, mut end) = (0, 0);
            let mut cuts = cuts.into_iter().chain(std::iter::repeat(7));
            while start < stream.len() {
                end = (end + cuts.next().unwrap_or(7)).min(stream.len());
                while let Some((h, size)) = next_frame(&stream[start..end], 64).unwrap() {
                    got.push((h.tag, stream[start + HEADER_LEN..start + size].to_vec()));
                    start += size;
                }
            }
            prop_assert_eq!(got, frames);
        }

        #[test]
        fn any_header_bytes_decode_or_fail_cleanly(b in any::<[u8; HEADER_LEN]>(), limit in 0usize..1 << 20) {
            if let Ok(h) = FrameHeader::decode(&b, limit) {
                prop_assert!(h.len as usize <= limit);
                prop_assert_eq!(h.encode(), b);
            }
        }
    }
}
