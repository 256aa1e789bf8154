// SPDX-License-Identifier: GPL-2.0
//! SOCK_SEQPACKET's calls: each message is one record on the connection's
//! rings (`carrier/records.rs` moves them). Connection setup, close and
//! shutdown are the stream's (`connect.rs`, `data.rs`, `lifecycle.rs`);
//! only sendmsg, recvmsg, poll's readiness and SIOCINQ differ.
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

use crate::carrier::records::{RecordReceived, RecordSent};
use crate::carrier::rings::Rings;
use crate::carrier::XenSock;
use crate::sock::Addr;
use crate::sys::{self, errno as e, Msg};
use kernel::bindings;
use kernel::ffi::{c_int, c_long};

const MSG_NOSIGNAL: i32 = 0x4000;
const MSG_EOR: i32 = 0x80;
const MSG_TRUNC: i32 = 0x20;

fn err(x: i32) -> c_int {
    -x
}

/// Sends the whole of `msg` as one record.
pub(crate) fn sendmsg(xs: &XenSock, msg: &mut Msg, rings: &mut Rings) -> c_int {
    let flags = msg.flags();
    let nonblock = flags & bindings::MSG_DONTWAIT as i32 != 0;
    let mut timeo: c_long = xs.sk.sndtimeo(nonblock);
    loop {
        if xs.inner.lock().reset {
            return err(e::ECONNRESET);
        }
        let closed = xs.inner.lock().shut_wr;
        let step = if closed {
            RecordSent::Closed
        } else {
            rings.send_record(xs, msg, flags & MSG_EOR != 0)
        };
        match step {
            RecordSent::Sent(len) => {
                xs.inner.lock().bytes_out += len as u64;
                return len as c_int;
            }
            RecordSent::TooBig => return err(e::EMSGSIZE),
            RecordSent::Full { need } => {
                if let Err(x) = rings.wait_record_room(xs, need, &mut timeo) {
                    return err(x);
                }
            }
            RecordSent::Closed => {
                if flags & MSG_NOSIGNAL == 0 {
                    sys::send_sigpipe();
                }
                return err(e::EPIPE);
            }
            RecordSent::Reset => return err(e::ECONNRESET),
            RecordSent::Fault => return err(e::EFAULT),
            RecordSent::Failed(x) => return err(x),
        }
    }
}

/// Receives one message; its sender's address goes to `msg_name`.
pub(crate) fn recvmsg(
    xs: &XenSock,
    msg: &mut Msg,
    rings: &mut Rings,
    flags: c_int,
    peer: Addr,
) -> c_int {
    let peek = flags & bindings::MSG_PEEK as i32 != 0;
    let nonblock = flags & bindings::MSG_DONTWAIT as i32 != 0;
    let mut timeo: c_long = xs.sk.rcvtimeo(nonblock);
    loop {
        if xs.inner.lock().reset {
            return err(e::ECONNRESET);
        }
        let room = msg.left();
        match rings.recv_record(xs, msg, peek) {
            RecordReceived::Record { len, copied, eor } => {
                if !peek {
                    xs.inner.lock().bytes_in += len as u64;
                }
                let mut out_flags = 0;
                if len as usize > room {
                    out_flags |= MSG_TRUNC;
                }
                if eor {
                    out_flags |= MSG_EOR;
                }
                msg.add_flags(out_flags);
                msg.set_name(&peer.bytes());
                return if flags & MSG_TRUNC != 0 {
                    len as c_int
                } else {
                    copied as c_int
                };
            }
            RecordReceived::Incomplete { need } => {
                if xs.inner.lock().shut_rd {
                    return 0;
                }
                if let Err(x) = rings.wait_record(xs, need, &mut timeo) {
                    return err(x);
                }
            }
            RecordReceived::Eof => return 0,
            RecordReceived::Reset => return err(e::ECONNRESET),
            RecordReceived::Fault => return err(e::EFAULT),
            RecordReceived::Failed(x) => return err(x),
        }
    }
}
