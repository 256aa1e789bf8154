// SPDX-License-Identifier: MIT OR Apache-2.0
//! The domain's claim on its user-space transport: one process of a guest
//! at a time runs it.
//!
//! The transport's XenStore link nodes are per domain (`docs/protocol.md`
//! 6.1): a second process that started its own transport would take them
//! over and the first process's connections would break. So a transport
//! takes the domain's claim first, an exclusive `flock` on a lock file that
//! the kernel drops when the holder exits however it exits, and a process
//! that finds it taken is refused, naming the holder. The file
//! also says where the holder's control socket is, so that the guest's
//! suspend hook (`xensock suspend`, run as root) reaches the transport
//! whichever user runs it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Environment variable overriding the lock file of the `/dev/xen`
/// transport (default `/run/lock/xensock-transport`).
pub const ENV_CLAIM_PATH: &str = "XENSOCK_CLAIM_PATH";

/// The lock file of the guest's `/dev/xen` transport: `$XENSOCK_CLAIM_PATH`,
/// else `/run/lock/xensock-transport` (the system's directory for lock
/// files every user may take; a missing `/run/lock` makes
/// [`Claim::take`] fail with the hint to set the variable).
pub fn guest_claim_path() -> PathBuf {
    match std::env::var_os(ENV_CLAIM_PATH) {
        Some(p) => PathBuf::from(p),
        None => PathBuf::from("/run/lock/xensock-transport"),
    }
}

/// Who holds a claim, as its file says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's pid.
    pub pid: u32,
    /// Its control socket, when it serves one.
    pub control: Option<PathBuf>,
}

/// A held claim; dropping it (or the process ending) releases it.
#[derive(Debug)]
pub(crate) struct Claim {
    file: File,
}

/// Opens (making it if need be) the claim file at `path`.
///
/// The file lives in a directory every user may write to (`/run/lock`),
/// where another user may have put anything first, and a root transport
/// writes into it: nothing is followed (a symbolic link is refused), and
/// only a regular file with no other name (a hard link to another file
/// would have it written) is used. Any user's process may take the claim
/// after another's, so its owner leaves it writable for all (the lock,
/// not the file's content, is what excludes).
fn open(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::MetadataExt;
    let refuse = |why: &str| {
        Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{why}; refusing to use it (remove it, or set {ENV_CLAIM_PATH})"),
        ))
    };
    let flags = libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o666)
        .custom_flags(flags)
        .open(path);
    let f = match opened {
        Ok(f) => f,
        // another user's file that is not writable: locking needs no write
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => OpenOptions::new()
            .read(true)
            .custom_flags(flags)
            .open(path)?,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => return refuse("is a symbolic link"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(io::Error::new(
                e.kind(),
                format!("its directory does not exist ({e}); set {ENV_CLAIM_PATH}"),
            ))
        }
        Err(e) => return Err(e),
    };
    let m = f.metadata()?;
    if !m.file_type().is_file() {
        return refuse("is not a regular file");
    }
    if m.nlink() != 1 {
        return refuse("has other names (hard links)");
    }
    if m.uid() == crate::sys::uid() && m.mode() & 0o777 != 0o666 {
        f.set_permissions(std::fs::Permissions::from_mode(0o666))?;
    }
    Ok(f)
}

/// Takes an exclusive `flock` without waiting; `Ok(false)` when another
/// open file description holds it.
fn try_lock(f: &File) -> io::Result<bool> {
    loop {
        let Err(e) = crate::sys::try_lock_exclusive(f.as_fd()) else {
            return Ok(true);
        };
        match e.raw_os_error() {
            Some(libc::EWOULDBLOCK) => return Ok(false),
            Some(libc::EINTR) => continue,
            _ => return Err(e),
        }
    }
}

fn parse(text: &str) -> Option<Holder> {
    let mut pid = None;
    let mut control = None;
    for line in text.lines() {
        match line.split_once(' ') {
            Some(("pid", v)) => pid = v.trim().parse().ok(),
            Some(("control", v)) if !v.trim().is_empty() => control = Some(PathBuf::from(v.trim())),
            _ => {}
        }
    }
    Some(Holder { pid: pid?, control })
}

impl Claim {
    /// Takes the claim at `path` for this process, or fails naming the
    /// process that holds it.
    pub(crate) fn take(path: &Path) -> io::Result<Claim> {
        let file = open(path).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("xensock transport claim {}: {e}", path.display()),
            )
        })?;
        if !try_lock(&file)? {
            let who = holder(path)
                .map(|h| format!("process {}", h.pid))
                .unwrap_or_else(|| "another process".into());
            return Err(io::Error::other(format!(
                "this domain's user-space xensock transport is in use by {who} \
                     (claim {}); one process per guest runs it, and starting a second \
                     would break the first one's connections (for sockets in any \
                     number of processes run `xensock daemon` in its place, or load \
                     af_xen.ko)",
                path.display()
            )));
        }
        let claim = Claim { file };
        claim.record(None);
        Ok(claim)
    }

    /// Writes who holds the claim (best effort: a file another user made
    /// may be read-only to us, and the lock is what counts).
    pub(crate) fn record(&self, control: Option<&Path>) {
        let mut text = format!("pid {}\n", std::process::id());
        if let Some(c) = control {
            text.push_str(&format!("control {}\n", c.display()));
        }
        let mut f = &self.file;
        let _ = f.set_len(0);
        let _ = f.rewind();
        let _ = f.write_all(text.as_bytes());
    }
}

/// The process holding the claim at `path`, if one does (a file left by a
/// process that is gone names nobody).
pub fn holder(path: &Path) -> Option<Holder> {
    let mut f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    if !f.metadata().ok()?.file_type().is_file() {
        return None;
    }
    // If we can lock it, nobody holds it. Our own lock on another open of
    // the file in this process counts as held, as for any other process.
    if try_lock(&f).ok()? {
        return None;
    }
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    parse(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_naming_the_first_and_free_after_release() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("claim");
        assert_eq!(holder(&path), None);
        let first = Claim::take(&path).unwrap();
        first.record(Some(Path::new("/run/x/1.sock")));
        assert_eq!(
            holder(&path),
            Some(Holder {
                pid: std::process::id(),
                control: Some(PathBuf::from("/run/x/1.sock")),
            })
        );
        let e = Claim::take(&path).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("in use by process {}", std::process::id())),
            "{e}"
        );
        drop(first);
        assert_eq!(holder(&path), None);
        let again = Claim::take(&path).unwrap();
        drop(again);
    }

    fn mode(p: &Path) -> u32 {
        use std::os::unix::fs::MetadataExt;
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    /// A symbolic link, a hard link to another file or a directory planted
    /// where the claim file should be is refused with the reason; the file
    /// it names is neither changed nor written.
    #[test]
    fn a_planted_link_or_directory_as_the_claim_is_refused_and_its_target_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, b"secret\n").unwrap();
        std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();

        let sym = dir.path().join("sym");
        std::os::unix::fs::symlink(&victim, &sym).unwrap();
        let e = Claim::take(&sym).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(holder(&sym), None);

        let hard = dir.path().join("hard");
        std::fs::hard_link(&victim, &hard).unwrap();
        let e = Claim::take(&hard).unwrap_err();
        assert!(e.to_string().contains("hard links"), "{e}");

        let sub = dir.path().join("sub");
        std::fs::create_dir(&sub).unwrap();
        assert!(Claim::take(&sub).is_err());

        assert_eq!(std::fs::read(&victim).unwrap(), b"secret\n");
        assert_eq!(mode(&victim), 0o600);

        let missing = dir.path().join("no-such-dir").join("claim");
        let e = Claim::take(&missing).unwrap_err();
        assert!(e.to_string().contains(ENV_CLAIM_PATH), "{e}");
    }
}
