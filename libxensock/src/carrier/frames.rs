//! proto's frames over a non-blocking TCP leg: an outgoing queue that never
//! splits a frame between writers, a zero-extra-copy path for `Data`, and an
//! incoming reader that decodes strictly and reads a `Data` payload straight
//! from the socket into the caller's buffer, taking the bytes that follow it
//! along in the same system call.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::TcpStream;

use socket2::SockRef;

use xensock_proto::ctrl::{
    decode, decode_header, encode_data_prefix, Channel, FrameHeader, Kind, Message,
    DATA_PREFIX_LEN, HEADER_LEN, MAX_CONTROL_FRAME, MAX_DATA_PAYLOAD,
};

/// A frame read from a leg. `Data` carries only its position: the payload
/// is still in the socket (or partly in the [`Inbox`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    Data { offset: u64, len: u64 },
    RingFrom { epoch: u32, offset: u64 },
    TxFreeze { epoch: u32, offset: u64 },
    Consumed { epoch: u32, offset: u64 },
    Fin { offset: u64 },
    Reset,
}

/// What reading a leg gave.
#[derive(Debug)]
pub(crate) enum Incoming {
    Frame(Frame),
    WouldBlock,
    /// The peer closed the leg (at a frame boundary or not).
    Closed,
}

pub(super) fn protocol_error(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// How many bytes past a `Data` payload the receiving leg's reader takes
/// along in the payload's system call. A 64 KiB write is a 65527-byte frame
/// and a 9-byte one (the wire's 16-bit length): without the look-ahead a
/// 64 KiB read made two or three reads (payload, the small frame, a prefix
/// that had not come along), where a system call costs 21-29 us in a PV
/// guest under emulation. With it, the small frame and the next prefix
/// come in the same call, for a copy of at most this many bytes.
pub(crate) const RX_LOOKAHEAD: usize = 4096;

/// The bytes [`Inbox::next`] needs of a frame with this header: for
/// `Data`, its prefix (the payload is read by `read_payload`).
fn needed(h: &FrameHeader) -> usize {
    if h.kind == Kind::Data {
        DATA_PREFIX_LEN
    } else {
        h.frame_len()
    }
}

/// Reads frames from a non-blocking stream. Bytes read but not yet taken
/// (the next frames, or the start of the current `Data` payload) wait in
/// `buf[start..end]`, in stream order: they come before anything still in
/// the socket.
pub(crate) struct Inbox {
    /// Usually `cap` long; longer while it holds bytes that
    /// [`Inbox::next_with_payload`] read past a short frame into the
    /// caller's buffer and moved back.
    buf: Vec<u8>,
    /// How much a read into the inbox asks for: the look-ahead (or a whole
    /// control frame).
    cap: usize,
    start: usize,
    end: usize,
    /// The last read from the socket took less than it asked for: the
    /// socket was empty then.
    socket_was_empty: bool,
    /// Reads of the socket so far (see [`Inbox::reads`]).
    reads: u64,
}

impl Inbox {
    /// An inbox that reads up to `lookahead` bytes past a `Data` payload
    /// (and always holds a whole control frame).
    pub(crate) fn new(lookahead: usize) -> Self {
        let cap = lookahead.max(MAX_CONTROL_FRAME);
        Inbox {
            buf: vec![0; cap],
            cap,
            start: 0,
            end: 0,
            socket_was_empty: false,
            reads: 0,
        }
    }

    /// Bytes read from the socket and not taken yet.
    pub(crate) fn buffered(&self) -> usize {
        self.end - self.start
    }

    /// Nothing is buffered and the last read found the socket empty: the
    /// next read can wait for the socket first.
    pub(crate) fn drained(&self) -> bool {
        self.socket_was_empty && self.buffered() == 0
    }

    /// How many times the socket has been read: a caller that already read
    /// it once for a call and holds bytes for its reader returns them
    /// rather than read again (see `Shared::read` in the engine).
    pub(crate) fn reads(&self) -> u64 {
        self.reads
    }

    /// Copies payload bytes of the current `Data` frame that are already
    /// buffered into `dst` (no system call); how many.
    pub(crate) fn take_buffered(&mut self, dst: &mut [u8], payload_left: u64) -> usize {
        let left = usize::try_from(payload_left).unwrap_or(usize::MAX);
        let n = dst.len().min(left).min(self.buffered());
        dst[..n].copy_from_slice(&self.buf[self.start..self.start + n]);
        self.take(n);
        n
    }

    /// Whether the buffered bytes hold a whole frame (for `Data`, its
    /// prefix), so [`Inbox::next`] returns it or an error without a system
    /// call.
    pub(crate) fn frame_ready(&self) -> bool {
        let have = &self.buf[self.start..self.end];
        match decode_header(have, Channel::Tcp) {
            Ok(h) => have.len() >= needed(&h),
            Err(_) => have.len() >= HEADER_LEN,
        }
    }

    fn take(&mut self, n: usize) {
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            self.buf.truncate(self.cap);
        }
    }

    /// The next frame addressed to `conn_id`; for `Data`, the prefix only.
    /// A read for it takes whatever else fits the inbox along (a small
    /// message's payload comes with its prefix). Malformed frames, frames
    /// for another connection and `TcpHello` after authentication are
    /// `InvalidData`.
    pub(crate) fn next(&mut self, mut sock: &TcpStream, conn_id: u32) -> io::Result<Incoming> {
        let mut drained = false;
        loop {
            let have = self.end - self.start;
            let want = if have < HEADER_LEN {
                // Every frame but `Reset` is at least as long as a `Data`
                // prefix; a `Reset` is the last frame.
                DATA_PREFIX_LEN
            } else {
                needed(&self.check_header(&self.buf[self.start..self.end], conn_id)?)
            };
            if have >= want {
                let frame = self.parse(want)?;
                self.take(want);
                return Ok(Incoming::Frame(frame));
            }
            if drained {
                // The last read took less than asked: the socket is empty,
                // another read would only say so.
                return Ok(Incoming::WouldBlock);
            }
            // Less than a frame is here (want <= MAX_CONTROL_FRAME): a cheap
            // move makes the whole inbox free for the read.
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = have;
            let asked = self.cap - have;
            self.reads += 1;
            match sock.read(&mut self.buf[have..self.cap]) {
                Ok(0) => return Ok(Incoming::Closed),
                Ok(n) => {
                    self.end += n;
                    drained = n < asked;
                    self.socket_was_empty = drained;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.socket_was_empty = true;
                    return Ok(Incoming::WouldBlock);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// [`Inbox::next`] for an empty inbox, with a `Data` frame's payload
    /// read straight into `dst` in the same system call: one `readv` of the
    /// next prefix, `dst` and the look-ahead. A reader that keeps up with
    /// its writer finds the leg empty at the end of each write, and reading
    /// the next prefix (with what fits the inbox) and then the rest of its
    /// payload made that two calls and a copy out of the inbox. Returns the
    /// frame and how many of its payload bytes are in `dst`; bytes read
    /// past the end of a frame (a `Data` frame shorter than `dst`, or any
    /// other frame) go back into the inbox, in order, for the next call.
    /// Only for a reader that may take `Data` now: its bytes are in `dst`.
    pub(crate) fn next_with_payload(
        &mut self,
        mut sock: &TcpStream,
        conn_id: u32,
        dst: &mut [u8],
    ) -> io::Result<(Incoming, usize)> {
        if self.buffered() != 0 || dst.is_empty() {
            return Ok((self.next(sock, conn_id)?, 0));
        }
        self.start = 0;
        self.end = 0;
        let (prefix, lookahead) = self.buf[..self.cap].split_at_mut(DATA_PREFIX_LEN);
        let asked = DATA_PREFIX_LEN + dst.len() + lookahead.len();
        let n = loop {
            self.reads += 1;
            match sock.read_vectored(&mut [
                IoSliceMut::new(prefix),
                IoSliceMut::new(dst),
                IoSliceMut::new(lookahead),
            ]) {
                Ok(0) => return Ok((Incoming::Closed, 0)),
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.socket_was_empty = true;
                    return Ok((Incoming::WouldBlock, 0));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        self.socket_was_empty = n < asked;
        if n < DATA_PREFIX_LEN {
            // Not a whole prefix: it waits in the inbox for the rest.
            self.end = n;
            return Ok((self.next(sock, conn_id)?, 0));
        }
        let in_dst = (n - DATA_PREFIX_LEN).min(dst.len());
        let past = n - DATA_PREFIX_LEN - in_dst;
        let hdr = self.check_header(&self.buf[..DATA_PREFIX_LEN], conn_id)?;
        if hdr.kind == Kind::Data {
            let frame = self.parse(DATA_PREFIX_LEN)?;
            let Frame::Data { len, .. } = frame else {
                return Err(protocol_error("Data prefix that is not Data"));
            };
            let payload = usize::try_from(len).unwrap_or(usize::MAX).min(in_dst);
            // The look-ahead's bytes follow those in `dst`; what `dst` holds
            // past the payload comes before them.
            self.start = DATA_PREFIX_LEN;
            self.end = DATA_PREFIX_LEN + past;
            self.put_back(&dst[payload..in_dst]);
            return Ok((Incoming::Frame(frame), payload));
        }
        // Another frame: everything read goes back, after its first bytes.
        self.start = DATA_PREFIX_LEN;
        self.end = DATA_PREFIX_LEN + past;
        self.put_back(&dst[..in_dst]);
        self.start = 0;
        Ok((self.next(sock, conn_id)?, 0))
    }

    /// Puts `bytes` in front of the buffered ones, at `start` (the bytes
    /// before it stay as they are).
    fn put_back(&mut self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        let held = self.end - self.start;
        let need = self.start + bytes.len() + held;
        if self.buf.len() < need {
            self.buf.resize(need, 0);
        }
        self.buf
            .copy_within(self.start..self.end, self.start + bytes.len());
        self.buf[self.start..self.start + bytes.len()].copy_from_slice(bytes);
        self.end += bytes.len();
    }

    /// A header's checks, as [`Inbox::next`] makes them.
    fn check_header(&self, bytes: &[u8], conn_id: u32) -> io::Result<FrameHeader> {
        let hdr = decode_header(bytes, Channel::Tcp).map_err(protocol_error)?;
        if hdr.conn_id != conn_id {
            return Err(protocol_error(format!(
                "frame for connection {} on the leg of {conn_id}",
                hdr.conn_id
            )));
        }
        if hdr.kind == Kind::TcpHello {
            return Err(protocol_error("TcpHello on an open leg"));
        }
        if needed(&hdr) > MAX_CONTROL_FRAME {
            return Err(protocol_error(format!(
                "{:?} frame of {} bytes",
                hdr.kind,
                hdr.frame_len()
            )));
        }
        Ok(hdr)
    }

    /// Reads payload bytes of the current `Data` frame (`payload_left` of
    /// them not taken yet) into `dst`: first those already buffered, then
    /// from the socket, with whatever follows the payload (up to the
    /// look-ahead) coming along into the inbox in the same system call.
    /// Returns the payload bytes read (0: the leg closed) and whether the
    /// socket was found empty and nothing is left buffered (the next read
    /// can wait for the socket first): a small message read along with
    /// its prefix says so as well as a read that came up short.
    pub(crate) fn read_payload(
        &mut self,
        mut sock: &TcpStream,
        dst: &mut [u8],
        payload_left: u64,
    ) -> io::Result<(usize, bool)> {
        let left = usize::try_from(payload_left).unwrap_or(usize::MAX);
        let want = dst.len().min(left);
        let copied = want.min(self.buffered());
        dst[..copied].copy_from_slice(&self.buf[self.start..self.start + copied]);
        self.take(copied);
        if self.buffered() != 0 {
            return Ok((copied, false));
        }
        if copied == want {
            return Ok((copied, self.socket_was_empty));
        }
        // Nothing buffered now: the socket's bytes come next, the rest of
        // the payload first.
        let payload = &mut dst[copied..want];
        let asked = payload.len() + self.cap;
        self.reads += 1;
        let n = match sock.read_vectored(&mut [
            IoSliceMut::new(payload),
            IoSliceMut::new(&mut self.buf[..self.cap]),
        ]) {
            Ok(0) if copied > 0 => return Ok((copied, true)),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                self.socket_was_empty = true;
                if copied > 0 {
                    return Ok((copied, true));
                }
                return Err(e);
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted && copied > 0 => {
                return Ok((copied, false))
            }
            Err(e) => return Err(e),
        };
        let into_payload = n.min(want - copied);
        self.end = n - into_payload;
        self.socket_was_empty = n < asked;
        Ok((
            copied + into_payload,
            self.socket_was_empty && self.end == 0,
        ))
    }

    fn parse(&self, len: usize) -> io::Result<Frame> {
        let bytes = &self.buf[self.start..self.start + len];
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
pub(crate) struct Outbox {
    buf: Vec<u8>,
    pos: usize,
}

impl Outbox {
    pub(crate) fn is_empty(&self) -> bool {
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
    pub(crate) fn flush(&mut self, mut sock: &TcpStream) -> io::Result<()> {
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
pub(crate) fn send_data_direct(
    sock: &TcpStream,
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
        // Not `write_vectored` (a `writev`): sending on a leg the peer reset
        // raises SIGPIPE without MSG_NOSIGNAL, and the programs this runs in
        // need not ignore it.
        match SockRef::from(sock).send_vectored_with_flags(&iov, libc::MSG_NOSIGNAL) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;

    const CONN: u32 = 7;

    fn leg_pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let w = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (r, _) = l.accept().unwrap();
        r.set_nonblocking(true).unwrap();
        (w, r)
    }

    fn wait_readable(s: &TcpStream) {
        let mut p = libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut p, 1, 5000) };
        assert_eq!(r, 1, "leg not readable within 5 s");
    }

    /// Waits until `n` bytes are queued on the socket, so a read takes
    /// all of them.
    fn wait_until_queued(s: &TcpStream, n: usize) {
        for _ in 0..5000 {
            let mut queued: libc::c_int = 0;
            // SAFETY: FIONREAD writes one int through the pointer.
            let r = unsafe { libc::ioctl(s.as_raw_fd(), libc::FIONREAD, &mut queued) };
            assert_eq!(r, 0);
            if usize::try_from(queued).unwrap() >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("{n} bytes not queued within 5 s");
    }

    /// What the reader saw: control frames, and each `Data` frame with the
    /// payload bytes it delivered.
    #[derive(Debug, PartialEq, Eq)]
    enum Seen {
        Control(Frame),
        Data(u64, Vec<u8>),
    }

    /// The next frame, and with `combined` its first payload bytes in a
    /// buffer of the next size (`next_with_payload`, when the inbox is empty).
    fn next_frame(
        inbox: &mut Inbox,
        r: &TcpStream,
        combined: bool,
        sizes: &mut impl Iterator<Item = usize>,
    ) -> io::Result<(Incoming, Vec<u8>)> {
        if !combined || inbox.buffered() != 0 {
            return Ok((inbox.next(r, CONN)?, Vec::new()));
        }
        let mut dst = vec![0u8; sizes.next().unwrap()];
        let (incoming, placed) = inbox.next_with_payload(r, CONN, &mut dst)?;
        dst.truncate(placed);
        Ok((incoming, dst))
    }

    /// Reads the leg to its end with destination buffers of the given
    /// sizes (cycled), waiting for the socket whenever the inbox says so;
    /// with `combined`, frames start with `next_with_payload`.
    fn read_all(r: &TcpStream, dst_sizes: &[usize], combined: bool) -> Vec<Seen> {
        let mut inbox = Inbox::new(RX_LOOKAHEAD);
        let mut seen = Vec::new();
        let mut sizes = dst_sizes.iter().copied().cycle();
        loop {
            let (incoming, first) = next_frame(&mut inbox, r, combined, &mut sizes).unwrap();
            if !matches!(incoming, Incoming::Frame(Frame::Data { .. })) {
                assert!(first.is_empty(), "payload bytes with {incoming:?}");
            }
            match incoming {
                Incoming::Closed => return seen,
                Incoming::WouldBlock => wait_readable(r),
                Incoming::Frame(Frame::Data { offset, len }) => {
                    let mut payload = first;
                    let mut left = len - payload.len() as u64;
                    while left > 0 {
                        let mut dst = vec![0u8; sizes.next().unwrap()];
                        match inbox.read_payload(r, &mut dst, left) {
                            Ok((0, _)) => panic!("leg closed inside a payload"),
                            Ok((n, drained)) => {
                                payload.extend_from_slice(&dst[..n]);
                                left -= n as u64;
                                if drained {
                                    assert_eq!(inbox.buffered(), 0);
                                }
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(r),
                            Err(e) => panic!("{e}"),
                        }
                    }
                    seen.push(Seen::Data(offset, payload));
                }
                Incoming::Frame(f) => seen.push(Seen::Control(f)),
            }
        }
    }

    fn encode(msgs: &[Message<'_>]) -> Vec<u8> {
        let mut out = Outbox::default();
        for m in msgs {
            out.push(m);
        }
        out.buf
    }

    #[test]
    fn frames_after_a_payload_come_along_in_its_read() {
        let (mut w, r) = leg_pair();
        // Small enough that all of it is in the socket before the reader
        // starts (a fresh loopback connection's window is about 64 KiB).
        let big: Vec<u8> = (0..60_000).map(|i| i as u8).collect();
        let msgs = [
            Message::Data {
                conn_id: CONN,
                offset: 0,
                payload: &big,
            },
            Message::Data {
                conn_id: CONN,
                offset: big.len() as u64,
                payload: b"123456789",
            },
            Message::TxFreeze {
                conn_id: CONN,
                epoch: 3,
                offset: big.len() as u64 + 9,
            },
            Message::Fin {
                conn_id: CONN,
                offset: big.len() as u64 + 9,
            },
        ];
        let sent = encode(&msgs);
        let after_payload = encode(&msgs[1..]).len();
        w.write_all(&sent).unwrap();
        drop(w);
        wait_until_queued(&r, sent.len());
        let mut inbox = Inbox::new(RX_LOOKAHEAD);
        let Incoming::Frame(Frame::Data { offset: 0, len }) = inbox.next(&r, CONN).unwrap() else {
            panic!("expected the first Data frame");
        };
        assert_eq!(len, big.len() as u64);
        let mut dst = vec![0u8; 64 * 1024];
        let mut got = 0;
        while got < big.len() {
            match inbox.read_payload(&r, &mut dst[got..big.len()], (big.len() - got) as u64) {
                Ok((n, _)) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(&r),
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(&dst[..got], &big[..]);
        // Everything after the payload was in the socket, and fits the
        // look-ahead: it came along.
        assert_eq!(inbox.buffered(), after_payload);
        assert!(inbox.frame_ready());
        let Incoming::Frame(Frame::Data { len: 9, .. }) = inbox.next(&r, CONN).unwrap() else {
            panic!("expected the 9-byte Data frame");
        };
        let (n, drained) = inbox.read_payload(&r, &mut dst[..9], 9).unwrap();
        assert_eq!((n, drained, &dst[..9]), (9, false, &b"123456789"[..]));
        assert!(matches!(
            inbox.next(&r, CONN).unwrap(),
            Incoming::Frame(Frame::TxFreeze { epoch: 3, .. })
        ));
        assert!(matches!(
            inbox.next(&r, CONN).unwrap(),
            Incoming::Frame(Frame::Fin { .. })
        ));
        assert_eq!(inbox.buffered(), 0);
        assert!(!inbox.frame_ready());
        assert!(matches!(inbox.next(&r, CONN).unwrap(), Incoming::Closed));
    }

    /// A 64 KiB write (a 65527-byte frame and a 9-byte one) read with a
    /// 64 KiB buffer from an empty inbox: the first frame's payload in one
    /// call, the bytes past it (the small frame) back in the inbox.
    #[test]
    fn a_write_comes_in_one_call_with_its_payload_in_place() {
        let (mut w, r) = leg_pair();
        let data: Vec<u8> = (0..65_536u32).map(|i| (i * 7) as u8).collect();
        let mut out = Outbox::default();
        out.push_data(CONN, 100, &data);
        let sent = out.buf.clone();
        let writer = std::thread::spawn(move || w.write_all(&sent).map(|()| w));
        let mut inbox = Inbox::new(RX_LOOKAHEAD);
        let mut dst = vec![0u8; 65_536];
        let (incoming, placed) = loop {
            wait_readable(&r);
            wait_until_queued(&r, 65_536 + 2 * DATA_PREFIX_LEN);
            match inbox.next_with_payload(&r, CONN, &mut dst).unwrap() {
                (Incoming::WouldBlock, _) => continue,
                other => break other,
            }
        };
        let _w = writer.join().unwrap().unwrap();
        let Incoming::Frame(Frame::Data { offset: 100, len }) = incoming else {
            panic!("expected the first Data frame, got {incoming:?}");
        };
        assert_eq!((len, placed), (MAX_DATA_PAYLOAD as u64, MAX_DATA_PAYLOAD));
        assert_eq!(&dst[..placed], &data[..placed]);
        // The 9 bytes of the next prefix that landed in `dst` went back.
        assert_eq!(inbox.buffered(), DATA_PREFIX_LEN + 9);
        assert!(inbox.frame_ready());
        let Incoming::Frame(Frame::Data { offset, len: 9 }) = inbox.next(&r, CONN).unwrap() else {
            panic!("expected the 9-byte frame");
        };
        assert_eq!(offset, 100 + MAX_DATA_PAYLOAD as u64);
        let mut tail = [0u8; 9];
        assert_eq!(inbox.read_payload(&r, &mut tail, 9).unwrap().0, 9);
        assert_eq!(&tail[..], &data[MAX_DATA_PAYLOAD..]);
        assert_eq!(inbox.buffered(), 0);
    }

    /// A control frame met by `next_with_payload` keeps nothing in the
    /// caller's buffer: it and the frames after it come from the inbox, in
    /// order, even when they are more than the look-ahead holds.
    #[test]
    fn frames_read_into_the_callers_buffer_go_back_in_order() {
        let (mut w, r) = leg_pair();
        let big: Vec<u8> = (0..30_000u32).map(|i| (i % 251) as u8).collect();
        let msgs = [
            Message::TxFreeze {
                conn_id: CONN,
                epoch: 4,
                offset: 0,
            },
            Message::Data {
                conn_id: CONN,
                offset: 0,
                payload: b"ab",
            },
            Message::Data {
                conn_id: CONN,
                offset: 2,
                payload: &big,
            },
            Message::Fin {
                conn_id: CONN,
                offset: 2 + big.len() as u64,
            },
        ];
        let sent = encode(&msgs);
        w.write_all(&sent).unwrap();
        drop(w);
        wait_until_queued(&r, sent.len());
        let mut inbox = Inbox::new(RX_LOOKAHEAD);
        let mut dst = vec![0u8; 20_000];
        let (incoming, placed) = inbox.next_with_payload(&r, CONN, &mut dst).unwrap();
        assert!(matches!(
            incoming,
            Incoming::Frame(Frame::TxFreeze {
                epoch: 4,
                offset: 0
            })
        ));
        assert_eq!(placed, 0);
        // 20,000 bytes read past the freeze are held, beyond the look-ahead.
        assert!(inbox.buffered() > RX_LOOKAHEAD);
        // A short Data frame through the caller's buffer: its two bytes in
        // place, the rest back in the inbox.
        let (incoming, placed) = inbox.next_with_payload(&r, CONN, &mut dst).unwrap();
        assert!(matches!(
            incoming,
            Incoming::Frame(Frame::Data { offset: 0, len: 2 })
        ));
        assert_eq!(placed, 0, "the inbox was not empty: a plain next()");
        assert_eq!(inbox.read_payload(&r, &mut dst[..2], 2).unwrap().0, 2);
        assert_eq!(&dst[..2], b"ab");
        let Incoming::Frame(Frame::Data { offset: 2, len }) = inbox.next(&r, CONN).unwrap() else {
            panic!("expected the big frame");
        };
        let mut got = Vec::new();
        let mut left = len;
        while left > 0 {
            let (n, _) = inbox.read_payload(&r, &mut dst, left).unwrap();
            got.extend_from_slice(&dst[..n]);
            left -= n as u64;
        }
        assert_eq!(got, big);
        assert!(matches!(
            inbox.next(&r, CONN).unwrap(),
            Incoming::Frame(Frame::Fin { .. })
        ));
        assert!(matches!(inbox.next(&r, CONN).unwrap(), Incoming::Closed));
    }

    #[test]
    fn a_small_message_comes_with_its_prefix_and_says_the_leg_is_empty() {
        let (mut w, r) = leg_pair();
        let sent = encode(&[Message::Data {
            conn_id: CONN,
            offset: 5,
            payload: b"p",
        }]);
        w.write_all(&sent).unwrap();
        wait_until_queued(&r, sent.len());
        let mut inbox = Inbox::new(RX_LOOKAHEAD);
        assert!(matches!(
            inbox.next(&r, CONN).unwrap(),
            Incoming::Frame(Frame::Data { offset: 5, len: 1 })
        ));
        assert_eq!(inbox.buffered(), 1, "the payload came with its prefix");
        let mut dst = [0u8; 64];
        // From the inbox, no system call; and the socket had nothing more,
        // so a blocking reader may wait for it before reading again.
        assert_eq!(inbox.read_payload(&r, &mut dst, 1).unwrap(), (1, true));
        assert_eq!(dst[0], b'p');
        w.write_all(&sent).unwrap();
        w.write_all(&encode(&[Message::Fin {
            conn_id: CONN,
            offset: 7,
        }]))
        .unwrap();
        wait_until_queued(&r, sent.len() + 16);
        assert!(matches!(
            inbox.next(&r, CONN).unwrap(),
            Incoming::Frame(Frame::Data { len: 1, .. })
        ));
        // The Fin is still buffered: not empty.
        assert_eq!(inbox.read_payload(&r, &mut dst, 1).unwrap(), (1, false));
    }

    #[test]
    fn a_frame_for_another_connection_in_the_look_ahead_is_refused() {
        let (mut w, r) = leg_pair();
        let msgs = [
            Message::Data {
                conn_id: CONN,
                offset: 0,
                payload: b"abc",
            },
            Message::Fin {
                conn_id: CONN + 1,
                offset: 3,
            },
        ];
        w.write_all(&encode(&msgs)).unwrap();
        drop(w);
        wait_readable(&r);
        let mut inbox = Inbox::new(RX_LOOKAHEAD);
        assert!(matches!(
            inbox.next(&r, CONN).unwrap(),
            Incoming::Frame(Frame::Data { len: 3, .. })
        ));
        let mut dst = [0u8; 3];
        let mut got = 0;
        while got < 3 {
            match inbox.read_payload(&r, &mut dst[got..], 3 - got as u64) {
                Ok((n, _)) => got += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(&r),
                Err(e) => panic!("{e}"),
            }
        }
        let err = loop {
            match inbox.next(&r, CONN) {
                Ok(Incoming::WouldBlock) => wait_readable(&r),
                Ok(other) => panic!("expected an error, got {other:?}"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
    }

    #[derive(Clone, Debug)]
    enum Plan {
        Data(usize),
        Freeze,
        RingFrom,
    }

    fn plan() -> impl Strategy<Value = Plan> {
        prop_oneof![
            6 => (1usize..70_000).prop_map(Plan::Data),
            3 => (1usize..40).prop_map(Plan::Data),
            1 => Just(Plan::Freeze),
            1 => Just(Plan::RingFrom),
        ]
    }

    /// Reads the leg until it ends or the inbox refuses a frame, with
    /// destination buffers of the given sizes. Returns whether it ended in
    /// a refusal.
    fn read_until_refused(r: &TcpStream, dst_sizes: &[usize], combined: bool) -> bool {
        let mut inbox = Inbox::new(RX_LOOKAHEAD);
        let mut sizes = dst_sizes.iter().copied().cycle();
        loop {
            match next_frame(&mut inbox, r, combined, &mut sizes) {
                Err(e) => {
                    assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
                    return true;
                }
                Ok((Incoming::Closed, _)) => return false,
                Ok((Incoming::WouldBlock, _)) => wait_readable(r),
                Ok((Incoming::Frame(Frame::Data { len, .. }), first)) => {
                    let mut left = len - first.len() as u64;
                    while left > 0 {
                        let mut dst = vec![0u8; sizes.next().unwrap()];
                        match inbox.read_payload(r, &mut dst, left) {
                            // The leg ended inside the payload.
                            Ok((0, _)) => return false,
                            Ok((n, _)) => left -= n as u64,
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(r),
                            Err(e) => panic!("{e}"),
                        }
                    }
                }
                Ok((Incoming::Frame(_), _)) => {}
            }
        }
    }

    static SIGPIPES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    extern "C" fn count_sigpipe(_: libc::c_int) {
        SIGPIPES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writing `Data` to a leg whose peer reset it gives the writer an
    /// error and raises no SIGPIPE (whose default action ends a program
    /// that did not ignore it, as C programs using the transport need not).
    #[test]
    fn data_on_a_reset_leg_is_an_error_not_a_sigpipe() {
        // SAFETY: installs a handler that only bumps an atomic counter
        // (async-signal-safe); no other test in this binary relies on
        // SIGPIPE being ignored, and any SIGPIPE would be a defect.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = count_sigpipe as *const () as usize;
            sa.sa_flags = libc::SA_RESTART;
            assert_eq!(libc::sigaction(libc::SIGPIPE, &sa, std::ptr::null_mut()), 0);
        }
        let (w, r) = leg_pair();
        // The peer's end resets (SO_LINGER 0): the first send reports the
        // reset, every later one EPIPE.
        socket2::SockRef::from(&r)
            .set_linger(Some(std::time::Duration::ZERO))
            .unwrap();
        drop(r);
        std::thread::sleep(std::time::Duration::from_millis(50));
        let data = vec![1u8; 100_000];
        let mut errors = Vec::new();
        for _ in 0..3 {
            let mut out = Outbox::default();
            match send_data_direct(&w, &mut out, CONN, 0, &data) {
                Ok(_) => {}
                Err(e) => errors.push(e.raw_os_error()),
            }
        }
        assert!(errors.contains(&Some(libc::EPIPE)), "{errors:?}");
        assert_eq!(SIGPIPES.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// A peer that writes garbage (after some good frames, cut at any
        /// point) gets a refusal (`InvalidData`) or the end of the leg,
        /// never a panic or a hang, however the reader's reads fall.
        #[test]
        fn garbage_on_the_leg_is_refused(
            good in proptest::collection::vec(1usize..5000, 0..4),
            cut in any::<prop::sample::Index>(),
            // with the version byte below, at least a header's worth
            garbage in proptest::collection::vec(any::<u8>(), HEADER_LEN - 1..300),
            dst_sizes in proptest::collection::vec(1usize..9000, 1..4),
            combined in any::<bool>(),
        ) {
            let mut out = Outbox::default();
            let mut offset = 0u64;
            for n in &good {
                out.push_data(CONN, offset, &vec![0x5a; *n]);
                offset += *n as u64;
            }
            let mut bytes = out.buf;
            let whole = bytes.len();
            let keep = cut.index(whole + 1);
            bytes.truncate(keep);
            // A version byte no frame has: refused for sure when it starts
            // a frame (the cut fell on a frame boundary).
            bytes.push(0xee);
            bytes.extend_from_slice(&garbage);
            let (mut w, r) = leg_pair();
            let writer = std::thread::spawn(move || {
                w.write_all(&bytes).unwrap();
            });
            let refused = read_until_refused(&r, &dst_sizes, combined);
            writer.join().unwrap();
            if keep == whole {
                prop_assert!(refused, "a frame of version 0xee was taken");
            }
        }

        /// Whatever the frame sizes, the writer's chunking and the reader's
        /// buffer sizes, the reader sees exactly the frames sent, in order,
        /// with every payload byte once.
        #[test]
        fn the_reader_sees_the_frames_sent(
            plans in proptest::collection::vec(plan(), 1..24),
            write_chunks in proptest::collection::vec(1usize..90_000, 1..8),
            dst_sizes in proptest::collection::vec(1usize..70_000, 1..8),
            combined in any::<bool>(),
        ) {
            let mut msgs_bytes = Vec::new();
            let mut expected = Vec::new();
            let mut offset = 0u64;
            let mut out = Outbox::default();
            for (k, p) in plans.iter().enumerate() {
                match p {
                    Plan::Data(n) => {
                        let bytes: Vec<u8> =
                            (0..*n).map(|i| (i as u64 * 31 + offset) as u8 ^ k as u8).collect();
                        out.push_data(CONN, offset, &bytes);
                        for (j, c) in bytes.chunks(MAX_DATA_PAYLOAD).enumerate() {
                            expected.push(Seen::Data(offset + (j * MAX_DATA_PAYLOAD) as u64, c.to_vec()));
                        }
                        offset += *n as u64;
                    }
                    Plan::Freeze => {
                        out.push(&Message::TxFreeze { conn_id: CONN, epoch: k as u32, offset });
                        expected.push(Seen::Control(Frame::TxFreeze { epoch: k as u32, offset }));
                    }
                    Plan::RingFrom => {
                        out.push(&Message::RingFrom { conn_id: CONN, epoch: k as u32, offset });
                        expected.push(Seen::Control(Frame::RingFrom { epoch: k as u32, offset }));
                    }
                }
            }
            msgs_bytes.extend_from_slice(&out.buf);
            let (mut w, r) = leg_pair();
            w.set_nodelay(true).unwrap();
            let writer = std::thread::spawn(move || {
                let mut chunks = write_chunks.iter().cycle();
                let mut at = 0;
                while at < msgs_bytes.len() {
                    let n = (*chunks.next().unwrap()).min(msgs_bytes.len() - at);
                    w.write_all(&msgs_bytes[at..at + n]).unwrap();
                    at += n;
                }
            });
            let seen = read_all(&r, &dst_sizes, combined);
            writer.join().unwrap();
            prop_assert_eq!(seen, expected);
        }
    }
}
