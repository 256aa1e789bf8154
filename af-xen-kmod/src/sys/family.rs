// SPDX-License-Identifier: GPL-2.0
//! The socket family's boundary: `proto_ops` and `net_proto_family`
//! callbacks, turned from the raw arguments the socket layer passes into
//! safe ones ([`Socket`], the state attached to the sock, a sockaddr as a
//! byte slice, a [`Msg`]) and handed to a [`Family`].
//!
//! Each sock of the family carries one `Arc<F::Sock>` reference in its
//! private field, attached at create (or when a listener's child is made)
//! and detached at release. Only this file reads that field, and only as
//! `F::Sock` of the one family whose ops the sock has.

use super::{afx_accept_flags, afx_sockopt_int, errno as e, Msg, Sk, Socket};
use core::ffi::c_void;
use core::marker::PhantomData;
use kernel::bindings;
use kernel::ffi::{c_int, c_uint, c_ulong};
use kernel::prelude::*;
use kernel::sync::{Arc, ArcBorrow};

/// A socket family in safe Rust. Every callback but `create`, `release`,
/// `poll` and `ioctl` is called only for a socket that carries its state
/// (`-EINVAL` otherwise). Results are what the socket layer expects: 0 or
/// a byte count, or a negative errno.
pub(crate) trait Family: 'static {
    /// The state each sock of the family carries.
    type Sock: Send + Sync + 'static;
    /// A socket address as `getname` fills it in.
    type Name: AsRef<[u8]>;

    /// Makes the state of a new socket (with [`Socket::alloc_sk`]); the
    /// floor attaches it to the sock.
    fn create(
        sock: &Socket,
        new: &NewSock,
        protocol: i32,
    ) -> core::result::Result<Arc<Self::Sock>, i32>;
    /// The socket is closing; its state, detached from the sock, if any.
    fn release(sock: &Socket, state: Option<Arc<Self::Sock>>);
    fn bind(s: ArcBorrow<'_, Self::Sock>, addr: &[u8]) -> c_int;
    fn listen(s: ArcBorrow<'_, Self::Sock>, backlog: i32) -> c_int;
    fn getname(s: ArcBorrow<'_, Self::Sock>, peer: bool) -> core::result::Result<Self::Name, i32>;
    fn connect(sock: &Socket, s: ArcBorrow<'_, Self::Sock>, addr: &[u8], flags: i32) -> c_int;
    fn accept(s: ArcBorrow<'_, Self::Sock>, newsock: &Socket, flags: i32) -> c_int;
    /// The readiness mask (the floor has registered the poll table).
    fn poll(s: Option<ArcBorrow<'_, Self::Sock>>) -> u32;
    /// `arg` is the caller's user-space pointer.
    fn ioctl(sock: &Socket, s: Option<ArcBorrow<'_, Self::Sock>>, cmd: u32, arg: usize) -> c_int;
    fn shutdown(s: ArcBorrow<'_, Self::Sock>, how: i32) -> c_int;
    fn sendmsg(s: ArcBorrow<'_, Self::Sock>, msg: &mut Msg) -> c_int;
    fn recvmsg(s: ArcBorrow<'_, Self::Sock>, msg: &mut Msg, flags: i32) -> c_int;
    fn setsockopt(
        s: ArcBorrow<'_, Self::Sock>,
        level: i32,
        optname: i32,
        value: &SockoptValue,
    ) -> c_int;
    /// Levels other than SOL_SOCKET (the socket layer answers that one).
    fn getsockopt(
        s: ArcBorrow<'_, Self::Sock>,
        level: i32,
        optname: i32,
        out: &SockoptOut,
    ) -> c_int;
}

/// What `create` needs to allocate a sock ([`Socket::alloc_sk`]).
pub(crate) struct NewSock {
    net: *mut bindings::net,
    kern: c_int,
}

/// A `setsockopt` value, still in the caller's memory.
pub(crate) struct SockoptValue {
    optval: bindings::sockptr_t,
    optlen: c_uint,
}

impl SockoptValue {
    /// Sets this option on a dual listener's TCP listener instead (the
    /// socket layer's result).
    pub(crate) fn set_on(
        &self,
        held: &super::net::HeldListener,
        level: i32,
        optname: i32,
    ) -> c_int {
        // SAFETY: held.0 is live while borrowed; optval/optlen are this
        // setsockopt() call's, passed on as TCP's own setsockopt takes them.
        unsafe {
            super::net::afx_listener_setsockopt(held.0, level, optname, self.optval, self.optlen)
        }
    }

    /// An int value: Ok(v), or the positive errno (EINVAL short, EFAULT).
    pub(crate) fn int(&self) -> core::result::Result<i32, i32> {
        let mut v: c_int = 0;
        // SAFETY: optval/optlen are the setsockopt() callback's arguments
        // (this value lives only during it); the glue checks the length
        // and copies with copy_from_sockptr.
        let r = unsafe { afx_sockopt_int(self.optval, self.optlen, &mut v) };
        if r != 0 {
            Err(-r)
        } else {
            Ok(v)
        }
    }
}

/// Where a `getsockopt` answer goes: the caller's optval and optlen.
pub(crate) struct SockoptOut {
    optval: *mut kernel::ffi::c_char,
    optlen: *mut c_int,
}

impl SockoptOut {
    /// The TCP and IP options of a TCP program's socket that an AF_XEN
    /// sock carries now (`afx_inet_getsockopt`): 0 or the positive errno.
    pub(crate) fn inet(&self, level: i32, optname: i32) -> core::result::Result<(), i32> {
        // SAFETY: optval/optlen are the getsockopt() callback's user
        // pointers; the helper reads and writes them with get_user,
        // put_user and copy_to_user, within the length optlen gives.
        let r =
            unsafe { super::net::afx_inet_getsockopt(level, optname, self.optval, self.optlen) };
        if r < 0 {
            Err(-r)
        } else {
            Ok(())
        }
    }
}

impl Socket {
    /// Allocates and initialises our `struct sock` for this socket.
    pub(crate) fn alloc_sk(&self, new: &NewSock) -> Option<Sk> {
        // SAFETY: `new` holds the create() callback's net and kern, and
        // this socket is the one being created.
        let sk = unsafe { super::afx_sk_alloc(new.net, self.0, new.kern, core::ptr::null_mut()) };
        if sk.is_null() {
            None
        } else {
            Some(Sk(sk))
        }
    }
}

impl Sk {
    /// Attaches a socket's state to its sock (a child made for accept).
    pub(crate) fn attach<F: Family>(&self, state: Arc<F::Sock>) {
        let p = Arc::into_raw(state) as *const c_void;
        // SAFETY: live sock of our proto; it keeps this reference until
        // `detach`.
        unsafe { super::afx_sk_set_priv(self.0, p as *mut c_void) }
    }
    /// Takes the state back from the sock (closing it).
    pub(crate) fn detach<F: Family>(&self) -> Option<Arc<F::Sock>> {
        // SAFETY: live sock of our proto.
        let p = unsafe { super::afx_sk_priv(self.0) };
        if p.is_null() {
            return None;
        }
        // SAFETY: live sock of our proto; cleared first so that the
        // reference is taken back exactly once.
        unsafe { super::afx_sk_set_priv(self.0, core::ptr::null_mut()) };
        // SAFETY: `p` came from `Arc::into_raw` of an `F::Sock` (`attach`).
        Some(unsafe { Arc::from_raw(p as *const F::Sock) })
    }
    /// Whether this sock is of our proto (and so has the private field).
    fn is_ours(&self) -> bool {
        // SAFETY: live sock; the helper compares its sk_prot.
        unsafe { super::afx_sk_is_ours(self.0) != 0 }
    }
    /// The attached state, for as long as the callback runs; None for a
    /// sock that is not of our proto. A callback meets one when the socket
    /// changed hands while another thread's call on it began: accept(2)
    /// asks for the name of a connection a dual listener handed to TCP,
    /// and a call that read the socket's ops before `XENSOCK_IOC_GRAFT`
    /// swapped them reads the sock after (the private field of another
    /// proto's sock would be anything).
    fn borrow<'a, F: Family>(&'a self) -> Option<ArcBorrow<'a, F::Sock>> {
        if !self.is_ours() {
            return None;
        }
        // SAFETY: live sock of our proto (checked above).
        let p = unsafe { super::afx_sk_priv(self.0) };
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` came from `Arc::into_raw` of an `F::Sock` and the
        // sock keeps that reference until release(), which cannot run
        // concurrently with another callback on the same socket (the
        // file reference pins it).
        Some(unsafe { ArcBorrow::from_raw(p as *const F::Sock) })
    }
}

/// The family's callbacks, for [`build_ops`] and [`Registration`].
pub(crate) struct Callbacks<F>(PhantomData<F>);

/// The state attached to a callback's sock.
fn state_of<F: Family>(sk: &Option<Sk>) -> Option<ArcBorrow<'_, F::Sock>> {
    sk.as_ref().and_then(|sk| sk.borrow::<F>())
}

macro_rules! with_state {
    ($f:ty, $sock:expr, |$s:ident, $socket:ident| $body:expr) => {{
        // SAFETY: the socket layer passes a live socket for the duration
        // of the callback.
        let $socket = unsafe { Socket::from_raw($sock) };
        let sk = $socket.sk();
        match state_of::<$f>(&sk) {
            Some($s) => $body,
            None => -e::EINVAL,
        }
    }};
}

impl<F: Family> Callbacks<F> {
    unsafe extern "C" fn create(
        net: *mut bindings::net,
        sock: *mut bindings::socket,
        protocol: c_int,
        kern: c_int,
    ) -> c_int {
        // SAFETY: called by __sock_create with a live socket.
        let socket = unsafe { Socket::from_raw(sock) };
        match F::create(&socket, &NewSock { net, kern }, protocol) {
            Ok(state) => match socket.sk() {
                Some(sk) => {
                    sk.attach::<F>(state);
                    0
                }
                None => {
                    drop(state);
                    -e::ENOMEM
                }
            },
            Err(x) => -x,
        }
    }

    unsafe extern "C" fn release(sock: *mut bindings::socket) -> c_int {
        // SAFETY: live socket in release().
        let socket = unsafe { Socket::from_raw(sock) };
        let Some(sk) = socket.sk() else {
            return 0;
        };
        let state = sk.detach::<F>();
        F::release(&socket, state);
        socket.release_sk();
        0
    }

    unsafe extern "C" fn bind(
        sock: *mut bindings::socket,
        addr: *mut bindings::sockaddr,
        len: c_int,
    ) -> c_int {
        with_state!(F, sock, |s, _socket| {
            // SAFETY: the socket layer copied `len` bytes of the caller's
            // address to `addr` (move_addr_to_kernel).
            match unsafe { sockaddr_in(addr, len) } {
                Some(a) => F::bind(s, a),
                None => -e::EINVAL,
            }
        })
    }

    unsafe extern "C" fn listen(sock: *mut bindings::socket, backlog: c_int) -> c_int {
        with_state!(F, sock, |s, _socket| F::listen(s, backlog))
    }

    unsafe extern "C" fn getname(
        sock: *mut bindings::socket,
        addr: *mut bindings::sockaddr,
        peer: c_int,
    ) -> c_int {
        // SAFETY: live socket for the duration of the callback.
        let socket = unsafe { Socket::from_raw(sock) };
        if socket.sk().is_some_and(|sk| !sk.is_ours()) {
            // accept(2) asks the listener's ops for the name of the socket
            // it accepted, which a dual listener may have made TCP's
            // SAFETY: the callback's own live socket and address buffer.
            return unsafe { super::afx_foreign_getname(sock, addr, peer) };
        }
        with_state!(F, sock, |s, _socket| match F::getname(s, peer != 0) {
            Ok(name) => {
                let b = name.as_ref();
                let n = b
                    .len()
                    .min(core::mem::size_of::<bindings::__kernel_sockaddr_storage>());
                // SAFETY: getname() receives a sockaddr_storage-sized
                // kernel buffer; at most that many bytes are written.
                unsafe { core::ptr::copy_nonoverlapping(b.as_ptr(), addr.cast::<u8>(), n) };
                n as c_int
            }
            Err(x) => -x,
        })
    }

    unsafe extern "C" fn connect(
        sock: *mut bindings::socket,
        addr: *mut bindings::sockaddr,
        len: c_int,
        flags: c_int,
    ) -> c_int {
        with_state!(F, sock, |s, socket| {
            // SAFETY: as in bind: `len` bytes copied to `addr`.
            match unsafe { sockaddr_in(addr, len) } {
                Some(a) => F::connect(&socket, s, a, flags),
                None => -e::EINVAL,
            }
        })
    }

    unsafe extern "C" fn accept(
        sock: *mut bindings::socket,
        newsock: *mut bindings::socket,
        arg: *mut bindings::proto_accept_arg,
    ) -> c_int {
        with_state!(F, sock, |s, _socket| {
            // SAFETY: a live socket freshly allocated by the socket layer.
            let newsock = unsafe { Socket::from_raw(newsock) };
            // SAFETY: live proto_accept_arg of this accept() call.
            let flags = unsafe { afx_accept_flags(arg) };
            F::accept(s, &newsock, flags)
        })
    }

    unsafe extern "C" fn socketpair(_a: *mut bindings::socket, _b: *mut bindings::socket) -> c_int {
        -e::EOPNOTSUPP
    }

    /// No mapping of a socket (ENODEV, as `sock_no_mmap`).
    unsafe extern "C" fn mmap(
        _file: *mut bindings::file,
        _sock: *mut bindings::socket,
        _vma: *mut bindings::vm_area_struct,
    ) -> c_int {
        -e::ENODEV
    }

    unsafe extern "C" fn poll(
        file: *mut bindings::file,
        sock: *mut bindings::socket,
        wait: *mut bindings::poll_table_struct,
    ) -> bindings::__poll_t {
        // SAFETY: live socket for the duration of the callback.
        let socket = unsafe { Socket::from_raw(sock) };
        // SAFETY: the poll() callback's own file, socket and table.
        unsafe { super::afx_poll_wait(file, sock, wait) };
        let sk = socket.sk();
        F::poll(state_of::<F>(&sk))
    }

    unsafe extern "C" fn ioctl(sock: *mut bindings::socket, cmd: c_uint, arg: c_ulong) -> c_int {
        // SAFETY: live socket for the duration of the callback.
        let socket = unsafe { Socket::from_raw(sock) };
        let sk = socket.sk();
        F::ioctl(&socket, state_of::<F>(&sk), cmd, arg as usize)
    }

    unsafe extern "C" fn shutdown(sock: *mut bindings::socket, how: c_int) -> c_int {
        with_state!(F, sock, |s, _socket| F::shutdown(s, how))
    }

    unsafe extern "C" fn sendmsg(
        sock: *mut bindings::socket,
        msg: *mut bindings::msghdr,
        _len: usize,
    ) -> c_int {
        with_state!(F, sock, |s, _socket| {
            // SAFETY: the live msghdr of this call.
            let mut msg = unsafe { Msg::from_raw(msg) };
            F::sendmsg(s, &mut msg)
        })
    }

    unsafe extern "C" fn recvmsg(
        sock: *mut bindings::socket,
        msg: *mut bindings::msghdr,
        _len: usize,
        flags: c_int,
    ) -> c_int {
        with_state!(F, sock, |s, _socket| {
            // SAFETY: the live msghdr of this call.
            let mut msg = unsafe { Msg::from_raw(msg) };
            F::recvmsg(s, &mut msg, flags)
        })
    }

    unsafe extern "C" fn setsockopt(
        sock: *mut bindings::socket,
        level: c_int,
        optname: c_int,
        optval: bindings::sockptr_t,
        optlen: c_uint,
    ) -> c_int {
        with_state!(F, sock, |s, _socket| F::setsockopt(
            s,
            level,
            optname,
            &SockoptValue { optval, optlen }
        ))
    }

    unsafe extern "C" fn getsockopt(
        sock: *mut bindings::socket,
        level: c_int,
        optname: c_int,
        optval: *mut kernel::ffi::c_char,
        optlen: *mut c_int,
    ) -> c_int {
        with_state!(F, sock, |s, _socket| F::getsockopt(
            s,
            level,
            optname,
            &SockoptOut { optval, optlen }
        ))
    }
}

/// A sockaddr the socket layer copied into kernel memory, as bytes.
///
/// # Safety
/// `p` is null or points to `len` readable bytes that outlive `'a`.
unsafe fn sockaddr_in<'a>(p: *const bindings::sockaddr, len: c_int) -> Option<&'a [u8]> {
    if p.is_null() || len < 0 {
        return None;
    }
    // SAFETY: the caller's contract.
    Some(unsafe { core::slice::from_raw_parts(p.cast::<u8>(), len as usize) })
}

/// The family's `proto_ops` table (pinned in the module object; each
/// socket's `ops` points at it).
pub(crate) fn build_ops<F: Family>(module: &'static ThisModule, family: i32) -> super::Ops {
    let mut o = bindings::proto_ops::default();
    o.family = family;
    o.owner = module.as_ptr();
    o.release = Some(Callbacks::<F>::release);
    o.bind = Some(Callbacks::<F>::bind);
    o.connect = Some(Callbacks::<F>::connect);
    o.socketpair = Some(Callbacks::<F>::socketpair);
    o.accept = Some(Callbacks::<F>::accept);
    o.getname = Some(Callbacks::<F>::getname);
    o.poll = Some(Callbacks::<F>::poll);
    o.listen = Some(Callbacks::<F>::listen);
    o.shutdown = Some(Callbacks::<F>::shutdown);
    o.sendmsg = Some(Callbacks::<F>::sendmsg);
    o.recvmsg = Some(Callbacks::<F>::recvmsg);
    o.setsockopt = Some(Callbacks::<F>::setsockopt);
    o.getsockopt = Some(Callbacks::<F>::getsockopt);
    // sock_do_ioctl calls ops->ioctl and sock_mmap calls ops->mmap without
    // a NULL check: leaving either unset oopses the kernel on any ioctl or
    // mmap of the socket. Every entry the socket layer calls without a
    // check is set here; the others (splice_read, gettstamp, peek_len,
    // set_rcvlowat, read_sock, ...) fall back to the socket layer's
    // defaults when unset.
    o.ioctl = Some(Callbacks::<F>::ioctl);
    o.mmap = Some(Callbacks::<F>::mmap);
    super::Ops(o)
}

/// The family's `create`, for [`super::Registration::register`].
pub(crate) fn create_fn<F: Family>(
) -> unsafe extern "C" fn(*mut bindings::net, *mut bindings::socket, c_int, c_int) -> c_int {
    Callbacks::<F>::create
}
