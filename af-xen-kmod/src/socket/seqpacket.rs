// SPDX-License-Identifier: GPL-2.0
//! SOCK_SEQPACKET data path: each message is one proto record (`record.rs`:
//! 8-byte header + payload) in the same rings a stream uses. Connection
//! setup, close and shutdown are the stream's (`connect.rs`, `data.rs`, `lifecycle.rs`); only sendmsg,
//! recvmsg and read readiness differ.
//!
//! * A message is published whole (payload staged, header written, one
//!   store of `prod`), so readers never see half a message; a message that
//!   can never fit the peer's ring is `EMSGSIZE` (no fragmentation), one
//!   that does not fit now waits for space (or `EAGAIN`).
//! * A short read discards the rest of the message and sets `MSG_TRUNC`;
//!   with `MSG_TRUNC` in the call's flags the full length is returned (as
//!   AF_UNIX does). `MSG_EOR` given to send is carried in the record and
//!   reported in `msg_flags`.
//! * A record header that does not validate (length beyond the ring,
//!   unknown flags), or end-of-stream in the middle of a record, resets the
//!   connection.

use super::for_carriers::conn_reset;
use crate::carrier::ring::Pipe;
use crate::carrier::XenSock;
use crate::proto::record::{self, Next, RecordHeader, RECORD_FLAG_EOR, RECORD_HEADER_SIZE};
use crate::sock::Addr;
use crate::sys::{self, errno as e, Msg};
use kernel::bindings;
use kernel::ffi::{c_int, c_long};
use kernel::prelude::*;

const CHUNK: usize = 4096;
const MSG_NOSIGNAL: i32 = 0x4000;
const MSG_EOR: i32 = 0x80;
const MSG_TRUNC: i32 = 0x20;

fn err(x: i32) -> c_int {
    -x
}

/// Sends the whole of `msg` as one record into `tx` (the peer's ring).
pub(crate) fn sendmsg(xs: &XenSock, msg: &mut Msg, tx: &Pipe) -> c_int {
    let flags = msg.flags();
    let epipe = || -> c_int {
        if flags & MSG_NOSIGNAL == 0 {
            sys::send_sigpipe();
        }
        err(e::EPIPE)
    };
    let len = match record::check_len(msg.left(), tx.capacity()) {
        Ok(l) => l,
        Err(_) => return err(e::EMSGSIZE),
    };
    let need = RECORD_HEADER_SIZE + len;
    let nonblock = flags & bindings::MSG_DONTWAIT as i32 != 0;
    let mut timeo: c_long = xs.sk.sndtimeo(nonblock);
    loop {
        if xs.inner.lock().reset {
            return err(e::ECONNRESET);
        }
        let (free, end) = match tx.tx_state() {
            Ok(v) => v,
            Err(why) => return err(conn_reset(xs, why)),
        };
        if end.reset {
            xs.inner.lock().reset = true;
            return err(e::ECONNRESET);
        }
        if end.closed || xs.inner.lock().shut_wr {
            return epipe();
        }
        if free >= need {
            break;
        }
        // sleep until the whole record fits (the peer kicks once `need`
        // bytes are free)
        let r = xs.sk.wait(&mut timeo, || match tx.tx_prepare_wait(need) {
            Ok(sleep) => !sleep || xs.inner.lock().reset,
            Err(_) => true,
        });
        if let Err(x) = r {
            return err(x);
        }
    }
    let mut buf = [0u8; CHUNK];
    let staged = {
        let mut p = tx.tx.lock();
        let mut off = 0u32;
        let mut ok = true;
        while off < len {
            let want = ((len - off) as usize).min(CHUNK);
            let got = msg.copy_from(&mut buf[..want]);
            if got == 0 {
                // nothing is published: the message is not sent at all
                return err(e::EFAULT);
            }
            if !record::stage_payload(&mut p, off, &buf[..got]) {
                ok = false;
                break;
            }
            off += got as u32;
        }
        let h = RecordHeader {
            len,
            flags: if flags & MSG_EOR != 0 {
                RECORD_FLAG_EOR
            } else {
                0
            },
        };
        if ok && sys::test_hooks::take_inject_bad_record() {
            // test hook: a header claiming more than the ring holds, the
            // record's real bytes published behind it
            let bad = RecordHeader {
                len: tx.capacity(),
                flags: 0,
            };
            pr_warn!(
                "inject_bad_record: sending a record header of length {}\n",
                bad.len
            );
            ok = p.stage(0, &bad.encode()) && p.commit(h.total());
            ok
        } else {
            ok && record::commit(&mut p, h)
        }
    };
    if !staged {
        // the space was checked under the same producer: never lose a
        // message silently
        return err(conn_reset(
            xs,
            "seqpacket record did not fit the space it was given",
        ));
    }
    tx.after_write();
    xs.inner.lock().bytes_out += len as u64;
    len as c_int
}

/// Receives one message from `rx` (our ring).
pub(crate) fn recvmsg(xs: &XenSock, msg: &mut Msg, rx: &Pipe, flags: c_int, peer: Addr) -> c_int {
    let peek = flags & bindings::MSG_PEEK as i32 != 0;
    let nonblock = flags & bindings::MSG_DONTWAIT as i32 != 0;
    let mut timeo: c_long = xs.sk.rcvtimeo(nonblock);
    loop {
        if xs.inner.lock().reset {
            return err(e::ECONNRESET);
        }
        // flags first: FIN is stored after the last record's `prod`
        let end = match rx.rx.lock().peer_end() {
            Ok(v) => v,
            Err(why) => return err(conn_reset(xs, why)),
        };
        let next = record::next_record(&*rx.rx.lock());
        let need = match next {
            Err(why) => return err(conn_reset(xs, why)),
            Ok(Next::Ready(h)) => return deliver(xs, msg, rx, &h, flags, peek, peer),
            Ok(Next::Incomplete { need }) => need,
        };
        if end.reset {
            xs.inner.lock().reset = true;
            return err(e::ECONNRESET);
        }
        if end.fin {
            return match rx.rx_state() {
                Ok((0, _)) => 0,
                Ok(_) => err(conn_reset(xs, "end of stream inside a seqpacket record")),
                Err(why) => err(conn_reset(xs, why)),
            };
        }
        if xs.inner.lock().shut_rd {
            return 0;
        }
        // sleep until the whole record is there (kick at `need` bytes)
        let r = xs.sk.wait(&mut timeo, || match rx.rx_prepare_wait(need) {
            Ok(sleep) => {
                let i = xs.inner.lock();
                !sleep || i.shut_rd || i.reset
            }
            Err(_) => true,
        });
        if let Err(x) = r {
            return err(x);
        }
    }
}

/// Copies the ready record `h` to the caller (as much as fits), consumes it
/// unless peeking, and reports MSG_TRUNC / MSG_EOR.
fn deliver(
    xs: &XenSock,
    msg: &mut Msg,
    rx: &Pipe,
    h: &RecordHeader,
    flags: c_int,
    peek: bool,
    peer: Addr,
) -> c_int {
    let room = msg.left();
    let n = (h.len as usize).min(room);
    let mut buf = [0u8; CHUNK];
    {
        let mut c = rx.rx.lock();
        let mut off = 0usize;
        while off < n {
            let want = (n - off).min(CHUNK);
            let got = match record::read_payload(&c, h, off as u32, &mut buf[..want]) {
                Ok(g) => g,
                Err(why) => {
                    drop(c);
                    return err(conn_reset(xs, why));
                }
            };
            if got != want {
                drop(c);
                return err(conn_reset(xs, "seqpacket record shrank while read"));
            }
            if msg.copy_to(&buf[..got]) < got {
                // As AF_UNIX and vsock: the message is gone (unless
                // peeked), else the next recv would return it instead of
                // the next one.
                if !peek {
                    if let Err(why) = record::consume(&mut c, h) {
                        drop(c);
                        return err(conn_reset(xs, why));
                    }
                    drop(c);
                    rx.after_read();
                }
                return err(e::EFAULT);
            }
            off += got;
        }
        if !peek {
            if let Err(why) = record::consume(&mut c, h) {
                drop(c);
                return err(conn_reset(xs, why));
            }
        }
    }
    if !peek {
        rx.after_read();
        xs.inner.lock().bytes_in += h.len as u64;
    }
    let mut out_flags = 0;
    if h.len as usize > room {
        out_flags |= MSG_TRUNC;
    }
    if h.flags & RECORD_FLAG_EOR != 0 {
        out_flags |= MSG_EOR;
    }
    msg.add_flags(out_flags);
    msg.set_name(&peer.bytes());
    if flags & MSG_TRUNC != 0 {
        h.len as c_int
    } else {
        n as c_int
    }
}

/// Poll: whether a whole message is readable. Over a link, asks the peer
/// for a kick once the rest of the next record is there. Err: the ring or
/// the record header is broken (POLLERR).
pub(crate) fn rx_ready(rx: &Pipe) -> core::result::Result<bool, ()> {
    let mut c = rx.rx.lock();
    match record::next_record(&*c) {
        Ok(Next::Ready(_)) => Ok(true),
        Ok(Next::Incomplete { need }) => {
            if rx.is_remote() {
                let _ = c.prepare_wait_for(need);
            }
            Ok(false)
        }
        Err(_) => Err(()),
    }
}

/// `SIOCINQ` (`FIONREAD`): the payload length of the next whole message,
/// as AF_UNIX reports for SOCK_SEQPACKET (0 while none is complete; record
/// headers are not data the reader ever sees).
pub(crate) fn next_len(rx: &Pipe) -> u32 {
    match record::next_record(&*rx.rx.lock()) {
        Ok(Next::Ready(h)) => h.len,
        _ => 0,
    }
}

/// Poll: whether a small message can be sent now. A larger one may still
/// wait for space; send() of it sleeps (or EAGAIN) until it fits whole.
pub(crate) fn tx_writable(free: u32) -> bool {
    free > RECORD_HEADER_SIZE
}
