// SPDX-License-Identifier: MIT OR Apache-2.0
//! The guest-wide lock that opens XenStore transactions on
//! `/dev/xen/xenbus` one at a time (see `xs/mod.rs`, "the device's rules"):
//! a lock file in `/run/lock`, taken with `flock`.

use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// Environment variable naming the lock file that serialises the
/// transactions of a guest's processes on `/dev/xen/xenbus` (default
/// `/run/lock/xensock-xenstore-transaction`; without `/run/lock`, no lock).
pub const TX_LOCK_ENV: &str = "XENSOCK_XS_TX_LOCK";

/// How long a transaction waits for another process's to end before it
/// goes ahead without the lock (a process stuck inside one must not stop
/// every other's for good).
const TX_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

fn tx_lock_path() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(TX_LOCK_ENV) {
        return Some(PathBuf::from(p));
    }
    Path::new("/run/lock")
        .is_dir()
        .then(|| PathBuf::from("/run/lock/xensock-xenstore-transaction"))
}

/// Opens (making it if need be) the transaction lock file. It lives where
/// every user may write (`/run/lock`) and root's processes open it: a
/// symbolic link is not followed (nor made into a file where it points),
/// and only a regular file is used. Read-only is enough for `flock`, so
/// processes of other users can lock the file the first one made.
fn open_tx_lock(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .or_else(|e| match e.kind() {
            io::ErrorKind::NotFound => std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .custom_flags(flags)
                .open(path),
            _ => Err(e),
        })?;
    if !file.metadata()?.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file; refusing to use it",
        ));
    }
    Ok(file)
}

/// The guest-wide transaction lock, held while it lives (see the module
/// notes). Every acquisition opens the file anew: `flock` locks belong to
/// an open file description, so two threads of one process exclude each
/// other as two processes do.
pub(crate) struct TxGate {
    _file: std::fs::File,
}

impl TxGate {
    /// Takes the lock, waiting up to [`TX_LOCK_WAIT`]; `None` if the file
    /// cannot be opened or the wait ran out (the transaction goes ahead).
    pub(crate) fn acquire() -> Option<TxGate> {
        let path = tx_lock_path()?;
        let file = match open_tx_lock(&path) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(path = %path.display(), "xenstore transaction lock: {e}");
                return None;
            }
        };
        let deadline = std::time::Instant::now() + TX_LOCK_WAIT;
        loop {
            let Err(e) = crate::sys::try_lock_exclusive(file.as_fd()) else {
                return Some(TxGate { _file: file });
            };
            if e.raw_os_error() != Some(libc::EWOULDBLOCK) && e.kind() != io::ErrorKind::Interrupted
            {
                tracing::warn!(path = %path.display(), "xenstore transaction lock: {e}");
                return None;
            }
            if std::time::Instant::now() >= deadline {
                tracing::warn!(
                    path = %path.display(),
                    "xenstore transaction lock held for {TX_LOCK_WAIT:?}: going ahead without it"
                );
                return None;
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A symbolic link planted where the lock file should be is neither
    /// followed nor made into a file where it points; a directory there
    /// is refused too.
    #[test]
    fn a_planted_symlink_or_directory_is_refused_and_nothing_is_made_where_it_points() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("made-by-root");
        let planted = dir.path().join("lock");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        let e = open_tx_lock(&planted).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP), "{e}");
        assert!(!target.exists());
        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(open_tx_lock(&sub).is_err());
        let fresh = dir.path().join("fresh");
        assert!(open_tx_lock(&fresh).unwrap().metadata().unwrap().is_file());
    }
}
