//! proto's frames over a non-blocking TCP leg: an outgoing queue that never
//! splits a frame between writers, a zero-extra-copy path for `Data`, and an
//! incoming reader that takes one frame at a time (never reading past it,
//! so a `Data` payload can go straight from the socket into the caller's
//! buffer) and decodes strictly.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;

use xensock_proto::ctrl::{
    decode, decode_header, encode_data_prefix, Channel, Kind, Message, DATA_PREFIX_LEN, HEADER_LEN,
    MAX_CONTROL_FRAME, MAX_DATA_PAYLOAD,
};

/// A frame read from a leg. `Data` carries only its position: the payload
/// is still in the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Frame {
    Data { offset: u64, len: u64 },
    RingFrom { epoch: u32, offset: u64 },
    TxFreeze { epoch: u32, offset: u64 },
    Consumed { epoch: u32, offset: u64 },
    Fin { offset: u64 },
    Reset,
}

/// What reading a leg gave.
#[derive(Debug)]
pub(super) enum Incoming {
    Frame(Frame),
    WouldBlock,
    /// The peer closed the leg (at a frame boundary or not).
    Closed,
}

pub(super) fn protocol_error(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// Reads frames one by one from a non-blocking stream.
pub(super) struct Inbox {
    buf: [u8; MAX_CONTROL_FRAME],
    have: usize,
}

impl Inbox {
    pub(super) fn new() -> Self {
        Inbox {
            buf: [0; MAX_CONTROL_FRAME],
            have: 0,
        }
    }

    /// Bytes of the next frame already read from the socket.
    pub(super) fn buffered(&self) -> usize {
        self.have
    }

    /// The next frame addressed to `conn_id`, reading no byte past it.
    /// Malformed frames, frames for another connection and `TcpHello` after
    /// authentication are `InvalidData`.
    pub(super) fn next(&mut self, mut sock: &TcpStream, conn_id: u32) -> io::Result<Incoming> {
        let mut drained = false;
        loop {
            let want = if self.have < HEADER_LEN {
                // The whole prefix of a `Data` frame in one system call:
                // every frame but `Reset` is at least that long, and
                // nothing may follow a `Reset`.
                DATA_PREFIX_LEN
            } else {
                let hdr =
                    decode_header(&self.buf[..self.have], Channel::Tcp).map_err(protocol_error)?;
                if hdr.conn_id != conn_id {
                    return Err(protocol_error(format!(
                        "frame for connection {} on the leg of {conn_id}",
                        hdr.conn_id
                    )));
                }
                match hdr.kind {
                    Kind::Data => DATA_PREFIX_LEN,
                    Kind::TcpHello => return Err(protocol_error("TcpHello on an open leg")),
                    _ => hdr.frame_len(),
                }
            };
            if self.have >= want {
                // More than the frame only after `read_payload` took the
                // next 16 bytes along: every frame but `Reset` is at least
                // that long, and nothing may follow a `Reset`.
                let frame = self.parse(want)?;
                if self.have > want && frame != Frame::Reset {
                    return Err(protocol_error("frame shorter than its header says"));
                }
                self.have = 0;
                return Ok(Incoming::Frame(frame));
            }
            if drained {
                // The last read took less than asked: the socket is empty,
                // another read would only say so.
                return Ok(Incoming::WouldBlock);
            }
            let asked = want - self.have;
            match sock.read(&mut self.buf[self.have..want]) {
                Ok(0) => return Ok(Incoming::Closed),
                Ok(n) => {
                    self.have += n;
                    drained = n < asked;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Incoming::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Reads payload bytes of the current `Data` frame (`payload_left` of
    /// them still in the socket) into `dst`. When `dst` takes the rest of
    /// the payload, the next frame's first bytes come along in the same
    /// system call. Returns the payload bytes read (0: the leg closed) and
    /// whether the read took less than it asked for (the socket is empty
    /// now: the next read can wait for it first).
    pub(super) fn read_payload(
        &mut self,
        mut sock: &TcpStream,
        dst: &mut [u8],
        payload_left: u64,
    ) -> io::Result<(usize, bool)> {
        let left = usize::try_from(payload_left).unwrap_or(usize::MAX);
        if self.have != 0 || dst.len() < left {
            let n = dst.len().min(left);
            let got = sock.read(&mut dst[..n])?;
            return Ok((got, got < n));
        }
        let (payload, prefix) = (&mut dst[..left], &mut self.buf[..DATA_PREFIX_LEN]);
        let n = sock.read_vectored(&mut [IoSliceMut::new(payload), IoSliceMut::new(prefix)])?;
        if n > left {
            self.have = n - left;
        }
        Ok((n.min(left), n < left + DATA_PREFIX_LEN))
    }

    fn parse(&self, len: usize) -> io::Result<Frame> {
        let bytes = &self.buf[..len];
        let hdr = decode_header(bytes, Channel::Tcp).map_err(protocol_error)?;
        if hdr.kind == Kind::Data {
            let mut off = [0u8; 8];
            off.copy_from_slice(&bytes[HEADER_LEN..DATA_PREFIX_LEN]);
            return Ok(Frame::Data {
                offset: u64::from_le_bytes(off),
                len: u64::from(hdr.body_len) - 8,
            });
        }
        let (msg, _) = decode(bytes, Channel::Tcp).map_err(protocol_error)?;
        Ok(match msg {
            Message::RingFrom { epoch, offset, .. } => Frame::RingFrom { epoch, offset },
            Message::TxFreeze { epoch, offset, .. } => Frame::TxFreeze { epoch, offset },
            Message::Consumed { epoch, offset, .. } => Frame::Consumed { epoch, offset },
            Message::Fin { offset, .. } => Frame::Fin { offset },
            Message::Reset { .. } => Frame::Reset,
            other => return Err(protocol_error(format!("{:?} on a TCP leg", other.kind()))),
        })
    }
}

/// Frames waiting to be written to a leg, oldest first.
#[derive(Default)]
pub(super) struct Outbox {
    buf: Vec<u8>,
    pos: usize,
}

impl Outbox {
    pub(super) fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }

    /// Bytes still to write.
    pub(super) fn len(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(super) fn push(&mut self, msg: &Message<'_>) {
        let start = self.buf.len();
        self.buf.resize(start + msg.encoded_len(), 0);
        // Cannot fail: the buffer was sized for the frame and callers never
        // build a Data frame above MAX_DATA_PAYLOAD (push_data splits).
        let _ = msg.encode(&mut self.buf[start..]);
    }

    /// Queues `bytes` as `Data` frames starting at stream `offset`.
    pub(super) fn push_data(&mut self, conn_id: u32, offset: u64, bytes: &[u8]) {
        for (k, chunk) in bytes.chunks(MAX_DATA_PAYLOAD).enumerate() {
            self.push(&Message::Data {
                conn_id,
                offset: offset + (k * MAX_DATA_PAYLOAD) as u64,
                payload: chunk,
            });
        }
    }

    /// Puts `msg` before everything queued (the leg's `TcpHello`).
    pub(super) fn push_front(&mut self, msg: &Message<'_>) {
        let mut front = Outbox::default();
        front.push(msg);
        front.buf.extend_from_slice(&self.buf[self.pos..]);
        *self = front;
    }

    /// Writes as much as the socket takes now.
    pub(super) fn flush(&mut self, mut sock: &TcpStream) -> io::Result<()> {
        while !self.is_empty() {
            match sock.write(&self.buf[self.pos..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.pos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        if self.is_empty() {
            self.buf.clear();
            self.pos = 0;
        } else if self.pos > (1 << 20) && self.pos > self.buf.len() / 2 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        Ok(())
    }
}

/// Frames per vectored write on the direct path (16 x 64 KiB).
const DIRECT_FRAMES: usize = 16;

/// Sends `data` as `Data` frames from stream `offset` straight from the
/// caller's buffer with one vectored write, when nothing else is queued.
/// Returns the payload bytes committed: whole frames written, plus a
/// partly written frame whose rest went into `outbox` (it must be finished
/// before anything else is sent on the leg).
pub(super) fn send_data_direct(
    mut sock: &TcpStream,
    outbox: &mut Outbox,
    conn_id: u32,
    offset: u64,
    data: &[u8],
) -> io::Result<usize> {
    debug_assert!(outbox.is_empty());
    let chunks: Vec<&[u8]> = data.chunks(MAX_DATA_PAYLOAD).take(DIRECT_FRAMES).collect();
    let mut prefixes = [[0u8; DATA_PREFIX_LEN]; DIRECT_FRAMES];
    let mut at = offset;
    for (p, c) in prefixes.iter_mut().zip(&chunks) {
        *p = encode_data_prefix(conn_id, at, c.len()).map_err(protocol_error)?;
        at += c.len() as u64;
    }
    let mut iov = Vec::with_capacity(2 * chunks.len());
    for (p, c) in prefixes.iter().zip(&chunks) {
        iov.push(IoSlice::new(p));
        iov.push(IoSlice::new(c));
    }
    let mut written = loop {
        match sock.write_vectored(&iov) {
            Ok(n) => break n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    };
    let mut committed = 0;
    for (p, c) in prefixes.iter().zip(&chunks) {
        if written == 0 {
            break;
        }
        let frame = DATA_PREFIX_LEN + c.len();
        if written < frame {
            // Finish this frame from the queue.
            if written < DATA_PREFIX_LEN {
                outbox.buf.extend_from_slice(&p[written..]);
                outbox.buf.extend_from_slice(c);
            } else {
                outbox
                    .buf
                    .extend_from_slice(&c[written - DATA_PREFIX_LEN..]);
            }
        }
        committed += c.len();
        written = written.saturating_sub(frame);
    }
    Ok(committed)
}
