// SPDX-License-Identifier: MIT OR Apache-2.0
//! The control stream (`docs/protocol.md` 5.4): the frames that come back
//! to a sender on the leg it connected, about both its directions. Both
//! hosts read a header ([`frame_len`]), then the whole frame
//! ([`decode_frame`]), and act on what it is for: an answer for their
//! sending direction, or a frame their receiving direction takes in order
//! ([`RxControl`]). Anything else on the stream is a breach: the host
//! resets the connection.

use core::fmt;

use super::ctrl::{decode, decode_header, Channel, DecodeError, Kind, Message, MAX_CONTROL_FRAME};
use super::switch::{Epoch, RxControl};

/// What a control frame on the stream is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LegControl {
    /// For the sending direction: the receiver holds everything below
    /// `offset`, and ring `epoch` is dead.
    Consumed {
        /// The ring the receiver left (or never took).
        epoch: Epoch,
        /// The receiver's stream position.
        offset: u64,
    },
    /// The peer reset the connection.
    Reset,
    /// For the receiving direction, queued in the order it came.
    Receiving(RxControl),
}

/// Why a control stream is in breach.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlStreamError {
    /// The frame does not decode.
    Malformed(DecodeError),
    /// A frame for another connection.
    OtherConnection {
        /// The connection it names.
        conn_id: u32,
    },
    /// A kind that has no place on a control stream (a second hello, a
    /// framed `Data`, a link frame).
    Misplaced(Kind),
}

impl fmt::Display for ControlStreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlStreamError::Malformed(e) => {
                write!(f, "malformed frame on a control stream: {e}")
            }
            ControlStreamError::OtherConnection { conn_id } => {
                write!(
                    f,
                    "frame for connection {conn_id} on another's control stream"
                )
            }
            ControlStreamError::Misplaced(k) => write!(f, "{k:?} on a control stream"),
        }
    }
}

/// Whether frames of `kind` may come on a control stream.
fn belongs(kind: Kind) -> bool {
    matches!(
        kind,
        Kind::Consumed | Kind::Reset | Kind::RawFrom | Kind::RingFrom | Kind::TxFreeze | Kind::Fin
    )
}

/// The length of the frame whose header `header` starts (at least
/// [`super::ctrl::HEADER_LEN`] bytes) on the control stream of our
/// connection `conn_id`: at most [`MAX_CONTROL_FRAME`] bytes.
pub fn frame_len(header: &[u8], conn_id: u32) -> Result<usize, ControlStreamError> {
    let h = decode_header(header, Channel::Tcp).map_err(ControlStreamError::Malformed)?;
    if !belongs(h.kind) {
        return Err(ControlStreamError::Misplaced(h.kind));
    }
    if h.conn_id != conn_id {
        return Err(ControlStreamError::OtherConnection { conn_id: h.conn_id });
    }
    // every kind that belongs has a fixed body of at most 16 bytes
    debug_assert!(h.frame_len() <= MAX_CONTROL_FRAME);
    Ok(h.frame_len())
}

/// What the whole frame `frame` on the control stream of our connection
/// `conn_id` is for.
pub fn decode_frame(frame: &[u8], conn_id: u32) -> Result<LegControl, ControlStreamError> {
    frame_len(frame, conn_id)?;
    let (m, _) = decode(frame, Channel::Tcp).map_err(ControlStreamError::Malformed)?;
    Ok(match m {
        Message::Consumed { epoch, offset, .. } => LegControl::Consumed { epoch, offset },
        Message::Reset { .. } => LegControl::Reset,
        Message::RawFrom { offset, .. } => LegControl::Receiving(RxControl::RawFrom { offset }),
        Message::RingFrom { epoch, offset, .. } => {
            LegControl::Receiving(RxControl::RingFrom { epoch, offset })
        }
        Message::TxFreeze { epoch, offset, .. } => {
            LegControl::Receiving(RxControl::TxFreeze { epoch, offset })
        }
        Message::Fin { offset, .. } => LegControl::Receiving(RxControl::Fin { offset }),
        other => return Err(ControlStreamError::Misplaced(other.kind())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctrl::{ResetReason, HEADER_LEN};

    fn encoded(m: &Message<'_>) -> ([u8; MAX_CONTROL_FRAME], usize) {
        let mut b = [0u8; MAX_CONTROL_FRAME];
        let n = m.encode(&mut b).unwrap();
        (b, n)
    }

    #[test]
    fn each_control_frame_is_for_one_direction() {
        let cases = [
            (
                Message::Consumed {
                    conn_id: 5,
                    epoch: 2,
                    offset: 9,
                },
                LegControl::Consumed {
                    epoch: 2,
                    offset: 9,
                },
            ),
            (
                Message::Reset {
                    conn_id: 5,
                    reason: ResetReason::Abort,
                },
                LegControl::Reset,
            ),
            (
                Message::RingFrom {
                    conn_id: 5,
                    epoch: 3,
                    offset: 7,
                },
                LegControl::Receiving(RxControl::RingFrom {
                    epoch: 3,
                    offset: 7,
                }),
            ),
            (
                Message::Fin {
                    conn_id: 5,
                    offset: 1,
                },
                LegControl::Receiving(RxControl::Fin { offset: 1 }),
            ),
        ];
        for (m, want) in cases {
            let (b, n) = encoded(&m);
            assert_eq!(frame_len(&b[..HEADER_LEN], 5), Ok(n));
            assert_eq!(decode_frame(&b[..n], 5), Ok(want));
        }
    }

    #[test]
    fn another_connections_frames_hellos_and_link_frames_are_a_breach() {
        let (b, n) = encoded(&Message::Fin {
            conn_id: 6,
            offset: 1,
        });
        assert_eq!(
            decode_frame(&b[..n], 5),
            Err(ControlStreamError::OtherConnection { conn_id: 6 })
        );
        let (b, _) = encoded(&Message::TcpHello {
            conn_id: 5,
            cookie: 1,
        });
        assert_eq!(
            frame_len(&b[..HEADER_LEN], 5),
            Err(ControlStreamError::Misplaced(Kind::TcpHello))
        );
        assert!(matches!(
            frame_len(&[0xff; HEADER_LEN], 5),
            Err(ControlStreamError::Malformed(_))
        ));
    }
}
