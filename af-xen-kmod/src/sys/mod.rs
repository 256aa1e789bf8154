// SPDX-License-Identifier: GPL-2.0
//! The only place with `unsafe`: small safe wrappers over `kernel::bindings`,
//! the module-private Xen bindings and the C glue (`glue/`).
//! Everything else in the module is safe Rust.

use core::ffi::c_void;
use kernel::bindings;
use kernel::ffi::{c_int, c_long, c_uint};
use kernel::prelude::*;
use kernel::sync::Arc;

pub(crate) mod entry;
pub(crate) mod family;
pub(crate) mod net;
pub(crate) mod test_hooks;
mod xen;

pub(crate) use xen::*;

#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    non_snake_case,
    dead_code,
    missing_docs,
    improper_ctypes,
    unreachable_pub,
    unnecessary_transmutes,
    unsafe_op_in_unsafe_fn,
    clippy::all
)]
pub(crate) mod xen_sys {
    use kernel::ffi;
    include!("xen_sys.rs");
}

// C glue (glue/*.c), linked into the same .ko.
#[allow(improper_ctypes)]
extern "C" {
    fn afx_family() -> c_int;
    fn afx_proto_register() -> c_int;
    fn afx_proto_unregister();
    fn afx_sk_alloc(
        net: *mut bindings::net,
        sock: *mut bindings::socket,
        kern: c_int,
        privp: *mut c_void,
    ) -> *mut bindings::sock;
    fn afx_sk_priv(sk: *mut bindings::sock) -> *mut c_void;
    fn afx_sk_set_priv(sk: *mut bindings::sock, privp: *mut c_void);
    fn afx_sk_is_ours(sk: *mut bindings::sock) -> c_int;
    fn afx_foreign_getname(
        sock: *mut bindings::socket,
        addr: *mut bindings::sockaddr,
        peer: c_int,
    ) -> c_int;
    fn afx_sk_release(sock: *mut bindings::socket);
    fn afx_sk_graft(sk: *mut bindings::sock, sock: *mut bindings::socket);
    fn afx_rcvtimeo(sk: *mut bindings::sock, nonblock: c_int) -> c_long;
    fn afx_sndtimeo(sk: *mut bindings::sock, nonblock: c_int) -> c_long;
    fn afx_rcvbuf(sk: *mut bindings::sock) -> c_int;
    fn afx_rcvbuf_locked(sk: *mut bindings::sock) -> c_int;
    fn afx_default_ring_kib() -> c_uint;
    fn afx_large_ring_kib() -> c_uint;
    fn afx_large_ring_grants() -> c_uint;
    fn afx_set_err(sk: *mut bindings::sock, err: c_int);
    fn afx_sock_error(sk: *mut bindings::sock) -> c_int;
    fn afx_wait(
        sk: *mut bindings::sock,
        timeo: *mut c_long,
        cond: unsafe extern "C" fn(*mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn afx_wake(sk: *mut bindings::sock, mask: c_uint);
    fn afx_poll_wait(
        file: *mut bindings::file,
        sock: *mut bindings::socket,
        wait: *mut bindings::poll_table_struct,
    );
    fn afx_sigpipe();
    fn afx_xen_domain() -> c_int;
    fn afx_msg_left(msg: *mut bindings::msghdr) -> usize;
    fn afx_accept_flags(arg: *mut bindings::proto_accept_arg) -> c_int;
    fn afx_sk_err_pending(sk: *mut bindings::sock) -> c_int;
    fn afx_linger_abort(sk: *mut bindings::sock) -> c_int;
    fn afx_rcvlowat(sk: *mut bindings::sock) -> c_int;
    fn afx_sk_uid(sk: *mut bindings::sock) -> kernel::ffi::c_uint;
    fn afx_set_listening(sk: *mut bindings::sock, on: c_int);
    fn afx_sockopt_int(optval: bindings::sockptr_t, optlen: c_uint, out: *mut c_int) -> c_int;
    fn afx_spin_lock_irqsave(l: *mut bindings::spinlock_t) -> core::ffi::c_ulong;
    fn afx_spin_unlock_irqrestore(l: *mut bindings::spinlock_t, flags: core::ffi::c_ulong);
    fn afx_sock_hold(sk: *mut bindings::sock);
    fn afx_busy_wait(
        sk: *mut bindings::sock,
        cond: unsafe extern "C" fn(*mut c_void) -> c_int,
        arg: *mut c_void,
    ) -> c_int;
    fn afx_time_data_path() -> c_int;
}

/// How ring writes copy from user memory (`XENSOCK_COPY_ROUTINE`, a
/// benchmark knob; docs/design.md, "Ring copies"). Reads always use
/// copy_to_iter.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyRoutine {
    /// copy_from_iter: copy_user_generic (`rep movs`), the default
    Iter = 0,
    /// copy_from_iter_nocache: non-temporal stores into the ring
    Nocache = 1,
}

impl CopyRoutine {
    pub(crate) fn from_int(v: i32) -> Option<Self> {
        match v {
            0 => Some(Self::Iter),
            1 => Some(Self::Nocache),
            _ => None,
        }
    }
}

/// Monotonic nanoseconds, for the data path's cost counters.
fn now_ns() -> i64 {
    // SAFETY: ktime_get reads the clocksource; callable in any context.
    unsafe { bindings::ktime_get() }
}

/// Times one part of the data path into a counter, when the
/// `time_data_path` module parameter is on (else no clock is read).
pub(crate) struct Timer(Option<i64>);

impl Timer {
    pub(crate) fn start() -> Self {
        // SAFETY: reads a bool module parameter.
        Timer(if unsafe { afx_time_data_path() } != 0 {
            Some(now_ns())
        } else {
            None
        })
    }
    /// Adds the time since `start` to `c` (nothing if timing was off then).
    pub(crate) fn stop(self, c: &core::sync::atomic::AtomicI64) {
        if let Some(t0) = self.0 {
            counters::add(c, now_ns() - t0);
        }
    }
}

pub(crate) mod counters;
pub(crate) use counters::show_counters;

/// errno values (positive), as the socket layer returns them negated.
pub(crate) mod errno {
    #[cfg(afx_test_hooks)]
    pub(crate) const EPERM: i32 = 1;
    pub(crate) const EAGAIN: i32 = 11;
    pub(crate) const ENOMEM: i32 = 12;
    pub(crate) const EFAULT: i32 = 14;
    pub(crate) const ENODEV: i32 = 19;
    pub(crate) const EINVAL: i32 = 22;
    pub(crate) const EPIPE: i32 = 32;
    pub(crate) const EMSGSIZE: i32 = 90;
    pub(crate) const ENOPROTOOPT: i32 = 92;
    pub(crate) const EPROTONOSUPPORT: i32 = 93;
    pub(crate) const ESOCKTNOSUPPORT: i32 = 94;
    pub(crate) const EOPNOTSUPP: i32 = 95;
    pub(crate) const EAFNOSUPPORT: i32 = 97;
    pub(crate) const EADDRINUSE: i32 = 98;
    pub(crate) const EADDRNOTAVAIL: i32 = 99;
    pub(crate) const ENETUNREACH: i32 = 101;
    pub(crate) const ECONNRESET: i32 = 104;
    pub(crate) const ENOBUFS: i32 = 105;
    pub(crate) const EISCONN: i32 = 106;
    pub(crate) const ENOTCONN: i32 = 107;
    pub(crate) const ETIMEDOUT: i32 = 110;
    pub(crate) const ECONNREFUSED: i32 = 111;
    pub(crate) const EHOSTUNREACH: i32 = 113;
    pub(crate) const EALREADY: i32 = 114;
    pub(crate) const EINPROGRESS: i32 = 115;
}

/// poll masks (uapi/asm-generic/poll.h).
pub(crate) mod poll {
    pub(crate) const POLLIN: u32 = 0x1;
    pub(crate) const POLLOUT: u32 = 0x4;
    pub(crate) const POLLERR: u32 = 0x8;
    pub(crate) const POLLHUP: u32 = 0x10;
    pub(crate) const POLLRDNORM: u32 = 0x40;
    pub(crate) const POLLWRNORM: u32 = 0x100;
    pub(crate) const POLLRDHUP: u32 = 0x2000;
}

pub(crate) fn family() -> i32 {
    // SAFETY: reads an int module parameter.
    unsafe { afx_family() }
}

pub(crate) fn running_on_xen() -> bool {
    // SAFETY: trivial C helper.
    unsafe { afx_xen_domain() != 0 }
}

/// `struct proto` registration (C glue owns the struct).
pub(crate) fn proto_register() -> Result {
    // SAFETY: registers the glue's static struct proto once.
    let r = unsafe { afx_proto_register() };
    if r != 0 {
        return Err(Error::from_errno(r));
    }
    Ok(())
}

pub(crate) fn proto_unregister() {
    // SAFETY: paired with a successful proto_register().
    unsafe { afx_proto_unregister() }
}

/// The registered family and socket operations: live from `register` until
/// drop; the socket core only reads them.
pub(crate) struct Registration {
    family: c_int,
    _pf: KBox<bindings::net_proto_family>,
}

// SAFETY: the C structs are immutable after registration; their raw pointers
// (THIS_MODULE) are valid for the module's lifetime.
unsafe impl Send for Registration {}
// SAFETY: see above.
unsafe impl Sync for Registration {}

/// Socket operations table, immutable once built.
pub(crate) struct Ops(pub(crate) bindings::proto_ops);
// SAFETY: immutable function table; `owner` is THIS_MODULE.
unsafe impl Send for Ops {}
// SAFETY: see above.
unsafe impl Sync for Ops {}

impl Registration {
    pub(crate) fn register(
        module: &'static ThisModule,
        family: i32,
        create: unsafe extern "C" fn(
            *mut bindings::net,
            *mut bindings::socket,
            c_int,
            c_int,
        ) -> c_int,
    ) -> Result<Self> {
        let pf = KBox::new(
            bindings::net_proto_family {
                family,
                create: Some(create),
                owner: module.as_ptr(),
            },
            GFP_KERNEL,
        )?;
        // SAFETY: `pf` outlives the registration (sock_unregister in drop).
        let r = unsafe { bindings::sock_register(&*pf) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Ok(Self { family, _pf: pf })
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: registered in `register`; sock_unregister waits (RCU) until
        // no create() call is running.
        unsafe { bindings::sock_unregister(self.family) };
    }
}

/// A `struct socket` handed to us by the socket layer for one call.
#[derive(Clone, Copy)]
pub(crate) struct Socket(pub(super) *mut bindings::socket);

impl Socket {
    /// # Safety
    /// `p` is a live `struct socket` for the duration of the callback.
    pub(super) unsafe fn from_raw(p: *mut bindings::socket) -> Self {
        Self(p)
    }
    pub(crate) fn type_(&self) -> i32 {
        // SAFETY: live socket (constructor contract).
        unsafe { (*self.0).type_ as i32 }
    }
    pub(crate) fn set_ops(&self, ops: &'static Ops) {
        // SAFETY: live socket, being created; ops is 'static.
        unsafe { (*self.0).ops = &ops.0 };
    }
    pub(crate) fn set_connected(&self, connected: bool) {
        let st = if connected {
            bindings::socket_state_SS_CONNECTED
        } else {
            bindings::socket_state_SS_UNCONNECTED
        };
        // SAFETY: live socket; we own `state` for our family.
        unsafe { (*self.0).state = st };
    }
    pub(crate) fn sk(&self) -> Option<Sk> {
        // SAFETY: live socket.
        let sk = unsafe { (*self.0).sk };
        if sk.is_null() {
            None
        } else {
            Some(Sk(sk))
        }
    }
    /// Orphans and drops the sock (the socket is closing).
    pub(crate) fn release_sk(&self) {
        // SAFETY: live socket in release(); detaches and puts its sk.
        unsafe { afx_sk_release(self.0) }
    }
    /// accept(): attach a child sock to this (new) socket.
    pub(crate) fn graft(&self, sk: Sk) {
        // SAFETY: live socket fresh from accept; sk is a live sock we own a ref of.
        unsafe { afx_sk_graft(sk.0, self.0) }
    }
}

/// A `struct sock` of ours (allocated by `afx_sk_alloc`).
#[derive(Clone, Copy)]
pub(crate) struct Sk(pub(super) *mut bindings::sock);

// SAFETY: a struct sock is reference counted and used from any CPU; we only
// call thread-safe helpers on it.
unsafe impl Send for Sk {}
// SAFETY: see above.
unsafe impl Sync for Sk {}

impl Sk {
    /// The struct sock, for a kernel call that keeps it only while this
    /// socket lives (a TCP leg's owner, sys/net.rs).
    pub(crate) fn as_raw(&self) -> *mut bindings::sock {
        self.0
    }
}

impl Sk {
    /// The sock's address, as an identity (never dereferenced).
    pub(crate) fn id(&self) -> usize {
        self.0 as usize
    }
    pub(crate) fn rcvtimeo(&self, nonblock: bool) -> c_long {
        // SAFETY: live sock.
        unsafe { afx_rcvtimeo(self.0, nonblock as c_int) }
    }
    pub(crate) fn sndtimeo(&self, nonblock: bool) -> c_long {
        // SAFETY: live sock.
        unsafe { afx_sndtimeo(self.0, nonblock as c_int) }
    }
    pub(crate) fn rcvbuf(&self) -> i32 {
        // SAFETY: live sock.
        unsafe { afx_rcvbuf(self.0) }
    }
    /// Whether SO_RCVBUF was set on this socket (or on its listener).
    pub(crate) fn rcvbuf_locked(&self) -> bool {
        // SAFETY: live sock; reads one field.
        unsafe { afx_rcvbuf_locked(self.0) != 0 }
    }
    pub(crate) fn set_err(&self, err: i32) {
        // SAFETY: live sock.
        unsafe { afx_set_err(self.0, err) }
    }
    /// Whether an error is pending (poll: POLLERR), without taking it.
    pub(crate) fn err_pending(&self) -> bool {
        // SAFETY: live sock.
        unsafe { afx_sk_err_pending(self.0) != 0 }
    }
    /// SO_RCVLOWAT (1 unless set; the socket layer keeps it >= 1).
    pub(crate) fn rcvlowat(&self) -> usize {
        // SAFETY: live sock; reads one field.
        let v = unsafe { afx_rcvlowat(self.0) };
        usize::try_from(v).unwrap_or(1).max(1)
    }
    /// The socket listens (`SO_ACCEPTCONN` reports it) or no longer does.
    pub(crate) fn set_listening(&self, on: bool) {
        // SAFETY: live sock; writes one field.
        unsafe { afx_set_listening(self.0, c_int::from(on)) }
    }
    /// The socket's owner (sk_uid).
    pub(crate) fn uid(&self) -> u32 {
        // SAFETY: live sock; reads one field.
        unsafe { afx_sk_uid(self.0) }
    }
    /// SO_LINGER with a zero timeout: close() must reset the connection.
    pub(crate) fn linger_abort(&self) -> bool {
        // SAFETY: live sock.
        unsafe { afx_linger_abort(self.0) != 0 }
    }
    /// Takes the pending error (SO_ERROR semantics): 0 or a negative errno.
    pub(crate) fn take_error(&self) -> i32 {
        // SAFETY: live sock.
        unsafe { afx_sock_error(self.0) }
    }
    pub(crate) fn wake(&self, mask: u32) {
        // SAFETY: live sock.
        unsafe { afx_wake(self.0, mask) }
    }
    /// Spins until `cond()` holds, for at most the socket's busy-poll
    /// budget (SO_BUSY_POLL, 0 by default: no spin). True if it held.
    pub(crate) fn busy_wait<F: FnMut() -> bool>(&self, mut cond: F) -> bool {
        unsafe extern "C" fn tramp<F: FnMut() -> bool>(arg: *mut c_void) -> c_int {
            // SAFETY: `arg` is the `&mut F` passed below, alive for the call.
            let f = unsafe { &mut *(arg as *mut F) };
            f() as c_int
        }
        // SAFETY: live sock; `cond` outlives the call; tramp matches F.
        unsafe { afx_busy_wait(self.0, tramp::<F>, &mut cond as *mut F as *mut c_void) != 0 }
    }
    /// `busy_wait`, its time counted in `WAIT_NS` (the ring waits of the
    /// stream data path).
    pub(crate) fn busy_wait_timed<F: FnMut() -> bool>(&self, cond: F) -> bool {
        let t = Timer::start();
        let r = self.busy_wait(cond);
        t.stop(&counters::WAIT_NS);
        r
    }
    /// `wait`, its time counted in `WAIT_NS`.
    pub(crate) fn wait_timed<F: FnMut() -> bool>(
        &self,
        timeo: &mut c_long,
        cond: F,
    ) -> core::result::Result<(), i32> {
        let t = Timer::start();
        let r = self.wait(timeo, cond);
        t.stop(&counters::WAIT_NS);
        r
    }
    /// Sleeps until `cond()` holds. Returns Ok, or Err(EAGAIN) when the
    /// timeout ran out, or the signal errno.
    pub(crate) fn wait<F: FnMut() -> bool>(
        &self,
        timeo: &mut c_long,
        mut cond: F,
    ) -> core::result::Result<(), i32> {
        unsafe extern "C" fn tramp<F: FnMut() -> bool>(arg: *mut c_void) -> c_int {
            // SAFETY: `arg` is the `&mut F` passed below, alive for the call.
            let f = unsafe { &mut *(arg as *mut F) };
            f() as c_int
        }
        // SAFETY: live sock; `cond` outlives the call; tramp matches F.
        let r = unsafe {
            afx_wait(
                self.0,
                timeo,
                tramp::<F>,
                &mut cond as *mut F as *mut c_void,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(-r)
        }
    }
}

/// A counted reference to a `struct sock` (sock_hold/sock_put): lets the
/// event-channel interrupt wake a socket whose pipe it finds, however the
/// socket is torn down meanwhile. Dropped in process context only.
pub(crate) struct SkRef(*mut bindings::sock);

// SAFETY: a refcounted sock; wake is irq-safe and put happens in process
// context (see drop).
unsafe impl Send for SkRef {}
// SAFETY: see above.
unsafe impl Sync for SkRef {}

impl SkRef {
    pub(crate) fn new(sk: &Sk) -> SkRef {
        // SAFETY: live sock (Sk's contract); the reference is ours until drop.
        unsafe { afx_sock_hold(sk.0) };
        SkRef(sk.0)
    }
    pub(crate) fn is(&self, sk: &Sk) -> bool {
        self.0 == sk.0
    }
    /// Wakes the sock's waiters (poll, recvmsg, sendmsg); irq-safe.
    pub(crate) fn wake(&self, mask: u32) {
        // SAFETY: we hold a reference; afx_wake tolerates an orphaned sock
        // (no wait queue).
        unsafe { afx_wake(self.0, mask) }
    }
}

impl Drop for SkRef {
    fn drop(&mut self) {
        // SAFETY: the reference taken in new().
        unsafe { afx_sk_put(self.0) }
    }
}

/// spin_lock_irqsave for kernel::sync::lock::Lock: the 6.12 kernel crate
/// has no irq-safe spinlock, and the event-channel interrupt shares the
/// link's wake table with process context.
pub(crate) struct IrqSaveBackend;

// SAFETY: spin_lock_irqsave/spin_unlock_irqrestore give mutual exclusion
// against other CPUs and against interrupts on this one; the flags travel
// in the guard state.
unsafe impl kernel::sync::lock::Backend for IrqSaveBackend {
    type State = bindings::spinlock_t;
    type GuardState = core::ffi::c_ulong;
    unsafe fn init(
        ptr: *mut Self::State,
        name: *const kernel::ffi::c_char,
        key: *mut bindings::lock_class_key,
    ) {
        // SAFETY: the caller passes valid storage and static name/key.
        unsafe { bindings::__spin_lock_init(ptr, name, key) }
    }
    unsafe fn lock(ptr: *mut Self::State) -> Self::GuardState {
        // SAFETY: initialised by init (Lock's contract).
        unsafe { afx_spin_lock_irqsave(ptr) }
    }
    unsafe fn unlock(ptr: *mut Self::State, flags: &Self::GuardState) {
        // SAFETY: held by the caller, flags from lock().
        unsafe { afx_spin_unlock_irqrestore(ptr, *flags) }
    }
}

/// A spinlock also taken in hard irq context.
pub(crate) type IrqSpinLock<T> = kernel::sync::lock::Lock<T, IrqSaveBackend>;

/// The `default_ring_kib` module parameter, in bytes.
pub(crate) fn default_ring_bytes() -> usize {
    // SAFETY: reads a module parameter.
    (unsafe { afx_default_ring_kib() } as usize).saturating_mul(1024)
}

/// The `large_ring_kib` module parameter, in bytes: the default receive
/// ring of a stream while grants are plentiful (`ring::remote_rx_ring_capacity`).
pub(crate) fn large_ring_bytes() -> usize {
    // SAFETY: reads a module parameter.
    (unsafe { afx_large_ring_kib() } as usize).saturating_mul(1024)
}

/// The `large_ring_grants` module parameter: how many pages this module
/// may have granted, a new large default ring's included.
pub(crate) fn large_ring_grants() -> usize {
    // SAFETY: reads a module parameter.
    unsafe { afx_large_ring_grants() as usize }
}

pub(crate) fn send_sigpipe() {
    // SAFETY: sends SIGPIPE to the current task.
    unsafe { afx_sigpipe() }
}

/// The message of one sendmsg()/recvmsg() call.
pub(crate) struct Msg(*mut bindings::msghdr);

impl Msg {
    /// # Safety
    /// `p` is the live msghdr of the current sendmsg/recvmsg callback.
    pub(super) unsafe fn from_raw(p: *mut bindings::msghdr) -> Self {
        Self(p)
    }
    pub(crate) fn flags(&self) -> i32 {
        // SAFETY: live msghdr.
        unsafe { (*self.0).msg_flags as i32 }
    }
    /// ORs `f` into `msg_flags` (what recvmsg reports: MSG_TRUNC, MSG_EOR).
    pub(crate) fn add_flags(&mut self, f: i32) {
        // SAFETY: live msghdr of this call; a plain field.
        unsafe { (*self.0).msg_flags |= f as core::ffi::c_uint };
    }
    pub(crate) fn left(&self) -> usize {
        // SAFETY: live msghdr.
        unsafe { afx_msg_left(self.0) }
    }
    /// The msghdr, for a kernel socket call that copies to or from the
    /// same user buffers (sys/net.rs).
    pub(crate) fn as_raw(&mut self) -> *mut bindings::msghdr {
        self.0
    }
    /// Copies from the user's iovecs into `buf`; returns the bytes copied
    /// (short on a fault).
    pub(crate) fn copy_from(&mut self, buf: &mut [u8]) -> usize {
        // SAFETY: live msghdr; buf is valid for buf.len() bytes.
        unsafe {
            bindings::_copy_from_iter(buf.as_mut_ptr().cast(), buf.len(), &mut (*self.0).msg_iter)
        }
    }
    /// Copies `buf` out to the user's iovecs; returns the bytes copied.
    pub(crate) fn copy_to(&mut self, buf: &[u8]) -> usize {
        // SAFETY: live msghdr; buf is valid for buf.len() bytes.
        unsafe { bindings::_copy_to_iter(buf.as_ptr().cast(), buf.len(), &mut (*self.0).msg_iter) }
    }
    /// Copies `len` bytes from the user's iovecs straight into `ring`'s data
    /// area at `offset` (no bounce buffer); returns the bytes copied (short
    /// on a fault, 0 if the range is not inside the data area).
    /// `how` picks the copy routine: the same bytes either way.
    pub(crate) fn copy_into_ring(
        &mut self,
        ring: &crate::proto::mem::RawRing,
        offset: u32,
        len: usize,
        how: CopyRoutine,
    ) -> usize {
        let size = ring.geometry().data_size();
        let offset = offset as usize;
        if offset > size || len > size - offset {
            return 0;
        }
        // SAFETY: live msghdr; offset + len is inside the ring's data area,
        // which stays mapped while `ring`'s pipe lives (the caller holds
        // it). The peer may write the same bytes concurrently: payload is
        // opaque (docs/design.md, "Payload copies are raw").
        unsafe {
            let dst = ring.data_ptr().as_ptr().add(offset).cast();
            let iter = &mut (*self.0).msg_iter;
            match how {
                CopyRoutine::Iter => bindings::_copy_from_iter(dst, len, iter),
                CopyRoutine::Nocache => bindings::_copy_from_iter_nocache(dst, len, iter),
            }
        }
    }
    /// Copies `len` bytes of `ring`'s data area at `offset` straight out to
    /// the user's iovecs; returns the bytes copied (short on a fault).
    pub(crate) fn copy_from_ring(
        &mut self,
        ring: &crate::proto::mem::RawRing,
        offset: u32,
        len: usize,
    ) -> usize {
        let size = ring.geometry().data_size();
        let offset = offset as usize;
        if offset > size || len > size - offset {
            return 0;
        }
        // SAFETY: as in copy_into_ring; the source is read once, the
        // destination is user memory behind the iov_iter.
        unsafe {
            bindings::_copy_to_iter(
                ring.data_ptr().as_ptr().add(offset).cast(),
                len,
                &mut (*self.0).msg_iter,
            )
        }
    }
    /// recvmsg(): report the peer address, if the caller asked for it.
    pub(crate) fn set_name(&mut self, addr: &[u8]) {
        // SAFETY: live msghdr; msg_name, when set, has room for a
        // sockaddr_storage (the socket layer guarantees it for recvmsg).
        unsafe {
            let m = &mut *self.0;
            if !m.msg_name.is_null() {
                core::ptr::copy_nonoverlapping(addr.as_ptr(), m.msg_name.cast::<u8>(), addr.len());
                m.msg_namelen = addr.len() as c_int;
            }
        }
    }
}

/// `dir/node`'s value handed to `f`; None if it is missing or unreadable.
fn with_xenstore_value<R>(
    dir: &core::ffi::CStr,
    node: &core::ffi::CStr,
    f: impl FnOnce(&[u8]) -> R,
) -> Option<R> {
    let mut len: c_uint = 0;
    let xbt = xen_sys::xenbus_transaction { id: 0 };
    // SAFETY: NUL-terminated strings; result is kmalloc'd or an ERR_PTR.
    let p =
        unsafe { xen_sys::xenbus_read(xbt, dir.as_ptr().cast(), node.as_ptr().cast(), &mut len) };
    // SAFETY: IS_ERR only inspects the pointer value.
    if p.is_null() || unsafe { bindings::IS_ERR(p as *const c_void) } {
        return None;
    }
    // SAFETY: p points to len bytes from xenbus_read.
    let r = f(unsafe { core::slice::from_raw_parts(p as *const u8, len as usize) });
    // SAFETY: p was kmalloc'd by xenbus_read; the slice is gone.
    unsafe { bindings::kfree(p as *const c_void) };
    Some(r)
}

/// Our own domid, from XenStore ("domid" relative to our home).
pub(crate) fn xenstore_read_u32(dir: &core::ffi::CStr, node: &core::ffi::CStr) -> Option<u32> {
    with_xenstore_value(dir, node, |s| {
        let digits = s.split(|&b| b == 0).next().unwrap_or(&[]);
        if digits.is_empty() {
            return None;
        }
        digits.iter().try_fold(0u32, |v, &b| {
            if !b.is_ascii_digit() {
                return None;
            }
            v.checked_mul(10)?.checked_add((b - b'0') as u32)
        })
    })
    .flatten()
}

extern "C" {
    fn afx_sk_put(sk: *mut bindings::sock);
}

impl Sk {
    /// Drops our reference to a sock that has no socket (a child never accepted).
    pub(crate) fn put(self) {
        // SAFETY: we own one reference of this sock.
        unsafe { afx_sk_put(self.0) }
    }
}

/// A module-lifetime object that callbacks reach through a static: owned
/// here from `publish` (module init) to `unpublish` (module exit).
///
/// Module exit unpublishes only after the last callback that can reach
/// the object is gone (`sock_unregister`, the sockets' module references,
/// work items cancelled), so a reference from `get` never outlives it.
pub(crate) struct Published<T>(core::sync::atomic::AtomicPtr<T>);

impl<T> Published<T> {
    pub(crate) const fn new() -> Self {
        Published(core::sync::atomic::AtomicPtr::new(core::ptr::null_mut()))
    }
    /// Takes ownership of `v` and makes it reachable; `Err(v)` if an
    /// object is published already.
    pub(crate) fn publish(&self, v: Pin<KBox<T>>) -> core::result::Result<(), Pin<KBox<T>>> {
        // SAFETY: the box is never moved out of: `unpublish` (or the
        // refusal below) pins it again.
        let p = KBox::into_raw(unsafe { Pin::into_inner_unchecked(v) });
        match self.0.compare_exchange(
            core::ptr::null_mut(),
            p,
            core::sync::atomic::Ordering::AcqRel,
            core::sync::atomic::Ordering::Acquire,
        ) {
            Ok(_) => Ok(()),
            // SAFETY: `p` came from `KBox::into_raw` above and was not
            // published.
            Err(_) => Err(unsafe { Pin::new_unchecked(KBox::from_raw(p)) }),
        }
    }
    /// Makes it unreachable and hands it back (to be dropped).
    pub(crate) fn unpublish(&self) -> Option<Pin<KBox<T>>> {
        let p = self
            .0
            .swap(core::ptr::null_mut(), core::sync::atomic::Ordering::AcqRel);
        if p.is_null() {
            return None;
        }
        // SAFETY: `p` came from `KBox::into_raw` in `publish`, and the swap
        // took it out, so it is taken back once; it was never moved.
        Some(unsafe { Pin::new_unchecked(KBox::from_raw(p)) })
    }
    /// The object, while published.
    pub(crate) fn get(&self) -> Option<&'static T> {
        let p = self.0.load(core::sync::atomic::Ordering::Acquire);
        // SAFETY: non-null only between `publish` and `unpublish`, and the
        // callers are callbacks that module exit ends before it unpublishes
        // (see the type's comment).
        unsafe { p.as_ref() }
    }
}

/// Removes element `i` of a vector (KVec has no remove() in 6.12).
pub(crate) fn vec_remove<T>(v: &mut KVec<T>, i: usize) -> T {
    let len = v.len();
    assert!(i < len);
    // SAFETY: i < len; we move element i out, shift the tail down by one and
    // shrink the length, so every element stays owned exactly once.
    unsafe {
        let p = v.as_mut_ptr().add(i);
        let x = core::ptr::read(p);
        core::ptr::copy(p.add(1), p, len - i - 1);
        v.set_len(len - 1);
        x
    }
}

extern "C" {
    fn afx_sk_alloc_child(parent: *mut bindings::sock, privp: *mut c_void) -> *mut bindings::sock;
    fn afx_vzalloc(size: usize) -> *mut c_void;
    fn afx_vfree(p: *mut c_void);
}

impl Sk {
    /// A sock for an incoming connection of the listener `self` (no socket yet).
    pub(crate) fn alloc_child(&self) -> Option<Sk> {
        // SAFETY: self is a live sock of ours.
        let sk = unsafe { afx_sk_alloc_child(self.0, core::ptr::null_mut()) };
        if sk.is_null() {
            None
        } else {
            Some(Sk(sk))
        }
    }
}

/// Zeroed, page-aligned local memory for a ring (loopback connections),
/// freed on drop. Rings over it are only valid while it lives.
pub(crate) struct Region {
    base: core::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: plain kernel memory, accessed only through proto's RawRing (atomics
// and raw copies).
unsafe impl Send for Region {}
// SAFETY: see above.
unsafe impl Sync for Region {}

impl Region {
    pub(crate) fn alloc(len: usize) -> Option<Region> {
        // SAFETY: vzalloc returns page-aligned zeroed memory or NULL.
        let p = unsafe { afx_vzalloc(len) } as *mut u8;
        core::ptr::NonNull::new(p).map(|base| Region { base, len })
    }
    /// A ring of `geometry` over this region. The caller keeps the Region
    /// alive (same owning struct) as long as the ring is used.
    pub(crate) fn ring(
        &self,
        geometry: crate::proto::layout::RingGeometry,
    ) -> Option<crate::proto::mem::RawRing> {
        // SAFETY: base is page aligned (>= 128), valid for len bytes while
        // self lives, and only ever accessed through RawRing.
        unsafe { crate::proto::mem::RawRing::from_region(self.base, self.len, geometry) }.ok()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: allocated by afx_vzalloc; no ring over it is used any more.
        unsafe { afx_vfree(self.base.as_ptr().cast()) }
    }
}

// The kernel structs behind these pointers hold an empty struct
// (mod_arch_specific on x86), which improper_ctypes flags even though only
// pointers cross the boundary and C owns the layout.
#[allow(improper_ctypes)]
extern "C" {
    fn afx_proc_init() -> c_int;
    fn afx_proc_exit();
    fn afx_seq_write(m: *mut bindings::seq_file, p: *const c_void, n: usize);
}

/// /proc/net/af_xen, removed on drop.
pub(crate) struct ProcEntry;

impl ProcEntry {
    pub(crate) fn create() -> Result<ProcEntry> {
        // SAFETY: creates the entry once; its show callback is
        // afx_rs_proc_show, valid until drop removes the entry.
        let r = unsafe { afx_proc_init() };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Ok(ProcEntry)
    }
}

impl Drop for ProcEntry {
    fn drop(&mut self) {
        // SAFETY: created in create(); remove_proc_entry waits for readers.
        unsafe { afx_proc_exit() }
    }
}

/// A line buffer for /proc output.
pub(crate) struct Line {
    buf: [u8; 256],
    len: usize,
}

impl Line {
    pub(crate) fn new() -> Self {
        Line {
            buf: [0; 256],
            len: 0,
        }
    }
    pub(crate) fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl core::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        let b = s.as_bytes();
        let n = b.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&b[..n]);
        self.len += n;
        Ok(())
    }
}

/// A seq_file being shown.
pub(crate) struct Seq(pub(super) *mut bindings::seq_file);

impl Seq {
    pub(crate) fn write(&mut self, b: &[u8]) {
        // SAFETY: live seq_file of the show callback; b valid for its length.
        unsafe { afx_seq_write(self.0, b.as_ptr().cast(), b.len()) }
    }
    /// `name value` lines, one per counter (/proc/net/af_xen_stats): the
    /// names stand next to their values, and no line buffer fills up.
    pub(crate) fn counters(&mut self, counters: &[(&str, i64)]) {
        use core::fmt::Write;
        for (name, value) in counters {
            let mut l = Line::new();
            let _ = writeln!(l, "{name} {value}");
            self.write(l.bytes());
        }
    }
}
