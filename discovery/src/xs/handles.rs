// SPDX-License-Identifier: MIT OR Apache-2.0
//! What a client call hands back and ends on drop: a transaction, a
//! watch (polled or with a callback).

use super::*;

/// An open transaction (blocking API). Reads see a snapshot; writes are
/// applied at commit. Dropping it without committing aborts it.
pub struct Transaction {
    pub(super) core: Arc<Core>,
    pub(super) id: u32,
    pub(super) done: bool,
    /// Released once the transaction has ended (fields drop after
    /// `Drop::drop` sent the abort).
    pub(super) _gate: Option<TxGate>,
}

impl std::fmt::Debug for Transaction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transaction").field("id", &self.id).finish()
    }
}

impl Transaction {
    fn core(&self) -> &Core {
        &self.core
    }
    fn tx(&self) -> u32 {
        self.id
    }
    /// The transaction id.
    pub fn id(&self) -> u32 {
        self.id
    }
    /// Commits. Fails with `EAGAIN` when a conflicting change happened.
    pub fn commit(mut self) -> Result<(), XsError> {
        self.done = true;
        self.core
            .call(
                MsgType::TransactionEnd,
                self.id,
                end_payload(true),
                "commit",
                "",
            )
            .map(drop)
    }
    /// Abandons the transaction.
    pub fn abort(mut self) -> Result<(), XsError> {
        self.done = true;
        self.core
            .call(
                MsgType::TransactionEnd,
                self.id,
                end_payload(false),
                "abort",
                "",
            )
            .map(drop)
    }
}

impl Drop for Transaction {
    fn drop(&mut self) {
        if !self.done {
            self.core
                .send_detached(MsgType::TransactionEnd, self.id, end_payload(false));
        }
    }
}

blocking_ops!(Transaction);

/// A registered watch (blocking API). Dropping it unregisters it.
pub struct Watch {
    pub(super) core: Arc<Core>,
    /// (path, token) of each registration.
    pub(super) regs: Vec<(String, String)>,
    pub(super) rx: mpsc::Receiver<WatchEvent>,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("regs", &self.regs).finish()
    }
}

impl Watch {
    /// The watched path (the first, for a multi-path watch).
    pub fn path(&self) -> &str {
        self.regs.first().map(|r| r.0.as_str()).unwrap_or("")
    }
    /// The token of the watch on `path`.
    pub fn token_of(&self, path: &str) -> Option<&str> {
        self.regs.iter().find(|r| r.0 == path).map(|r| r.1.as_str())
    }
    /// Waits for the next event. Fails when the connection closes.
    pub fn recv(&mut self) -> Result<WatchEvent, XsError> {
        self.rx.recv().map_err(|_| XsError::Closed)
    }
    /// Waits at most `timeout`; `Ok(None)` on timeout.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<WatchEvent>, XsError> {
        match self.rx.recv_timeout(timeout) {
            Ok(e) => Ok(Some(e)),
            Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(mpsc::RecvTimeoutError::Disconnected) => Err(XsError::Closed),
        }
    }
    /// An event if one is queued.
    pub fn try_recv(&mut self) -> Result<Option<WatchEvent>, XsError> {
        match self.rx.try_recv() {
            Ok(e) => Ok(Some(e)),
            Err(mpsc::TryRecvError::Empty) => Ok(None),
            Err(mpsc::TryRecvError::Disconnected) => Err(XsError::Closed),
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        for (path, token) in &self.regs {
            lock(&self.core.routes).watches.remove(token);
            if let Ok(p) = watch_payload(path, token) {
                self.core.send_detached(MsgType::Unwatch, 0, &p);
            }
        }
    }
}

/// A watch registered with [`XsClient::watch_with`]. Dropping it
/// unregisters it.
pub struct CallbackWatch {
    pub(super) core: Arc<Core>,
    pub(super) path: String,
    pub(super) token: String,
}

impl std::fmt::Debug for CallbackWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallbackWatch")
            .field("path", &self.path)
            .field("token", &self.token)
            .finish()
    }
}

impl CallbackWatch {
    /// The watched path.
    pub fn path(&self) -> &str {
        &self.path
    }
    /// The watch's token ([`WatchEvent::token`] of its events).
    pub fn token(&self) -> &str {
        &self.token
    }
}

impl Drop for CallbackWatch {
    fn drop(&mut self) {
        lock(&self.core.routes).watches.remove(&self.token);
        if let Ok(p) = watch_payload(&self.path, &self.token) {
            self.core.send_detached(MsgType::Unwatch, 0, &p);
        }
    }
}
