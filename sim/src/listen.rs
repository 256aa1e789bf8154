// SPDX-License-Identifier: MIT OR Apache-2.0
//! Accept loops for the per-domain sockets. Dropping a [`Listener`] stops
//! its thread and removes the socket file.

use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::sys::fdpass::{SeqListener, SeqPacket};

pub(crate) struct Listener {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    wake: fn(&Path),
    thread: Option<JoinHandle<()>>,
}

impl Listener {
    /// A `SOCK_STREAM` socket (xenstored).
    pub(crate) fn stream(
        path: &Path,
        name: String,
        on_accept: impl Fn(UnixStream) + Send + 'static,
    ) -> std::io::Result<Listener> {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path)?;
        Self::run(
            path,
            name,
            |p| drop(UnixStream::connect(p)),
            move || l.accept().map(|(s, _)| s),
            on_accept,
        )
    }

    /// A `SOCK_SEQPACKET` socket (the control socket).
    pub(crate) fn seqpacket(
        path: &Path,
        name: String,
        on_accept: impl Fn(SeqPacket) + Send + 'static,
    ) -> std::io::Result<Listener> {
        let l = SeqListener::bind(path)?;
        Self::run(
            path,
            name,
            |p| drop(SeqPacket::connect(p)),
            move || l.accept(),
            on_accept,
        )
    }

    fn run<S: Send + 'static>(
        path: &Path,
        name: String,
        wake: fn(&Path),
        accept: impl Fn() -> std::io::Result<S> + Send + 'static,
        on_accept: impl Fn(S) + Send + 'static,
    ) -> std::io::Result<Listener> {
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new().name(name).spawn(move || loop {
            let s = accept();
            if stop2.load(Ordering::Acquire) {
                break;
            }
            match s {
                Ok(s) => on_accept(s),
                Err(e) => {
                    tracing::warn!("accept: {e}");
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
            }
        })?;
        Ok(Listener {
            path: path.to_path_buf(),
            stop,
            wake,
            thread: Some(thread),
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        (self.wake)(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
