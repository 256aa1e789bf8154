// SPDX-License-Identifier: MIT OR Apache-2.0
//! A listening port's queue of connections the link manager has completed
//! (as the kernel completes TCP handshakes before `accept`): the transport
//! fills it, the `XenListener` of that port drains it.

use std::collections::VecDeque;
use std::io;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use xensock_xenif::DomId;

use crate::conn::{lock, Conn};
use crate::error::errno;
use crate::sys::eventfd::EventFd;

/// A listening port: its backlog of completed connections.
pub(crate) struct ListenerShared {
    pub port: u32,
    pub recv_buffer: usize,
    backlog: usize,
    queue: Mutex<VecDeque<Arc<Conn>>>,
    cv: Condvar,
    pub(crate) evfd: EventFd,
}

impl ListenerShared {
    pub(crate) fn new(port: u32, backlog: usize, recv_buffer: usize) -> io::Result<Arc<Self>> {
        Ok(Arc::new(ListenerShared {
            port,
            recv_buffer,
            backlog,
            queue: Mutex::new(VecDeque::new()),
            cv: Condvar::new(),
            evfd: EventFd::new()?,
        }))
    }

    /// The listener as a `ConnectRequest` sees it (user space listens on
    /// streams only).
    pub(crate) fn view(&self) -> xensock_proto::ctrl::ListenerView {
        xensock_proto::ctrl::ListenerView {
            sock_type: xensock_proto::ctrl::SockType::Stream,
            queued: lock(&self.queue).len(),
            backlog: self.backlog,
        }
    }

    pub(crate) fn push(&self, c: Arc<Conn>) {
        lock(&self.queue).push_back(c);
        self.cv.notify_all();
        self.evfd.signal();
    }

    /// The link to `peer` died: its connections waiting to be accepted go,
    /// except those on their carrier switch (they live on over TCP).
    pub(crate) fn drop_peer(&self, peer: DomId) {
        lock(&self.queue).retain(|c| c.peer() != peer || c.switch().is_some());
    }

    pub(crate) fn take_all(&self) -> Vec<Arc<Conn>> {
        lock(&self.queue).drain(..).collect()
    }

    pub(crate) fn pop(&self, deadline: Option<Instant>, block: bool) -> io::Result<Arc<Conn>> {
        let mut q = lock(&self.queue);
        loop {
            if let Some(c) = q.pop_front() {
                if q.is_empty() {
                    self.evfd.drain();
                }
                return Ok(c);
            }
            if !block {
                self.evfd.drain();
                return Err(io::ErrorKind::WouldBlock.into());
            }
            match deadline {
                None => q = self.cv.wait(q).unwrap_or_else(|p| p.into_inner()),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(errno(libc::ETIMEDOUT));
                    }
                    q = self
                        .cv
                        .wait_timeout(q, d - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
            }
        }
    }
}
