// SPDX-License-Identifier: MIT OR Apache-2.0
//! The async face of the XenStore client: the same connection core,
//! awaited instead of blocked on.

use super::*;

/// An async XenStore connection. Cheap to clone. Works on any executor:
/// the connection's reader is a thread, replies complete futures.
///
/// ```no_run
/// # async fn demo() -> Result<(), xensock_discovery::xs::XsError> {
/// use futures_core::Stream;
/// use xensock_discovery::xs::AsyncXsClient;
/// let xs = AsyncXsClient::open()?;
/// let mut w = xs.watch("@releaseDomain").await?;
/// xs.write("data/x", "1").await?;
/// let ev = std::future::poll_fn(|cx| std::pin::Pin::new(&mut w).poll_next(cx)).await;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct AsyncXsClient {
    pub(super) core: Arc<Core>,
}

impl AsyncXsClient {
    /// Connects like [`XsClient::open`].
    pub fn open() -> Result<AsyncXsClient, XsError> {
        Ok(XsClient::open()?.to_async())
    }

    /// Connects to a socket or device path.
    pub fn open_path(path: impl AsRef<Path>) -> Result<AsyncXsClient, XsError> {
        Ok(XsClient::open_path(path)?.to_async())
    }

    fn core(&self) -> &Core {
        &self.core
    }

    fn tx(&self) -> u32 {
        0
    }

    /// The blocking API on the same connection.
    pub fn to_blocking(&self) -> XsClient {
        XsClient {
            core: self.core.clone(),
        }
    }

    /// Watches `path`; events arrive as a `Stream`, the first one at once.
    pub async fn watch(&self, path: &str) -> Result<AsyncWatch, XsError> {
        let token = self.core.new_token();
        let (s, r) = tokio::sync::mpsc::unbounded_channel();
        lock(&self.core.routes)
            .watches
            .insert(token.clone(), Arc::new(EventSink::Async(s)));
        let p = watch_payload(path, &token)?;
        let res = self
            .core
            .call_async(MsgType::Watch, 0, &p, "watch", path)
            .await;
        if let Err(e) = res {
            lock(&self.core.routes).watches.remove(&token);
            return Err(e);
        }
        Ok(AsyncWatch {
            core: self.core.clone(),
            path: path.to_string(),
            token,
            rx: r,
        })
    }

    /// Starts a transaction.
    pub async fn transaction_start(&self) -> Result<AsyncTransaction, XsError> {
        let gate = if self.core.device_rules {
            // The wait for the lock happens on a thread of its own, not on
            // the executor's.
            let (done, got) = tokio::sync::oneshot::channel();
            std::thread::spawn(move || {
                let _ = done.send(TxGate::acquire());
            });
            got.await.ok().flatten()
        } else {
            None
        };
        let p = self
            .core
            .call_async(MsgType::TransactionStart, 0, b"\0", "transaction_start", "")
            .await?;
        Ok(AsyncTransaction {
            inner: Arc::new(AsyncTxInner {
                core: self.core.clone(),
                id: parse_tx_id(&p)?,
                ended: AtomicBool::new(false),
                _gate: gate,
            }),
        })
    }

    /// Runs `f` in a transaction and commits, retrying on `EAGAIN` up to
    /// [`MAX_TRANSACTION_ATTEMPTS`] times. `f` gets a handle to the
    /// transaction (cheap clone of the connection plus the id).
    pub async fn transaction<T, F, Fut>(&self, mut f: F) -> Result<T, XsError>
    where
        F: FnMut(AsyncTransaction) -> Fut,
        Fut: Future<Output = Result<T, XsError>>,
    {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let tx = self.transaction_start().await?;
            match f(tx.clone()).await {
                Ok(v) => match tx.commit().await {
                    Ok(()) => return Ok(v),
                    Err(e) if e.is(XsErrno::Again) && attempt < MAX_TRANSACTION_ATTEMPTS => {}
                    Err(e) => return Err(e),
                },
                Err(e) => {
                    let _ = tx.abort().await;
                    if !(e.is(XsErrno::Again) && attempt < MAX_TRANSACTION_ATTEMPTS) {
                        return Err(e);
                    }
                }
            }
        }
    }
}

async_ops!(AsyncXsClient);

/// An open transaction (async API). End it with
/// [`AsyncTransaction::commit`] or [`AsyncTransaction::abort`] (or use
/// [`AsyncXsClient::transaction`]); when the last clone is dropped
/// without either (a cancelled future, a runtime shutting down), it is
/// aborted then, as the blocking [`Transaction`] is.
#[derive(Clone)]
pub struct AsyncTransaction {
    inner: Arc<AsyncTxInner>,
}

/// What the clones of one [`AsyncTransaction`] share.
struct AsyncTxInner {
    core: Arc<Core>,
    id: u32,
    /// A commit or an abort went out (or is about to).
    ended: AtomicBool,
    /// Released once the transaction has ended (fields drop after
    /// `Drop::drop` sent the abort).
    _gate: Option<TxGate>,
}

impl Drop for AsyncTxInner {
    /// A transaction left open would hold one of the guest's 10 until the
    /// connection closes, and on `/dev/xen/xenbus` Linux then ends it
    /// with a request it miscounts, after which the guest never suspends
    /// again (docs/discovery.md).
    fn drop(&mut self) {
        if !*self.ended.get_mut() {
            self.core
                .send_detached(MsgType::TransactionEnd, self.id, end_payload(false));
        }
    }
}

impl AsyncTransaction {
    fn core(&self) -> &Core {
        &self.inner.core
    }
    fn tx(&self) -> u32 {
        self.inner.id
    }
    /// The transaction id.
    pub fn id(&self) -> u32 {
        self.inner.id
    }
    /// Commits; `EAGAIN` on conflict.
    pub async fn commit(&self) -> Result<(), XsError> {
        self.end(true, "commit").await
    }
    /// Abandons the transaction.
    pub async fn abort(&self) -> Result<(), XsError> {
        self.end(false, "abort").await
    }
    async fn end(&self, commit: bool, op: &'static str) -> Result<(), XsError> {
        // marked before the request goes out: a future dropped after
        // sending it must not send a second end
        self.inner.ended.store(true, Ordering::Release);
        self.core()
            .call_async(
                MsgType::TransactionEnd,
                self.inner.id,
                end_payload(commit),
                op,
                "",
            )
            .await
            .map(drop)
    }
}

async_ops!(AsyncTransaction);

/// A registered watch as a `Stream` of events; ends when the connection
/// closes. Dropping it unregisters the watch.
pub struct AsyncWatch {
    core: Arc<Core>,
    path: String,
    token: String,
    rx: tokio::sync::mpsc::UnboundedReceiver<WatchEvent>,
}

impl AsyncWatch {
    /// The watched path.
    pub fn path(&self) -> &str {
        &self.path
    }
    /// Waits for the next event; `None` when the connection closed.
    pub async fn next_event(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

impl futures_core::Stream for AsyncWatch {
    type Item = WatchEvent;
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<WatchEvent>> {
        self.rx.poll_recv(cx)
    }
}

impl Drop for AsyncWatch {
    fn drop(&mut self) {
        lock(&self.core.routes).watches.remove(&self.token);
        if let Ok(p) = watch_payload(&self.path, &self.token) {
            self.core.send_detached(MsgType::Unwatch, 0, &p);
        }
    }
}
