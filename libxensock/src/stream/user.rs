// SPDX-License-Identifier: MIT OR Apache-2.0
//! A stream over the user-space transport (`UserStream`): its connection,
//! options and the engine calls behind `XenStream`'s methods.

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::addr::SockAddrXen;
use crate::carrier::Switch;
use crate::conn::{is_carried, lock, Conn, ConnPhase, WANT_READ, WANT_WRITE};
use crate::error::errno;
use crate::transport::Transport;

/// Closes the connection when the last clone goes.
struct Guard {
    transport: Transport,
    conn: Arc<Conn>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.transport.owner.inner.close_conn(&self.conn);
    }
}

/// The per-stream options every handle shares.
#[derive(Default)]
struct StreamOptions {
    read: Option<Duration>,
    write: Option<Duration>,
    linger: Option<Duration>,
}

/// A stream of the user-space transport: the connection's shared rings,
/// with an eventfd for readiness.
pub(super) struct UserStream {
    guard: Arc<Guard>,
    options: Arc<Mutex<StreamOptions>>,
}

impl UserStream {
    pub(super) fn new(transport: Transport, conn: Arc<Conn>) -> UserStream {
        UserStream {
            guard: Arc::new(Guard { transport, conn }),
            options: Arc::new(Mutex::new(StreamOptions::default())),
        }
    }

    fn conn(&self) -> &Arc<Conn> {
        &self.guard.conn
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SockAddrXen> {
        let c = self.conn();
        Ok(SockAddrXen::new(u32::from(c.peer()), c.peer_port))
    }

    /// Our address.
    pub fn local_addr(&self) -> io::Result<SockAddrXen> {
        let c = self.conn();
        Ok(SockAddrXen::new(
            u32::from(self.guard.transport.domid()),
            c.local_port,
        ))
    }

    /// Completes a connect started with [`Transport::connect_nonblocking`]:
    /// `Ok` once the connection is open (and on every later call), the
    /// connect's error if it failed (`ECONNREFUSED`, ...), `WouldBlock`
    /// while the answer has not come. After `WouldBlock` the descriptor is
    /// reset and becomes readable when the answer arrives.
    pub fn finish_connect(&self) -> io::Result<()> {
        let c = self.conn();
        let check = || match c.io().phase {
            ConnPhase::Connecting => Err(io::Error::from(io::ErrorKind::WouldBlock)),
            ConnPhase::Failed(e) => Err(errno(e)),
            _ => Ok(()),
        };
        match check() {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return r,
        }
        // The manager sets the phase, then signals: a signal after this
        // drain is a new edge; one before it left a phase we see below.
        c.evfd.drain();
        check()
    }

    /// The error of a failed non-blocking connect (`SO_ERROR`), `None`
    /// while connecting or once connected. The stream stays failed.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(match self.conn().io().phase {
            ConnPhase::Failed(e) => Some(errno(e)),
            _ => None,
        })
    }

    /// Shuts down one or both directions: `Write` sends end-of-stream
    /// after the bytes written so far; `Read` makes reads return 0 and the
    /// peer's writes fail with `EPIPE`.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let c = self.conn();
        if let Some(e) = c.switch() {
            if matches!(how, Shutdown::Write | Shutdown::Both) {
                e.shutdown_write()?;
            }
            if matches!(how, Shutdown::Read | Shutdown::Both) {
                // No TCP counterpart of the ring's CLOSED flag in version
                // 1: reads end here, the peer's writes are not refused.
                c.io().shut_rd = true;
            }
            c.signal();
            return Ok(());
        }
        {
            let mut io = c.io();
            match io.phase {
                ConnPhase::Open => {}
                ConnPhase::Reset { .. } | ConnPhase::Closed => return Ok(()),
                _ => return Err(errno(libc::ENOTCONN)),
            }
            if matches!(how, Shutdown::Write | Shutdown::Both) {
                io.shutdown_write();
            }
            if matches!(how, Shutdown::Read | Shutdown::Both) {
                io.shutdown_read();
            }
        }
        c.signal();
        Ok(())
    }

    /// Another handle on the same connection (shares options and mode).
    pub fn try_clone(&self) -> io::Result<UserStream> {
        Ok(UserStream {
            guard: self.guard.clone(),
            options: self.options.clone(),
        })
    }

    /// Non-blocking mode: reads and writes return `WouldBlock` instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.conn()
            .nonblocking
            .store(nonblocking, Ordering::Release);
        Ok(())
    }

    /// Read timeout (`None`: wait forever; zero is `EINVAL`, as in std).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t.is_some_and(|t| t.is_zero()) {
            return Err(errno(libc::EINVAL));
        }
        lock(&self.options).read = t;
        Ok(())
    }

    /// Write timeout (`None`: wait forever; zero is `EINVAL`).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        if t.is_some_and(|t| t.is_zero()) {
            return Err(errno(libc::EINVAL));
        }
        lock(&self.options).write = t;
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(lock(&self.options).read)
    }

    /// `SO_LINGER`: `Some(0)` makes the close reset the connection; any
    /// other value leaves the close as it is (what was written is
    /// delivered; a connection on its TCP carrier lingers until the peer
    /// acknowledged it).
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        lock(&self.options).linger = linger;
        self.conn().io().abort_on_close = linger == Some(Duration::ZERO);
        Ok(())
    }

    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(lock(&self.options).linger)
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(lock(&self.options).write)
    }

    /// Size of our receive ring (`SO_RCVBUF`).
    pub fn recv_buffer_size(&self) -> usize {
        self.conn()
            .io()
            .rx
            .as_ref()
            .map_or(0, |r| r.c.capacity() as usize)
    }

    /// Size of the peer's receive ring that we write into (`SO_SNDBUF`).
    pub fn send_buffer_size(&self) -> usize {
        self.conn()
            .io()
            .tx
            .as_ref()
            .map_or(0, |t| t.p.capacity() as usize)
    }

    /// Bytes readable right now without blocking.
    pub fn bytes_readable(&self) -> usize {
        self.conn()
            .io()
            .rx
            .as_ref()
            .and_then(|r| r.c.readable().ok())
            .unwrap_or(0) as usize
    }

    /// The transport this stream belongs to.
    pub fn transport(&self) -> &Transport {
        &self.guard.transport
    }

    /// For the hostile-peer test: stores `value` at byte `offset` of the
    /// *peer's* receive ring that this stream writes into (header
    /// included), as a scribbling domain would. Returns false when the ring
    /// is not mapped.
    #[cfg(test)]
    pub(super) fn scribble_peer_ring(&self, offset: usize, value: u32) -> bool {
        let io = self.conn().io();
        let Some(tx) = io.tx.as_ref() else {
            return false;
        };
        let region = &tx.mapped.region;
        let Some(cell) = crate::sys::shared::word_at(&**region, offset) else {
            return false;
        };
        cell.store(value, Ordering::Release);
        if let Some(k) = &io.kicker {
            let _ = k.notify();
        }
        true
    }

    fn finish_err(&self, e: io::Error) -> io::Error {
        if e.raw_os_error() == Some(libc::ECONNRESET) {
            self.guard
                .transport
                .owner
                .inner
                .report_violation(self.conn());
        }
        e
    }

    /// An operation on the carrier switch: blocking calls block in the
    /// switch (no timeout) or wait for its ready hook (timeout);
    /// non-blocking ones return `WouldBlock` with the descriptor reset, as
    /// on the fast path.
    fn engine_op<T>(
        &self,
        switch: &Switch,
        want: u8,
        timeout: Option<Duration>,
        mut f: impl FnMut(&Switch, bool) -> io::Result<T>,
    ) -> io::Result<T> {
        let c = self.conn();
        let nonblocking = c.nonblocking.load(Ordering::Acquire);
        if !nonblocking && timeout.is_none() {
            return f(switch, false);
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let g0 = c.generation();
            match f(switch, true) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
                Ok(v) => {
                    c.waiting.fetch_and(!want, Ordering::AcqRel);
                    return Ok(v);
                }
            }
            if nonblocking {
                c.waiting.fetch_or(want, Ordering::AcqRel);
                // Reset the descriptor, then look again: the switch's hook
                // signals it anew for anything after the drain.
                c.evfd.drain();
                match f(switch, true) {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                    Ok(v) => {
                        c.waiting.fetch_and(!want, Ordering::AcqRel);
                        return Ok(v);
                    }
                }
                // The drain may have taken the other direction's edge:
                // give it back unless its hook call is still to come.
                let other = (WANT_READ | WANT_WRITE) & !want;
                if c.waiting.load(Ordering::Acquire) & other != 0
                    && !switch.nb_pending(other == WANT_READ)
                {
                    c.evfd.signal();
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
            if !c.wait_since(g0, deadline) {
                return Err(errno(libc::EAGAIN));
            }
        }
    }

    /// A read, or with `peek` what a read would return now (waiting as a
    /// read waits), left for the next read.
    fn read_impl(&self, buf: &mut [u8], peek: bool) -> io::Result<usize> {
        let t = lock(&self.options).read;
        let c = self.conn();
        if let Some(e) = c.switch() {
            if c.io().shut_rd {
                return Ok(0);
            }
            return self.engine_op(&e, WANT_READ, t, |e, nb| match (peek, nb) {
                (true, _) => e.peek(buf, nb),
                (false, true) => e.try_read(buf),
                (false, false) => e.read(buf),
            });
        }
        let step = |io: &mut crate::conn::ConnIo| {
            if peek {
                io.try_peek(buf)
            } else {
                io.try_read(buf)
            }
        };
        match self.op(WANT_READ, 1, t, step) {
            Err(e) if is_carried(&e) => self.read_impl(buf, peek),
            r => r,
        }
    }

    /// What a read would return now (waiting as a read waits), left for
    /// the next read.
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf, true)
    }

    fn write_impl(&self, buf: &[u8]) -> io::Result<usize> {
        let t = lock(&self.options).write;
        if let Some(e) = self.conn().switch() {
            return self.engine_op(&e, WANT_WRITE, t, |e, nb| {
                if nb {
                    e.try_write(buf)
                } else {
                    e.write(buf)
                }
            });
        }
        let cap = self.send_buffer_size().max(1) as u32;
        let want = (buf.len().min(u32::MAX as usize) as u32).clamp(1, (cap / 4).max(1));
        match self.op(WANT_WRITE, want, t, |io| io.try_write(buf)) {
            Err(e) if is_carried(&e) => self.write_impl(buf),
            r => r,
        }
    }

    fn op<T>(
        &self,
        want: u8,
        write_want: u32,
        timeout: Option<Duration>,
        mut f: impl FnMut(&mut crate::conn::ConnIo) -> io::Result<T>,
    ) -> io::Result<T> {
        let c = self.conn();
        let busy = self.guard.transport.owner.inner.cfg.busy_poll;
        let mut spin_until: Option<Instant> = None;
        let mut deadline: Option<Instant> = None;
        loop {
            let r = f(&mut c.io());
            match r {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(self.finish_err(e)),
                Ok(v) => {
                    c.waiting.fetch_and(!want, Ordering::AcqRel);
                    return Ok(v);
                }
            }
            if c.nonblocking.load(Ordering::Acquire) {
                c.rearm_nonblocking(want, write_want);
                // The re-check may have found what we wanted.
                let r = f(&mut c.io());
                match r {
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        return Err(io::ErrorKind::WouldBlock.into())
                    }
                    Err(e) => return Err(self.finish_err(e)),
                    Ok(v) => {
                        c.waiting.fetch_and(!want, Ordering::AcqRel);
                        return Ok(v);
                    }
                }
            }
            let now = Instant::now();
            if deadline.is_none() {
                deadline = timeout.map(|t| now + t);
            }
            let spin_end = *spin_until.get_or_insert(now + busy);
            if now < spin_end {
                // Yield rather than burn the core: on a busy machine the
                // peer we wait for may need it.
                std::thread::yield_now();
                continue;
            }
            if !c.wait(want, write_want, deadline) {
                return Err(errno(libc::EAGAIN));
            }
            spin_until = Some(Instant::now() + busy);
        }
    }
}

impl Read for &UserStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_impl(buf, false)
    }
}

impl Write for &UserStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_impl(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if self.conn().switch().is_some() {
            let first = bufs
                .iter()
                .find(|b| !b.is_empty())
                .map_or(&[][..], |b| &b[..]);
            return self.write_impl(first);
        }
        let t = lock(&self.options).write;
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        let cap = self.send_buffer_size().max(1) as u32;
        let want = (len.min(u32::MAX as usize) as u32).clamp(1, (cap / 4).max(1));
        self.op(WANT_WRITE, want, t, |io| {
            let mut total = 0;
            for b in bufs.iter().filter(|b| !b.is_empty()) {
                match io.try_write(b) {
                    Ok(n) => {
                        total += n;
                        if n < b.len() {
                            break;
                        }
                    }
                    Err(e) if total == 0 => return Err(e),
                    Err(_) => break,
                }
            }
            Ok(total)
        })
        .or_else(|e| {
            if is_carried(&e) {
                let first = bufs
                    .iter()
                    .find(|b| !b.is_empty())
                    .map_or(&[][..], |b| &b[..]);
                self.write_impl(first)
            } else {
                Err(e)
            }
        })
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsFd for UserStream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.conn().evfd.as_fd()
    }
}
