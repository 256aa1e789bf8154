// SPDX-License-Identifier: MIT OR Apache-2.0
//! Unix `SOCK_SEQPACKET` sockets with file-descriptor passing
//! (`SCM_RIGHTS`), plus the memfd / eventfd / mmap helpers of the sim.
//! std has none of these; this is the only file of the crate with raw
//! system calls on sockets.

use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Most descriptors the kernel accepts in one message (`SCM_MAX_FD`).
pub(crate) const MAX_FDS: usize = 253;

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: every caller passes a descriptor just returned by a successful
    // system call and owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

fn sockaddr(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= addr.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("socket path too long: {}", path.display()),
        ));
    }
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    Ok((addr, size_of::<libc::sockaddr_un>() as libc::socklen_t))
}

fn new_socket() -> io::Result<OwnedFd> {
    // SAFETY: plain socket(2) call.
    let fd =
        cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    Ok(owned(fd))
}

/// A listening `SOCK_SEQPACKET` socket.
pub(crate) struct SeqListener {
    fd: OwnedFd,
}

impl SeqListener {
    pub(crate) fn bind(path: &Path) -> io::Result<SeqListener> {
        let _ = std::fs::remove_file(path);
        let fd = new_socket()?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) })?;
        // SAFETY: plain listen(2) on our socket.
        cvt(unsafe { libc::listen(fd.as_raw_fd(), 64) })?;
        Ok(SeqListener { fd })
    }

    pub(crate) fn accept(&self) -> io::Result<SeqPacket> {
        loop {
            // SAFETY: accept4 with null address pointers is allowed.
            let rc = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            match cvt(rc) {
                Ok(fd) => return Ok(SeqPacket { fd: owned(fd) }),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

/// A connected `SOCK_SEQPACKET` socket: message boundaries are kept, and
/// descriptors can travel with a message.
#[derive(Debug)]
pub(crate) struct SeqPacket {
    fd: OwnedFd,
}

impl SeqPacket {
    pub(crate) fn connect(path: &Path) -> io::Result<SeqPacket> {
        let fd = new_socket()?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes.
        cvt(unsafe { libc::connect(fd.as_raw_fd(), std::ptr::addr_of!(addr).cast(), len) })?;
        Ok(SeqPacket { fd })
    }

    pub(crate) fn try_clone(&self) -> io::Result<SeqPacket> {
        Ok(SeqPacket {
            fd: self.fd.try_clone()?,
        })
    }

    pub(crate) fn shutdown(&self) {
        // SAFETY: plain shutdown(2) on our socket.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// Sends one message with up to [`MAX_FDS`] descriptors.
    pub(crate) fn send(&self, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
        if fds.len() > MAX_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many descriptors for one message",
            ));
        }
        let mut iov = libc::iovec {
            iov_base: data.as_ptr() as *mut libc::c_void,
            iov_len: data.len(),
        };
        let raw: Vec<RawFd> = fds.iter().map(|f| f.as_raw_fd()).collect();
        let fd_bytes = std::mem::size_of_val(raw.as_slice());
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE(fd_bytes as u32) } as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        // SAFETY: msghdr is plain old data; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !raw.is_empty() {
            msg.msg_control = cbuf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points to `space` bytes, enough for one
            // cmsghdr carrying `fd_bytes` of data (CMSG_SPACE); CMSG_FIRSTHDR
            // therefore returns a valid pointer into `cbuf`.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(&msg);
                (*c).cmsg_level = libc::SOL_SOCKET;
                (*c).cmsg_type = libc::SCM_RIGHTS;
                (*c).cmsg_len = libc::CMSG_LEN(fd_bytes as u32) as _;
                std::ptr::copy_nonoverlapping(
                    raw.as_ptr().cast::<u8>(),
                    libc::CMSG_DATA(c),
                    fd_bytes,
                );
            }
        }
        loop {
            // SAFETY: `msg` references `iov`, `data` and `cbuf`, all alive
            // for the call.
            let rc = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if rc >= 0 {
                return Ok(());
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }

    /// Receives one message. Returns 0 bytes at end of stream. Descriptors
    /// arrive close-on-exec.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> io::Result<(usize, Vec<OwnedFd>)> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        // SAFETY: CMSG_SPACE is a pure size computation.
        let space = unsafe { libc::CMSG_SPACE((MAX_FDS * size_of::<RawFd>()) as u32) } as usize;
        let mut cbuf = vec![0u64; space.div_ceil(8)];
        // SAFETY: msghdr is plain old data; all-zero is valid.
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        let n = loop {
            // SAFETY: `msg` references `iov` (over `buf`) and `cbuf`, both
            // alive and writable for the call.
            let rc =
                unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
            if rc >= 0 {
                break rc as usize;
            }
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        };
        let mut fds = Vec::new();
        // SAFETY: after a successful recvmsg the control buffer holds
        // msg_controllen bytes of well-formed cmsg headers; we walk them
        // with the CMSG macros and only read SCM_RIGHTS payloads, each of
        // which holds cmsg_len - CMSG_LEN(0) bytes of descriptors that are
        // now ours.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c);
                    let bytes = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                    for i in 0..bytes / size_of::<RawFd>() {
                        let fd = data
                            .add(i * size_of::<RawFd>())
                            .cast::<RawFd>()
                            .read_unaligned();
                        fds.push(owned(fd));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if msg.msg_flags & (libc::MSG_TRUNC | libc::MSG_CTRUNC) != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "control message truncated",
            ));
        }
        Ok((n, fds))
    }
}

impl AsFd for SeqPacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A new memfd of `len` bytes (zero-filled).
pub(crate) fn memfd(len: usize) -> io::Result<OwnedFd> {
    let name = CString::new("xensock-sim-grant").map_err(io::Error::other)?;
    // SAFETY: `name` is a valid C string.
    let fd = cvt(unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) })?;
    let fd = owned(fd);
    let len = libc::off_t::try_from(len).map_err(io::Error::other)?;
    // SAFETY: plain ftruncate(2) on our memfd.
    cvt(unsafe { libc::ftruncate(fd.as_raw_fd(), len) })?;
    Ok(fd)
}

/// A second, read-only open of the same memory: mappings made from it can
/// never be writable (mmap with PROT_WRITE and MAP_SHARED fails with EACCES).
pub(crate) fn reopen_read_only(fd: &OwnedFd) -> io::Result<OwnedFd> {
    let path =
        CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(io::Error::other)?;
    // SAFETY: `path` is a valid C string.
    let ro = cvt(unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) })?;
    Ok(owned(ro))
}

/// A non-blocking eventfd.
pub(crate) fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain eventfd(2) call.
    let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
    Ok(owned(fd))
}

/// Adds one to an eventfd's counter (a "kick"). A full counter is already
/// as kicked as it gets, so EAGAIN is success.
pub(crate) fn kick(fd: BorrowedFd<'_>) -> io::Result<()> {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64.
    let rc = unsafe { libc::write(fd.as_raw_fd(), std::ptr::addr_of!(one).cast(), 8) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::WouldBlock {
            return Err(e);
        }
    }
    Ok(())
}

/// Reads and resets an eventfd's counter; Ok(false) if nothing was pending.
pub(crate) fn drain(fd: BorrowedFd<'_>) -> io::Result<bool> {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    let rc = unsafe { libc::read(fd.as_raw_fd(), std::ptr::addr_of_mut!(v).cast(), 8) };
    if rc < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::WouldBlock {
            return Ok(false);
        }
        return Err(e);
    }
    Ok(v > 0)
}

/// Sets byte `offset` of the memfd to zero, through a short-lived mapping.
pub(crate) fn clear_byte(fd: BorrowedFd<'_>, offset: usize) -> io::Result<()> {
    let page = offset & !(xensock_xenif::PAGE_SIZE - 1);
    let off = libc::off_t::try_from(page).map_err(io::Error::other)?;
    // SAFETY: a fresh shared mapping of one page chosen by the kernel.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            xensock_xenif::PAGE_SIZE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `p` maps one page and `offset - page` is below PAGE_SIZE; the
    // write is volatile because another process shares the page.
    unsafe {
        std::ptr::write_volatile(p.cast::<u8>().add(offset - page), 0);
        libc::munmap(p, xensock_xenif::PAGE_SIZE);
    }
    Ok(())
}
