// SPDX-License-Identifier: MIT OR Apache-2.0
//! The floor: the C functions this library puts in front of libc's, the
//! way to libc's own (`dlsym(RTLD_NEXT)`), and every other `unsafe` block
//! of the library, each with its `// SAFETY:` comment. It calls nothing
//! above it: the layer above installs its [`Hooks`] when the library is
//! loaded, and until then (or if it never does) every call goes straight
//! to libc.

use std::ffi::CStr;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

use libc::{c_int, c_void, sockaddr, socklen_t};

/// What becomes of a program's connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Connect {
    /// The program's call goes to libc (TCP), unchanged.
    Tcp,
    /// The socket is connected already (it took over an AF_XEN
    /// connection): the program's call returns 0.
    Done,
}

/// What the layer above does at the calls this library sees. Unless a
/// hook says otherwise, the call itself then goes to libc, unchanged.
pub trait Hooks: Sync {
    /// A TCP socket `fd` is about to connect to `peer`.
    fn connect(&self, fd: RawFd, peer: SocketAddr) -> Connect;
    /// A TCP socket `fd` listens now (with `backlog`), bound to `local`
    /// if it is.
    fn listening(&self, fd: RawFd, local: Option<SocketAddr>, backlog: c_int);
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
            if is_tcp(fd) && hooks.connect(fd, peer) == Connect::Done {
                // as TCP's: a non-blocking connect is in progress, and
                // completes at once (POLLOUT, SO_ERROR 0; the module woke
                // an edge-triggered EPOLLOUT registered before it)
                if is_nonblocking(fd) {
                    set_errno(libc::EINPROGRESS);
                    return -1;
                }
                return 0;
            }
        }
    }
    // SAFETY: the caller's arguments, unchanged (this function's contract).
    unsafe { real_connect(fd, addr, len) }
}

/// libc's `connect`.
///
/// # Safety
/// As libc's `connect`.
unsafe fn real_connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    match real(&REAL_CONNECT, c"connect") {
        0 => {
            set_errno(libc::ENOSYS);
            -1
        }
        // SAFETY: the address dlsym gave for "connect" is libc's connect,
        // whose type this is; the arguments are the caller's (its contract).
        f => unsafe { std::mem::transmute::<usize, ConnectFn>(f)(fd, addr, len) },
    }
}

/// `listen(2)`; the hooks see a socket that listens now.
#[no_mangle]
pub extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the caller's arguments, unchanged (no pointers).
    let r = unsafe { real_listen(fd, backlog) };
    if r == 0 {
        if let Some(hooks) = HOOKS.get() {
            if is_tcp(fd) {
                // the program's errno is its listen's (0), whatever the hook did
                // SAFETY: __errno_location returns this thread's errno.
                let saved = unsafe { *libc::__errno_location() };
                hooks.listening(fd, local_addr(fd), backlog);
                set_errno(saved);
            }
        }
    }
    r
}

/// `struct xensock_resolve` (af-xen-kmod/include/xensock.h).
#[repr(C)]
struct Resolve {
    family: u16,
    zero: u16,
    domid: u32,
    addr: [u8; 16],
}

/// `struct xensock_graft`.
#[repr(C)]
struct Graft {
    fd: i32,
    addrlen: u32,
    addr: [u8; 28],
}

/// `struct sockaddr_xen`.
#[repr(C)]
struct SockaddrXen {
    family: u16,
    flags: u16,
    port: u32,
    domid: u32,
    zero: u32,
}

/// `XENSOCK_IOC_RESOLVE`, `_IOWR('X', 0x10, struct xensock_resolve)`.
const IOC_RESOLVE: libc::c_ulong = 0xC018_5810;
/// `XENSOCK_REUSEPORT` (level: the family): SO_REUSEPORT for AF_XEN.
const XENSOCK_REUSEPORT: c_int = 0x7e62;
/// `XENSOCK_IOC_GRAFT`, `_IOW('X', 0x11, struct xensock_graft)`.
const IOC_GRAFT: libc::c_ulong = 0x4024_5811;

fn check(r: c_int) -> io::Result<c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

/// An AF_XEN stream socket of this library's own: it asks the module
/// which guest has an address, connects to that guest, and hands the
/// connection to the program's TCP socket.
pub struct XenSocket(OwnedFd);

impl XenSocket {
    /// A new AF_XEN stream socket (close-on-exec: a program's exec must
    /// not inherit it), of the module's `family`.
    pub fn open(family: c_int) -> io::Result<XenSocket> {
        // SAFETY: socket() takes no pointers.
        let fd = check(unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) })?;
        // SAFETY: `fd` was just returned by socket(); nothing else owns it.
        Ok(XenSocket(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// The co-resident guest that has `ip` (EHOSTUNREACH: none).
    pub fn resolve(&self, ip: IpAddr) -> io::Result<u32> {
        let mut r = Resolve {
            family: 0,
            zero: 0,
            domid: 0,
            addr: [0; 16],
        };
        match ip.to_canonical() {
            IpAddr::V4(a) => {
                r.family = libc::AF_INET as u16;
                r.addr[..4].copy_from_slice(&a.octets());
            }
            IpAddr::V6(a) => {
                r.family = libc::AF_INET6 as u16;
                r.addr = a.octets();
            }
        }
        // SAFETY: the request is a live `struct xensock_resolve`, which the
        // module reads and writes back whole.
        check(unsafe { libc::ioctl(self.0.as_raw_fd(), IOC_RESOLVE, &mut r as *mut Resolve) })?;
        Ok(r.domid)
    }

    /// A blocking connect waits at most `d` (EINPROGRESS after that).
    pub fn set_connect_timeout(&self, d: Duration) -> io::Result<()> {
        let tv = libc::timeval {
            tv_sec: d.as_secs() as libc::time_t,
            tv_usec: d.subsec_micros() as libc::suseconds_t,
        };
        // SAFETY: `tv` is a live timeval of the size given.
        check(unsafe {
            libc::setsockopt(
                self.0.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDTIMEO,
                &tv as *const libc::timeval as *const c_void,
                std::mem::size_of::<libc::timeval>() as socklen_t,
            )
        })
        .map(|_| ())
    }

    /// Connects to AF_XEN port `port` of guest `domid` (libc's connect,
    /// not this library's).
    pub fn connect(&self, family: c_int, domid: u32, port: u32) -> io::Result<()> {
        let a = SockaddrXen {
            family: family as u16,
            flags: 0,
            port,
            domid,
            zero: 0,
        };
        // SAFETY: `a` is a live sockaddr_xen of the size given.
        check(unsafe {
            real_connect(
                self.0.as_raw_fd(),
                &a as *const SockaddrXen as *const sockaddr,
                std::mem::size_of::<SockaddrXen>() as socklen_t,
            )
        })
        .map(|_| ())
    }

    /// Binds to AF_XEN port `port` (any domain's: this guest's), with
    /// XENSOCK_REUSEPORT if `reuse_port` (it joins the AF_XEN listeners of
    /// the program's other sockets on that port), and listens with
    /// `backlog`.
    pub fn listen_on(
        &self,
        family: c_int,
        port: u32,
        backlog: c_int,
        reuse_port: bool,
    ) -> io::Result<()> {
        if reuse_port {
            let one: c_int = 1;
            // SAFETY: `one` is a live int of the size given.
            check(unsafe {
                libc::setsockopt(
                    self.0.as_raw_fd(),
                    family,
                    XENSOCK_REUSEPORT,
                    &one as *const c_int as *const c_void,
                    std::mem::size_of::<c_int>() as socklen_t,
                )
            })?;
        }
        let a = SockaddrXen {
            family: family as u16,
            flags: 0,
            port,
            domid: u32::MAX,
            zero: 0,
        };
        // SAFETY: `a` is a live sockaddr_xen of the size given.
        check(unsafe {
            libc::bind(
                self.0.as_raw_fd(),
                &a as *const SockaddrXen as *const sockaddr,
                std::mem::size_of::<SockaddrXen>() as socklen_t,
            )
        })?;
        // SAFETY: listen takes no pointers (libc's, not this library's hook:
        // the socket is AF_XEN, which the hook would pass over anyway).
        check(unsafe { real_listen(self.0.as_raw_fd(), backlog) }).map(|_| ())
    }

    /// Moves this socket's connection into the program's TCP socket `fd`,
    /// which then answers as connected to `peer` (XENSOCK_IOC_GRAFT). This
    /// socket is left with the unused TCP sock, closed when it drops. On a
    /// listening socket, with `fd` a listening one and `peer` its own
    /// address: `fd` becomes this AF_XEN listener holding its TCP listener
    /// (the dual listener), and this socket is left with nothing.
    pub fn graft_into(&self, fd: RawFd, peer: SocketAddr) -> io::Result<()> {
        let (addr, addrlen) = encode_inet(peer);
        let g = Graft {
            fd,
            addrlen: addrlen as u32,
            addr,
        };
        // SAFETY: `g` is a live `struct xensock_graft`, which the module
        // only reads.
        check(unsafe { libc::ioctl(self.0.as_raw_fd(), IOC_GRAFT, &g as *const Graft) }).map(|_| ())
    }
}

/// libc's `listen`.
///
/// # Safety
/// As libc's `listen` (no pointers).
unsafe fn real_listen(fd: c_int, backlog: c_int) -> c_int {
    match real(&REAL_LISTEN, c"listen") {
        0 => {
            set_errno(libc::ENOSYS);
            -1
        }
        // SAFETY: libc's listen, whose type this is.
        f => unsafe { std::mem::transmute::<usize, ListenFn>(f)(fd, backlog) },
    }
}

/// The `struct sockaddr_in`/`sockaddr_in6` bytes of `a`, and their length.
fn encode_inet(a: SocketAddr) -> ([u8; 28], usize) {
    let mut b = [0u8; 28];
    match a {
        SocketAddr::V4(v4) => {
            b[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v4.port().to_be_bytes());
            b[4..8].copy_from_slice(&v4.ip().octets());
            (b, std::mem::size_of::<libc::sockaddr_in>())
        }
        SocketAddr::V6(v6) => {
            b[..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b[2..4].copy_from_slice(&v6.port().to_be_bytes());
            b[4..8].copy_from_slice(&v6.flowinfo().to_be_bytes());
            b[8..24].copy_from_slice(&v6.ip().octets());
            b[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            (b, std::mem::size_of::<libc::sockaddr_in6>())
        }
    }
}

/// The AF_INET/AF_INET6 address at `addr` (`len` bytes), read so that a
/// bad pointer is a failed read here (and EFAULT from the real call), not
/// a crash in this library.
fn read_inet(addr: *const c_void, len: socklen_t) -> Option<SocketAddr> {
    let mut buf = [0u8; std::mem::size_of::<libc::sockaddr_in6>()];
    let n = (len as usize).min(buf.len());
    if addr.is_null() || n < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    if !read_own_memory(addr, &mut buf[..n]) {
        return None;
    }
    decode_inet(&buf[..n])
}

/// Kernels without CONFIG_CROSS_MEMORY_ATTACH have no process_vm_readv
/// (ENOSYS): remembered, and the pipe is used from then on.
static NO_VM_READV: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Copies `out.len()` bytes at `addr` of this process into `out`; false if
/// they are not all readable. `process_vm_readv` on ourselves, or where
/// the kernel lacks it, a write of them into a pipe and a read back: the
/// kernel reports an unreadable source as EFAULT instead of faulting.
fn read_own_memory(addr: *const c_void, out: &mut [u8]) -> bool {
    let n = out.len();
    if !NO_VM_READV.load(Ordering::Relaxed) {
        let local = libc::iovec {
            iov_base: out.as_mut_ptr() as *mut c_void,
            iov_len: n,
        };
        let remote = libc::iovec {
            iov_base: addr as *mut c_void,
            iov_len: n,
        };
        // SAFETY: `local` describes `out`, ours for the call; `remote` is
        // only read, by the kernel, which fails the call (EFAULT) instead
        // of faulting if it is not readable.
        let got = unsafe { libc::process_vm_readv(libc::getpid(), &local, 1, &remote, 1, 0) };
        if got >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
            return got == n as isize;
        }
        NO_VM_READV.store(true, Ordering::Relaxed);
    }
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`, ours.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return false;
    }
    // SAFETY: both descriptors were just made by pipe2 and are ours alone.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: the kernel reads `n` bytes at `addr` (EFAULT if it cannot);
    // a pipe takes far more than a sockaddr without blocking.
    let put = unsafe { libc::write(w.as_raw_fd(), addr, n) };
    if put != n as isize {
        return false;
    }
    // SAFETY: `out` is ours and `n` bytes long.
    let got = unsafe { libc::read(r.as_raw_fd(), out.as_mut_ptr() as *mut c_void, n) };
    got == n as isize
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

/// Whether the program set SO_REUSEPORT on `fd`.
pub fn reuses_port(fd: RawFd) -> bool {
    int_option(fd, libc::SOL_SOCKET, libc::SO_REUSEPORT) == Some(1)
}

/// Whether `fd` is in non-blocking mode (O_NONBLOCK).
fn is_nonblocking(fd: RawFd) -> bool {
    // SAFETY: F_GETFL takes no pointer.
    let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    fl >= 0 && fl & libc::O_NONBLOCK != 0
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
        let (bytes, n) = encode_inet(a);
        assert_eq!(
            decode_inet(&bytes[..n]),
            Some(a),
            "encode is decode's inverse"
        );
        let a6: SocketAddr = "[fd00::7]:443".parse().unwrap();
        let (bytes, n) = encode_inet(a6);
        assert_eq!((decode_inet(&bytes[..n]), n), (Some(a6), 28));
        assert_eq!(read_inet(std::ptr::null(), 16), None);
        assert_eq!(
            read_inet(8 as *const c_void, 16),
            None,
            "unreadable: no crash"
        );
        // the way kernels without process_vm_readv get
        NO_VM_READV.store(true, Ordering::Relaxed);
        assert_eq!(
            read_inet(p, std::mem::size_of_val(&sin) as socklen_t),
            Some(a)
        );
        assert_eq!(read_inet(8 as *const c_void, 16), None, "pipe: no crash");
        NO_VM_READV.store(false, Ordering::Relaxed);
    }
}
