// SPDX-License-Identifier: GPL-2.0
//! SOCK_SEQPACKET's records on a connection's two rings (the `Rings`
//! carrier): each message is one proto record (`record.rs`: an 8-byte
//! header and the payload), published whole or not at all, read whole. The
//! socket core keeps the call's semantics (`socket/seqpacket.rs`: flags,
//! timeouts, SIGPIPE, what a short buffer means); here the ring steps and
//! the waits.

use super::rings::Rings;
use super::{Readiness, SocketCore, XenSock};
use crate::proto::record::{self, Next, RecordHeader, RECORD_FLAG_EOR, RECORD_HEADER_SIZE};
use crate::sys::{self, errno as e, Msg};
use kernel::ffi::c_long;

/// Bytes copied between the user and a ring at a time.
const CHUNK: usize = 4096;

/// What one attempt to send a record did.
pub(crate) enum RecordSent {
    /// the record is published whole: its payload length
    Sent(u32),
    /// it can never fit the peer's ring: EMSGSIZE
    TooBig,
    /// no room for it now: wait for `need` bytes (`wait_record_room`)
    Full { need: u32 },
    /// the peer reads no more: EPIPE
    Closed,
    /// the connection is reset: ECONNRESET
    Reset,
    /// the user's buffer faulted: nothing was published
    Fault,
    /// the connection cannot carry records (this errno)
    Failed(i32),
}

/// What one attempt to receive a record did.
pub(crate) enum RecordReceived {
    /// a record, consumed unless peeking: its payload length, the bytes
    /// that went to the user (fewer when the buffer is smaller), whether
    /// its sender marked it MSG_EOR
    Record { len: u32, copied: usize, eor: bool },
    /// no whole record yet: wait for `need` bytes (`wait_record`)
    Incomplete { need: u32 },
    /// the peer's end of stream, no record left
    Eof,
    /// the connection is reset: ECONNRESET
    Reset,
    /// the user's buffer faulted part way; the record is consumed unless
    /// peeking (as AF_UNIX and vsock: else the next recv would return it
    /// instead of the next one)
    Fault,
    /// the connection cannot carry records (this errno)
    Failed(i32),
}

impl Rings {
    /// Sends the whole of `msg` as one record (`eor`: MSG_EOR), if it fits
    /// now.
    pub(crate) fn send_record(&mut self, xs: &XenSock, msg: &mut Msg, eor: bool) -> RecordSent {
        let Some(tx) = &self.tx else {
            return RecordSent::Failed(e::ENOTCONN);
        };
        tx.set_owner(&xs.sk);
        let Ok(len) = record::check_len(msg.left(), tx.capacity()) else {
            return RecordSent::TooBig;
        };
        let need = RECORD_HEADER_SIZE + len;
        let (free, end) = match tx.tx_state() {
            Ok(v) => v,
            Err(why) => return RecordSent::Failed(xs.conn_reset(why)),
        };
        if end.reset {
            xs.inner.lock().reset = true;
            return RecordSent::Reset;
        }
        if end.closed {
            return RecordSent::Closed;
        }
        if free < need {
            return RecordSent::Full { need };
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
                    return RecordSent::Fault;
                }
                if !record::stage_payload(&mut p, off, &buf[..got]) {
                    ok = false;
                    break;
                }
                off += got as u32;
            }
            let h = RecordHeader {
                len,
                flags: if eor { RECORD_FLAG_EOR } else { 0 },
            };
            if ok && sys::test_hooks::take_inject_bad_record() {
                // test hook: a header claiming more than the ring holds, the
                // record's real bytes published behind it
                let bad = RecordHeader {
                    len: tx.capacity(),
                    flags: 0,
                };
                kernel::pr_warn!(
                    "inject_bad_record: sending a record header of length {}\n",
                    bad.len
                );
                p.stage(0, &bad.encode()) && p.commit(h.total())
            } else {
                ok && record::commit(&mut p, h)
            }
        };
        if !staged {
            // the space was checked under the same producer: never lose a
            // message silently
            return RecordSent::Failed(
                xs.conn_reset("seqpacket record did not fit the space it was given"),
            );
        }
        tx.after_write();
        RecordSent::Sent(len)
    }

    /// After `RecordSent::Full`: sleeps until `need` bytes are free (the
    /// peer kicks then), `timeo` running down. Err: EAGAIN or a signal's.
    pub(crate) fn wait_record_room(
        &mut self,
        xs: &XenSock,
        need: u32,
        timeo: &mut c_long,
    ) -> Result<(), i32> {
        let Some(tx) = &self.tx else {
            return Err(e::ENOTCONN);
        };
        xs.sk.wait(timeo, || match tx.tx_prepare_wait(need) {
            Ok(sleep) => !sleep || xs.inner.lock().reset,
            Err(_) => true,
        })
    }

    /// Receives the next record into `msg`, if a whole one is there.
    pub(crate) fn recv_record(
        &mut self,
        xs: &XenSock,
        msg: &mut Msg,
        peek: bool,
    ) -> RecordReceived {
        let Some(rx) = &self.rx else {
            return RecordReceived::Failed(e::ENOTCONN);
        };
        rx.set_owner(&xs.sk);
        // flags first: FIN is stored after the last record's `prod`
        let end = match rx.rx.lock().peer_end() {
            Ok(v) => v,
            Err(why) => return RecordReceived::Failed(xs.conn_reset(why)),
        };
        let next = record::next_record(&*rx.rx.lock());
        let need = match next {
            Err(why) => return RecordReceived::Failed(xs.conn_reset(why)),
            Ok(Next::Ready(h)) => return deliver(xs, msg, self, &h, peek),
            Ok(Next::Incomplete { need }) => need,
        };
        if end.reset {
            xs.inner.lock().reset = true;
            return RecordReceived::Reset;
        }
        if end.fin {
            return match rx.rx_state() {
                Ok((0, _)) => RecordReceived::Eof,
                Ok(_) => {
                    RecordReceived::Failed(xs.conn_reset("end of stream inside a seqpacket record"))
                }
                Err(why) => RecordReceived::Failed(xs.conn_reset(why)),
            };
        }
        RecordReceived::Incomplete { need }
    }

    /// After `RecordReceived::Incomplete`: sleeps until `need` bytes are
    /// there (the peer kicks then), or the socket is shut down for reading
    /// or reset, `timeo` running down. Err: EAGAIN or a signal's.
    pub(crate) fn wait_record(
        &mut self,
        xs: &XenSock,
        need: u32,
        timeo: &mut c_long,
    ) -> Result<(), i32> {
        let Some(rx) = &self.rx else {
            return Err(e::ENOTCONN);
        };
        xs.sk.wait(timeo, || match rx.rx_prepare_wait(need) {
            Ok(sleep) => {
                let i = xs.inner.lock();
                !sleep || i.shut_rd || i.reset
            }
            Err(_) => true,
        })
    }

    /// For poll: readable once a whole record is there (over a link, the
    /// peer is asked for a kick once the rest of the next one is), writable
    /// once a small one fits (a larger one may still wait for room).
    pub(crate) fn record_readiness(&self, xs: &XenSock) -> Readiness {
        self.readiness_with(
            xs,
            1,
            |rx, _| {
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
            },
            |free| free > RECORD_HEADER_SIZE,
        )
        .0
    }

    /// `SIOCINQ` (`FIONREAD`): the payload length of the next whole
    /// record, as AF_UNIX reports for SOCK_SEQPACKET (0 while none is
    /// complete; record headers are not data the reader ever sees).
    pub(crate) fn next_record_len(&self) -> u32 {
        let Some(rx) = &self.rx else { return 0 };
        match record::next_record(&*rx.rx.lock()) {
            Ok(Next::Ready(h)) => h.len,
            _ => 0,
        }
    }
}

/// Copies the ready record `h` to the caller (as much as fits) and
/// consumes it unless peeking.
fn deliver(
    xs: &XenSock,
    msg: &mut Msg,
    rings: &Rings,
    h: &RecordHeader,
    peek: bool,
) -> RecordReceived {
    let Some(rx) = &rings.rx else {
        return RecordReceived::Failed(e::ENOTCONN);
    };
    let n = (h.len as usize).min(msg.left());
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
                    return RecordReceived::Failed(xs.conn_reset(why));
                }
            };
            if got != want {
                drop(c);
                return RecordReceived::Failed(xs.conn_reset("seqpacket record shrank while read"));
            }
            if msg.copy_to(&buf[..got]) < got {
                if !peek {
                    if let Err(why) = record::consume(&mut c, h) {
                        drop(c);
                        return RecordReceived::Failed(xs.conn_reset(why));
                    }
                    drop(c);
                    rx.after_read();
                }
                return RecordReceived::Fault;
            }
            off += got;
        }
        if !peek {
            if let Err(why) = record::consume(&mut c, h) {
                drop(c);
                return RecordReceived::Failed(xs.conn_reset(why));
            }
        }
    }
    if !peek {
        rx.after_read();
    }
    RecordReceived::Record {
        len: h.len,
        copied: n,
        eor: h.flags & RECORD_FLAG_EOR != 0,
    }
}
