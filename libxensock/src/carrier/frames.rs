// SPDX-License-Identifier: MIT OR Apache-2.0
//! The TCP legs' two kinds of traffic (the raw leg, `docs/protocol.md`
//! 5.4): a leg carries, from the side that connected it, that side's
//! stream itself, unframed, and from the side that accepted it control
//! frames (`RawFrom`, `RingFrom`, `TxFreeze`, `Consumed`, `Fin`, `Reset`).
//! Which stream offsets the raw bytes are is said on the control stream:
//! a `RawFrom{M}` starts a run of them at M, the sender's next `RingFrom`
//! or `Fin` ends it. [`Inbox`] reads control frames, [`Outbox`] queues
//! either kind of traffic, [`send_raw`] sends.

use std::io::{self, Read};
use std::net::TcpStream;

use socket2::SockRef;

use xensock_proto::control_stream::{self, LegControl};
use xensock_proto::ctrl::{Message, HEADER_LEN};

/// What reading control frames off a leg gave.
#[derive(Debug)]
pub(crate) enum Incoming {
    Frame(LegControl),
    WouldBlock,
    /// The peer closed the leg (at a frame boundary or not).
    Closed,
}

pub(super) fn protocol_error(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

/// How many bytes one read of the control stream asks for: frames are
/// 12-24 bytes and come a few at a time (a switch), so one read takes all
/// that are there.
const CONTROL_READ: usize = 1024;

/// Reads control frames from a non-blocking stream. Bytes read but not
/// taken yet (the next frames) wait in `buf[start..end]`.
pub(crate) struct Inbox {
    buf: Box<[u8; CONTROL_READ]>,
    start: usize,
    end: usize,
}

impl Default for Inbox {
    fn default() -> Self {
        Inbox {
            buf: Box::new([0; CONTROL_READ]),
            start: 0,
            end: 0,
        }
    }
}

impl Inbox {
    /// The next control frame addressed to `conn_id`. A breach of the
    /// control stream (proto's rule: malformed frames, frames for another
    /// connection, kinds with no place there) is `InvalidData`.
    pub(crate) fn next(&mut self, mut sock: &TcpStream, conn_id: u32) -> io::Result<Incoming> {
        let mut drained = false;
        loop {
            let have = self.end - self.start;
            if have >= HEADER_LEN {
                let len = control_stream::frame_len(&self.buf[self.start..self.end], conn_id)
                    .map_err(protocol_error)?;
                if have >= len {
                    let frame = control_stream::decode_frame(
                        &self.buf[self.start..self.start + len],
                        conn_id,
                    )
                    .map_err(protocol_error)?;
                    self.start += len;
                    if self.start == self.end {
                        self.start = 0;
                        self.end = 0;
                    }
                    return Ok(Incoming::Frame(frame));
                }
            }
            if drained {
                // The last read took less than asked: the socket is empty,
                // another read would only say so.
                return Ok(Incoming::WouldBlock);
            }
            // Less than a frame is here (at most MAX_CONTROL_FRAME bytes):
            // a cheap move makes the whole buffer free for the read.
            self.buf.copy_within(self.start..self.end, 0);
            self.start = 0;
            self.end = have;
            let asked = CONTROL_READ - have;
            match sock.read(&mut self.buf[have..]) {
                Ok(0) => return Ok(Incoming::Closed),
                Ok(n) => {
                    self.end += n;
                    drained = n < asked;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(Incoming::WouldBlock),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

/// Bytes waiting to be written to a leg, oldest first: control frames,
/// or stream bytes of a run.
#[derive(Default)]
pub(crate) struct Outbox {
    buf: Vec<u8>,
    pos: usize,
}

impl Outbox {
    pub(crate) fn is_empty(&self) -> bool {
        self.pos == self.buf.len()
    }

    pub(crate) fn push(&mut self, msg: &Message<'_>) {
        let start = self.buf.len();
        self.buf.resize(start + msg.encoded_len(), 0);
        // Cannot fail: the buffer was sized for the frame, and the legs
        // carry no `Data` frames (the only kind with a size limit).
        let _ = msg.encode(&mut self.buf[start..]);
    }

    /// Queues stream bytes of an open run.
    pub(crate) fn push_raw(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Puts `msg` before everything queued (the leg's `TcpHello`).
    pub(super) fn push_front(&mut self, msg: &Message<'_>) {
        let mut front = Outbox::default();
        front.push(msg);
        front.buf.extend_from_slice(&self.buf[self.pos..]);
        *self = front;
    }

    /// Writes as much as the socket takes now.
    pub(crate) fn flush(&mut self, sock: &TcpStream) -> io::Result<()> {
        while !self.is_empty() {
            match send_raw(sock, &self.buf[self.pos..])? {
                0 => break,
                n => self.pos += n,
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

/// Sends `bytes` on a non-blocking leg: how many it took, 0 when it took
/// none now. `MSG_NOSIGNAL`: sending on a leg the peer reset raises SIGPIPE
/// otherwise, and the programs this runs in need not ignore it.
pub(crate) fn send_raw(sock: &TcpStream, bytes: &[u8]) -> io::Result<usize> {
    loop {
        match SockRef::from(sock).send_with_flags(bytes, libc::MSG_NOSIGNAL) {
            Ok(0) if !bytes.is_empty() => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(0),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::io::Write;
    use std::net::TcpListener;
    use std::os::fd::AsRawFd;
    use xensock_proto::switch::RxControl;

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
        let r = crate::sys::poll(std::slice::from_mut(&mut p), 5000);
        assert_eq!(r, 1, "leg not readable within 5 s");
    }

    fn encode(msgs: &[Message<'_>]) -> Vec<u8> {
        let mut out = Outbox::default();
        for m in msgs {
            out.push(m);
        }
        out.buf
    }

    /// Sends `bytes` in writes of the given sizes (cycled), then closes.
    fn send_chunked(mut w: TcpStream, bytes: Vec<u8>, chunks: Vec<usize>) {
        w.set_nodelay(true).unwrap();
        let mut sizes = chunks.iter().cycle();
        let mut at = 0;
        while at < bytes.len() {
            let n = (*sizes.next().unwrap()).min(bytes.len() - at);
            w.write_all(&bytes[at..at + n]).unwrap();
            at += n;
        }
    }

    /// Control frames until the leg ends.
    fn read_control(r: &TcpStream) -> io::Result<Vec<LegControl>> {
        let mut inbox = Inbox::default();
        let mut seen = Vec::new();
        loop {
            match inbox.next(r, CONN)? {
                Incoming::Frame(f) => seen.push(f),
                Incoming::WouldBlock => wait_readable(r),
                Incoming::Closed => return Ok(seen),
            }
        }
    }

    #[test]
    fn control_frames_arrive_whole_and_in_order() {
        let (w, r) = leg_pair();
        let msgs = [
            Message::RingFrom {
                conn_id: CONN,
                epoch: 1,
                offset: 10,
            },
            Message::TxFreeze {
                conn_id: CONN,
                epoch: 1,
                offset: 99,
            },
            Message::Consumed {
                conn_id: CONN,
                epoch: 4,
                offset: 7,
            },
            Message::Fin {
                conn_id: CONN,
                offset: 99,
            },
            Message::RawFrom {
                conn_id: CONN,
                offset: 1 << 40,
            },
            Message::Reset {
                conn_id: CONN,
                reason: xensock_proto::ctrl::ResetReason::Abort,
            },
        ];
        let bytes = encode(&msgs);
        let writer = std::thread::spawn(move || send_chunked(w, bytes, vec![1, 5, 13]));
        let seen = read_control(&r).unwrap();
        writer.join().unwrap();
        assert_eq!(
            seen,
            vec![
                LegControl::Receiving(RxControl::RingFrom {
                    epoch: 1,
                    offset: 10
                }),
                LegControl::Receiving(RxControl::TxFreeze {
                    epoch: 1,
                    offset: 99
                }),
                LegControl::Consumed {
                    epoch: 4,
                    offset: 7
                },
                LegControl::Receiving(RxControl::Fin { offset: 99 }),
                LegControl::Receiving(RxControl::RawFrom { offset: 1 << 40 }),
                LegControl::Reset,
            ]
        );
    }

    #[test]
    fn data_frames_another_connection_or_a_hello_on_the_control_stream_are_refused() {
        for bad in [
            Message::Data {
                conn_id: CONN,
                offset: 0,
                payload: b"abc",
            },
            Message::Fin {
                conn_id: CONN + 1,
                offset: 0,
            },
            Message::TcpHello {
                conn_id: CONN,
                cookie: 1,
            },
        ] {
            let (mut w, r) = leg_pair();
            w.write_all(&encode(&[bad])).unwrap();
            drop(w);
            let e = read_control(&r).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{bad:?}: {e}");
        }
    }

    static SIGPIPES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    extern "C" fn count_sigpipe(_: libc::c_int) {
        SIGPIPES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }

    /// Sending on a leg whose peer reset it gives the writer an error and
    /// raises no SIGPIPE (whose default action ends a program that did
    /// not ignore it, as C programs using the transport need not).
    #[test]
    fn sending_on_a_reset_leg_is_an_error_not_a_sigpipe() {
        // The handler only bumps an atomic counter (async-signal-safe); no
        // other test in this binary relies on SIGPIPE being ignored, and
        // any SIGPIPE would be a defect.
        crate::sys::on_sigpipe(count_sigpipe).unwrap();
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
        for k in 0..4 {
            let r = if k % 2 == 0 {
                send_raw(&w, &data).map(|_| ())
            } else {
                let mut out = Outbox::default();
                out.push_raw(&data);
                out.flush(&w)
            };
            if let Err(e) = r {
                errors.push(e.raw_os_error());
            }
        }
        assert!(errors.contains(&Some(libc::EPIPE)), "{errors:?}");
        assert_eq!(SIGPIPES.load(std::sync::atomic::Ordering::SeqCst), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// A peer that writes garbage on the control stream (after some
        /// good frames, cut at any point) gets a refusal (`InvalidData`)
        /// or the end of the leg, never a panic or a hang.
        #[test]
        fn garbage_on_the_control_stream_is_refused(
            good in 0usize..4,
            cut in any::<prop::sample::Index>(),
            // with the version byte below, at least a header's worth
            garbage in proptest::collection::vec(any::<u8>(), HEADER_LEN - 1..300),
            chunks in proptest::collection::vec(1usize..40, 1..4),
        ) {
            let mut out = Outbox::default();
            for k in 0..good {
                out.push(&Message::TxFreeze { conn_id: CONN, epoch: k as u32, offset: 9 });
            }
            let mut bytes = out.buf;
            let whole = bytes.len();
            let keep = cut.index(whole + 1);
            bytes.truncate(keep);
            // A version byte no frame has: refused for sure when it starts
            // a frame (the cut fell on a frame boundary).
            bytes.push(0xee);
            bytes.extend_from_slice(&garbage);
            let (w, r) = leg_pair();
            let writer = std::thread::spawn(move || send_chunked(w, bytes, chunks));
            let refused = match read_control(&r) {
                Err(e) => {
                    prop_assert_eq!(e.kind(), io::ErrorKind::InvalidData);
                    true
                }
                Ok(_) => false,
            };
            writer.join().unwrap();
            if keep == whole {
                prop_assert!(refused, "a frame of version 0xee was taken");
            }
        }
    }
}
