// SPDX-License-Identifier: MIT OR Apache-2.0
//! The floor: the C functions this library puts in front of libc's, the
//! way to libc's own (`dlsym(RTLD_NEXT)`), and every other `unsafe` block
//! of the library, each with its `// SAFETY:` comment. It calls nothing
//! above it: the layer above installs its [`Hooks`] when the library is
//! loaded, and until then (or if it never does) every call goes straight
//! to libc.

use std::ffi::CStr;
use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use libc::{c_int, c_void, sockaddr, socklen_t};

/// What the layer above does at the calls this library sees. The call
/// itself then goes to libc, unchanged.
pub trait Hooks: Sync {
    /// A TCP socket `fd` is about to connect to `peer`.
    fn connect(&self, fd: RawFd, peer: SocketAddr);
    /// A TCP socket `fd` is about to listen, bound to `local` if it is.
    fn listen(&self, fd: RawFd, local: Option<SocketAddr>);
}

static HOOKS: OnceLock<&'static dyn Hooks> = OnceLock::new();

/// Installs the hooks (once: the library's constructor does it).
pub fn install(hooks: &'static dyn Hooks) {
    let _ = HOOKS.set(hooks);
}

/// libc's own function `name`, looked up once (0: not found).
fn real(cache: &AtomicUsize, name: &CStr) -> usize {
    let mut f = cache.load(Ordering::Acquire);
    if f == 0 {
        // SAFETY: `name` is a NUL-terminated string; RTLD_NEXT looks the
        // symbol up in the objects loaded after this one, i.e. libc's.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
        cache.store(f, Ordering::Release);
    }
    f
}

type ConnectFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
type ListenFn = unsafe extern "C" fn(c_int, c_int) -> c_int;
static REAL_CONNECT: AtomicUsize = AtomicUsize::new(0);
static REAL_LISTEN: AtomicUsize = AtomicUsize::new(0);

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno, always valid.
    unsafe { *libc::__errno_location() = e };
}

/// `connect(2)`, seen by the hooks first.
///
/// # Safety
/// As libc's `connect`: `addr` points at `len` bytes (a bad pointer is the
/// kernel's to report, as without this library).
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if let Some(hooks) = HOOKS.get() {
        if let Some(peer) = read_inet(addr as *const c_void, len) {
            if is_tcp(fd) {
                hooks.connect(fd, peer);
            }
        }
    }
    match real(&REAL_CONNECT, c"connect") {
        0 => {
            set_errno(libc::ENOSYS);
            -1
        }
        // SAFETY: the address dlsym gave for "connect" is libc's connect,
        // whose type this is; the caller's arguments go on unchanged.
        f => unsafe { std::mem::transmute::<usize, ConnectFn>(f)(fd, addr, len) },
    }
}

/// `listen(2)`, seen by the hooks first.
#[no_mangle]
pub extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    if let Some(hooks) = HOOKS.get() {
        if is_tcp(fd) {
            hooks.listen(fd, local_addr(fd));
        }
    }
    match real(&REAL_LISTEN, c"listen") {
        0 => {
            set_errno(libc::ENOSYS);
            -1
        }
        // SAFETY: libc's listen, whose type this is; arguments unchanged.
        f => unsafe { std::mem::transmute::<usize, ListenFn>(f)(fd, backlog) },
    }
}

/// The AF_INET/AF_INET6 address at `addr` (`len` bytes), read with
/// `process_vm_readv` on ourselves so that a bad pointer is a failed read
/// here (and EFAULT from the real call), not a crash in this library.
fn read_inet(addr: *const c_void, len: socklen_t) -> Option<SocketAddr> {
    let mut buf = [0u8; std::mem::size_of::<libc::sockaddr_in6>()];
    let n = (len as usize).min(buf.len());
    if addr.is_null() || n < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut c_void,
        iov_len: n,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut c_void,
        iov_len: n,
    };
    // SAFETY: `local` describes `buf`, ours for the call; `remote` is only
    // read, by the kernel, which fails the call (EFAULT) instead of
    // faulting if it is not readable.
    let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
    if got != n as isize {
        return None;
    }
    decode_inet(&buf[..n])
}

/// An AF_INET/AF_INET6 `struct sockaddr` from its bytes.
fn decode_inet(b: &[u8]) -> Option<SocketAddr> {
    let family = c_int::from(u16::from_ne_bytes([b[0], b[1]]));
    match family {
        libc::AF_INET if b.len() >= std::mem::size_of::<libc::sockaddr_in>() => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let ip = Ipv4Addr::new(b[4], b[5], b[6], b[7]);
            Some(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        }
        libc::AF_INET6 if b.len() >= std::mem::size_of::<libc::sockaddr_in6>() => {
            let port = u16::from_be_bytes([b[2], b[3]]);
            let flow = u32::from_be_bytes([b[4], b[5], b[6], b[7]]);
            let ip: [u8; 16] = b[8..24].try_into().ok()?;
            let scope = u32::from_ne_bytes([b[24], b[25], b[26], b[27]]);
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                flow,
                scope,
            )))
        }
        _ => None,
    }
}

fn int_option(fd: RawFd, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: getsockopt writes at most `len` bytes into `v`, ours.
    let r = unsafe {
        libc::getsockopt(
            fd,
            level,
            name,
            &mut v as *mut c_int as *mut c_void,
            &mut len,
        )
    };
    (r == 0).then_some(v)
}

/// Whether `fd` is an AF_INET or AF_INET6 TCP socket.
pub fn is_tcp(fd: RawFd) -> bool {
    let domain = int_option(fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
    matches!(domain, Some(libc::AF_INET | libc::AF_INET6))
        && int_option(fd, libc::SOL_SOCKET, libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && int_option(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL) == Some(libc::IPPROTO_TCP)
}

/// The address `fd` is bound to.
pub fn local_addr(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: sockaddr_storage is plain data; all zeroes is a valid value.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: getsockname writes at most `len` bytes into `ss`, ours.
    let r = unsafe { libc::getsockname(fd, &mut ss as *mut _ as *mut sockaddr, &mut len) };
    if r != 0 {
        return None;
    }
    // SAFETY: `ss` is initialised (zeroed, then written by the kernel);
    // viewed as the bytes it is made of, within its size.
    let bytes = unsafe {
        std::slice::from_raw_parts(
            &ss as *const _ as *const u8,
            (len as usize).min(std::mem::size_of_val(&ss)),
        )
    };
    decode_inet(bytes)
}

/// Whether descriptor `fd` is a socket: a program that closed its stderr
/// may have a connection there, which a log line must not go into.
pub fn is_socket(fd: RawFd) -> bool {
    // SAFETY: fstat writes into `st`, ours; all zeroes is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::fstat(fd, &mut st) };
    r != 0 || st.st_mode & libc::S_IFMT == libc::S_IFSOCK
}

/// Writes `line` to descriptor 2 in one call (a short write is dropped:
/// a log line is not worth blocking or looping in someone else's call).
pub fn write_stderr(line: &[u8]) -> io::Result<()> {
    // SAFETY: `line` is valid for its length for the call.
    let r = unsafe { libc::write(2, line.as_ptr() as *const c_void, line.len()) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inet_addresses_decode_from_their_bytes() {
        let a: SocketAddr = "10.0.0.12:6379".parse().unwrap();
        let sin = libc::sockaddr_in {
            sin_family: libc::AF_INET as libc::sa_family_t,
            sin_port: 6379u16.to_be(),
            sin_addr: libc::in_addr {
                s_addr: u32::from_ne_bytes([10, 0, 0, 12]),
            },
            sin_zero: [0; 8],
        };
        let p = &sin as *const libc::sockaddr_in as *const c_void;
        assert_eq!(
            read_inet(p, std::mem::size_of_val(&sin) as socklen_t),
            Some(a)
        );
        assert_eq!(read_inet(p, 4), None, "too short for its family");
        assert_eq!(read_inet(std::ptr::null(), 16), None);
        assert_eq!(
            read_inet(8 as *const c_void, 16),
            None,
            "unreadable: no crash"
        );
    }
}
