// SPDX-License-Identifier: GPL-2.0
//! Safe wrappers over kernel TCP sockets (glue/af_xen_net.c) for the TCP
//! carrier. Every `unsafe` of the TCP carrier is here.

use kernel::bindings;
use kernel::ffi::{c_int, c_void};

// The kernel structs behind these pointers hold an empty struct
// (mod_arch_specific on x86), which improper_ctypes flags even though only
// pointers cross the boundary and C owns the layout.
#[allow(improper_ctypes)]
extern "C" {
    fn afx_tcp_port() -> c_int;
    fn afx_tcp_local_addr(out: *mut u8) -> c_int;
    fn afx_random_u64() -> u64;
    fn afx_tcp_schedule();
    fn afx_tcp_flush();
    fn afx_tcp_schedule_after_ms(ms: kernel::ffi::c_uint);
    fn afx_now_ms() -> u64;
    fn afx_tcp_listen(port: c_int, out: *mut *mut bindings::socket) -> c_int;
    fn afx_tcp_accept(l: *mut bindings::socket, out: *mut *mut bindings::socket) -> c_int;
    #[cfg(afx_test_hooks)]
    fn afx_tcp_connect(addr: *const u8, port: c_int, out: *mut *mut bindings::socket) -> c_int;
    fn afx_tcp_recv(s: *mut bindings::socket, buf: *mut c_void, len: usize) -> c_int;
    #[cfg(afx_test_hooks)]
    fn afx_tcp_send(s: *mut bindings::socket, buf: *const c_void, len: usize) -> c_int;
    fn afx_tcp_release(s: *mut bindings::socket);
    fn afx_peer_lost_ms() -> c_int;
    fn afx_tcp_tick_after_ms(ms: kernel::ffi::c_uint);
    fn afx_tcp_live_after_ms(ms: kernel::ffi::c_uint);
    fn afx_tcp_connect_start(
        addr: *const u8,
        port: c_int,
        user_timeout_ms: kernel::ffi::c_uint,
        out: *mut *mut bindings::socket,
    ) -> c_int;
    fn afx_tcp_leg_state(s: *mut bindings::socket) -> c_int;
    fn afx_tcp_set_user_timeout(s: *mut bindings::socket, ms: kernel::ffi::c_uint);
    fn afx_tcp_segs_in(s: *mut bindings::socket) -> u32;
    fn afx_tcp_leg_waits(s: *mut bindings::socket) -> c_int;
    fn afx_tcp_kick_retransmit(s: *mut bindings::socket) -> c_int;
    fn afx_tcp_send_nb(
        s: *mut bindings::socket,
        buf: *const c_void,
        len: usize,
        more: c_int,
    ) -> c_int;
    fn afx_tcp_recv_msg(s: *mut bindings::socket, user: *mut bindings::msghdr, len: usize)
        -> c_int;
    fn afx_tcp_send_msg_nb(
        s: *mut bindings::socket,
        user: *mut bindings::msghdr,
        len: usize,
        more: c_int,
    ) -> c_int;
    fn afx_tcp_readable(s: *mut bindings::socket) -> c_int;
    fn afx_tcp_leg_info(s: *mut bindings::socket, out: *mut c_int);
    fn afx_tcp_nospace_armed() -> kernel::ffi::c_long;
    fn afx_tcp_set_owner(s: *mut bindings::socket, owner: *mut bindings::sock, flags: c_int);
    fn afx_tcp_writable(s: *mut bindings::socket) -> c_int;
    fn afx_graft_tcp(ours: *mut bindings::socket, fd: c_int, family: c_int) -> c_int;
    fn afx_graft_listener(
        ours: *mut bindings::socket,
        fd: c_int,
        family: c_int,
        held: *mut *mut bindings::socket,
        spare: *mut bindings::sock,
    ) -> c_int;
    fn afx_listener_accept(held: *mut bindings::socket, newsock: *mut bindings::socket) -> c_int;
    fn afx_listener_ready(held: *mut bindings::socket) -> c_int;
    fn afx_listener_getname(held: *mut bindings::socket, addr: *mut bindings::sockaddr) -> c_int;
    pub(super) fn afx_listener_setsockopt(
        held: *mut bindings::socket,
        level: c_int,
        optname: c_int,
        optval: bindings::sockptr_t,
        optlen: kernel::ffi::c_uint,
    ) -> c_int;
    fn afx_listener_release(held: *mut bindings::socket);
    pub(super) fn afx_inet_getsockopt(
        level: c_int,
        optname: c_int,
        optval: *mut kernel::ffi::c_char,
        optlen: *mut c_int,
    ) -> c_int;
    fn afx_pm_register() -> c_int;
    fn afx_pm_unregister();
}

/// The save/restore hooks (a platform device's freeze/thaw/restore).
pub(crate) struct PmHooks;

impl PmHooks {
    pub(crate) fn register() -> Option<PmHooks> {
        // SAFETY: registers a static driver and device once (module init).
        (unsafe { afx_pm_register() } == 0).then_some(PmHooks)
    }
}

impl Drop for PmHooks {
    fn drop(&mut self) {
        // SAFETY: unregisters what register() registered (module exit).
        unsafe { afx_pm_unregister() }
    }
}

/// The `peer_lost_ms` module parameter (at least 100).
pub(crate) fn peer_lost_ms() -> u64 {
    // SAFETY: reads an int module parameter.
    let v = unsafe { afx_peer_lost_ms() };
    u64::try_from(v).unwrap_or(10_000)
}

/// Runs the TCP work item again in `ms` milliseconds (the carrier's
/// deadlines; separate from the hello deadlines' delayed work).
pub(crate) fn tick_after_ms(ms: u32) {
    // SAFETY: schedules a static delayed work item.
    unsafe { afx_tcp_tick_after_ms(ms) }
}

/// Runs the TCP work item again in `ms` milliseconds for the legs'
/// liveness check (its own delayed work: a pending one keeps its time).
pub(crate) fn live_after_ms(ms: u32) {
    // SAFETY: schedules a static delayed work item.
    unsafe { afx_tcp_live_after_ms(ms) }
}

/// The `tcp_port` module parameter (0: no TCP carrier).
pub(crate) fn tcp_port() -> u16 {
    // SAFETY: reads an int module parameter.
    let p = unsafe { afx_tcp_port() };
    u16::try_from(p).unwrap_or(0)
}

/// The IPv4 address to advertise for our TCP legs, if any.
pub(crate) fn local_ipv4() -> Option<[u8; 4]> {
    let mut a = [0u8; 4];
    // SAFETY: `a` is 4 writable bytes; the glue reads the parameter or the
    // interface list under RCU.
    (unsafe { afx_tcp_local_addr(a.as_mut_ptr()) } != 0).then_some(a)
}

/// 64 random bits (get_random_bytes).
pub(crate) fn random_u64() -> u64 {
    // SAFETY: no arguments; get_random_bytes may be called in any context.
    unsafe { afx_random_u64() }
}

/// Runs the TCP work item ([`super::entry::EntryPoints::leg_work`]) soon.
pub(crate) fn schedule() {
    // SAFETY: schedules a static work item.
    unsafe { afx_tcp_schedule() }
}

/// Runs the TCP work item again in `ms` milliseconds (deadlines).
pub(crate) fn schedule_after_ms(ms: u32) {
    // SAFETY: schedules a static delayed work item.
    unsafe { afx_tcp_schedule_after_ms(ms) }
}

/// A monotonic clock in milliseconds (CLOCK_MONOTONIC: it does not count
/// the time this guest was saved).
pub(crate) fn now_ms() -> u64 {
    // SAFETY: reads the clock.
    unsafe { afx_now_ms() }
}

/// Waits for a running TCP work item and cancels a queued one (unload,
/// after every socket with our callbacks was released).
pub(crate) fn flush() {
    // SAFETY: cancels a static work item; process context.
    unsafe { afx_tcp_flush() }
}

/// A kernel TCP socket (init_net), released on drop. Its `sk_data_ready`
/// and `sk_state_change` schedule the TCP work item.
impl super::Socket {
    /// Moves this socket's connected AF_XEN sock into the calling
    /// process's unconnected TCP socket `fd` of `family`, and that socket's
    /// TCP sock into this one (see `afx_graft_tcp`). Err: the positive
    /// errno, nothing changed.
    pub(crate) fn graft_into_tcp(&self, fd: i32, family: u16) -> core::result::Result<(), i32> {
        // SAFETY: self.0 is the live socket of the ioctl being served; the
        // helper looks `fd` up in the caller's table and holds a reference
        // on it while it swaps under the TCP sock's lock.
        to_result(unsafe { afx_graft_tcp(self.0, fd, c_int::from(family)) }).map(|_| ())
    }
}

impl super::Socket {
    /// Moves the calling process's listening TCP socket `fd` of `family`
    /// into a socket of our own (returned), and this listening AF_XEN
    /// socket's sock into `fd` (see `afx_graft_listener`): the dual
    /// listener. This socket takes `spare`, a sock of ours with no socket
    /// (`Sk::alloc_child`), in its place. Err: the positive errno, nothing
    /// changed (`spare` still the caller's).
    pub(crate) fn graft_listener(
        &self,
        fd: i32,
        family: u16,
        spare: &super::Sk,
    ) -> core::result::Result<HeldListener, i32> {
        let mut held: *mut bindings::socket = core::ptr::null_mut();
        // SAFETY: self.0 is the live socket of the ioctl being served;
        // the helper looks `fd` up in the caller's table and writes the
        // held socket only on success; `spare` is a live sock of ours that
        // no socket holds, grafted to this one only on success.
        to_result(unsafe {
            afx_graft_listener(self.0, fd, c_int::from(family), &mut held, spare.0)
        })?;
        Ok(HeldListener(held))
    }
}

/// A TCP program's listener, held by its AF_XEN listener (the dual
/// listener): released, with TCP's callbacks back, when this drops.
pub(crate) struct HeldListener(pub(super) *mut bindings::socket);

// SAFETY: a kernel socket may be used from any thread; the helpers lock
// what they touch (kernel_accept, sk_callback_lock) or read locklessly.
unsafe impl Send for HeldListener {}
// SAFETY: as above.
unsafe impl Sync for HeldListener {}

impl HeldListener {
    /// Makes `newsock` (the socket accept(2) made) the next TCP connection
    /// this listener has; Err(EAGAIN): none.
    pub(crate) fn accept_into(&self, newsock: &super::Socket) -> core::result::Result<(), i32> {
        // SAFETY: self.0 is live while we hold it; newsock is the live
        // socket of the accept being served, with no sock yet.
        to_result(unsafe { afx_listener_accept(self.0, newsock.0) }).map(|_| ())
    }

    /// Whether a connection waits to be accepted.
    pub(crate) fn ready(&self) -> bool {
        // SAFETY: self.0 is live; the helper reads the accept queue locklessly.
        unsafe { afx_listener_ready(self.0) != 0 }
    }

    /// The TCP listener's own name (a sockaddr_in or sockaddr_in6).
    pub(crate) fn name(&self) -> core::result::Result<([u8; 28], usize), i32> {
        // SAFETY: sockaddr_storage is plain data; all zeroes is valid.
        let mut ss: bindings::__kernel_sockaddr_storage = unsafe { core::mem::zeroed() };
        // SAFETY: self.0 is live; getname writes at most a
        // sockaddr_storage into `ss`, ours.
        let n = to_result(unsafe {
            afx_listener_getname(
                self.0,
                (&mut ss as *mut bindings::__kernel_sockaddr_storage).cast(),
            )
        })? as usize;
        let mut out = [0u8; 28];
        let n = n.min(out.len());
        // SAFETY: `ss` is initialised and at least `n` <= 28 bytes long.
        let bytes = unsafe { core::slice::from_raw_parts(&ss as *const _ as *const u8, n) };
        out[..n].copy_from_slice(bytes);
        Ok((out, n))
    }
}

impl Drop for HeldListener {
    fn drop(&mut self) {
        // SAFETY: self.0 is live and ours alone; released exactly once.
        unsafe { afx_listener_release(self.0) }
    }
}

pub(crate) struct TcpSock(*mut bindings::socket);

// SAFETY: a kernel socket may be used from any thread; the socket layer
// locks internally, and we never use one concurrently from two places
// without the TCP state's mutex.
unsafe impl Send for TcpSock {}
// SAFETY: as above.
unsafe impl Sync for TcpSock {}

fn to_result(r: c_int) -> core::result::Result<c_int, i32> {
    if r < 0 {
        Err(-r)
    } else {
        Ok(r)
    }
}

impl TcpSock {
    /// Listens on INADDR_ANY:`port`.
    pub(crate) fn listen(port: u16) -> core::result::Result<TcpSock, i32> {
        let mut s: *mut bindings::socket = core::ptr::null_mut();
        // SAFETY: `s` is a valid out pointer; set only on success.
        to_result(unsafe { afx_tcp_listen(port as c_int, &mut s) })?;
        Ok(TcpSock(s))
    }

    /// A pending connection, without blocking (Err(EAGAIN) when none).
    pub(crate) fn accept(&self) -> core::result::Result<TcpSock, i32> {
        let mut s: *mut bindings::socket = core::ptr::null_mut();
        // SAFETY: self.0 is a live listening socket; `s` set only on success.
        to_result(unsafe { afx_tcp_accept(self.0, &mut s) })?;
        Ok(TcpSock(s))
    }

    /// Connects to `addr:port` (blocking; process context): the leg test
    /// trigger's hello with a wrong cookie.
    #[cfg(afx_test_hooks)]
    pub(crate) fn connect(addr: [u8; 4], port: u16) -> core::result::Result<TcpSock, i32> {
        let mut s: *mut bindings::socket = core::ptr::null_mut();
        // SAFETY: `addr` is 4 readable bytes; `s` set only on success.
        to_result(unsafe { afx_tcp_connect(addr.as_ptr(), port as c_int, &mut s) })?;
        Ok(TcpSock(s))
    }

    /// Starts connecting to `addr:port` without blocking; `state()` tells
    /// when it is up. The leg gives up after `user_timeout_ms` without
    /// acknowledgement (TCP_USER_TIMEOUT).
    pub(crate) fn connect_start(
        addr: [u8; 4],
        port: u16,
        user_timeout_ms: u32,
    ) -> core::result::Result<TcpSock, i32> {
        let mut s: *mut bindings::socket = core::ptr::null_mut();
        // SAFETY: `addr` is 4 readable bytes; `s` set only on success.
        to_result(unsafe {
            afx_tcp_connect_start(addr.as_ptr(), port as c_int, user_timeout_ms, &mut s)
        })?;
        Ok(TcpSock(s))
    }

    /// Ok(true) established, Ok(false) still connecting, Err(errno) failed or closed.
    pub(crate) fn state(&self) -> core::result::Result<bool, i32> {
        // SAFETY: self.0 is live.
        to_result(unsafe { afx_tcp_leg_state(self.0) }).map(|v| v == 1)
    }

    /// TCP_USER_TIMEOUT: a peer that stops acknowledging for `ms` fails the socket.
    pub(crate) fn set_user_timeout(&self, ms: u32) {
        // SAFETY: self.0 is live.
        unsafe { afx_tcp_set_user_timeout(self.0, ms) }
    }

    /// Segments received so far (pure ACKs included; wraps).
    pub(crate) fn segs_in(&self) -> u32 {
        // SAFETY: self.0 is live; the glue reads one counter of its sock.
        unsafe { afx_tcp_segs_in(self.0) }
    }

    /// Whether this leg waits for an answer from its peer: None when it
    /// holds nothing unacknowledged or unsent; Some(true) while a
    /// retransmission or window probe is outstanding (afx_tcp_leg_waits).
    /// Takes the socket's lock.
    pub(crate) fn waits(&self) -> Option<bool> {
        // SAFETY: self.0 is live; process context (the TCP work item).
        match unsafe { afx_tcp_leg_waits(self.0) } {
            w if w < 0 => None,
            w => Some(w > 0),
        }
    }

    /// A retransmission backed off at least twice fires now (see the glue's
    /// afx_tcp_kick_retransmit); whether it did. Takes the socket's lock.
    pub(crate) fn kick_retransmit(&self) -> bool {
        // SAFETY: self.0 is live; process context (the TCP work item).
        unsafe { afx_tcp_kick_retransmit(self.0) != 0 }
    }

    /// Sends what fits without blocking: Ok(n), Err(EAGAIN) when full;
    /// held back (MSG_MORE) when `more` follows at once.
    pub(crate) fn send_nb(&self, buf: &[u8], more: bool) -> core::result::Result<usize, i32> {
        // SAFETY: self.0 is live; buf is readable for buf.len() bytes.
        let n = to_result(unsafe {
            afx_tcp_send_nb(self.0, buf.as_ptr().cast(), buf.len(), c_int::from(more))
        })?;
        leg_calls::count(&leg_calls::SENDS);
        Ok(n as usize)
    }

    /// Reads what is there without blocking: Ok(0) at EOF, Err(EAGAIN) when nothing.
    pub(crate) fn recv(&self, buf: &mut [u8]) -> core::result::Result<usize, i32> {
        // SAFETY: self.0 is live; buf is writable for buf.len() bytes.
        let n = to_result(unsafe { afx_tcp_recv(self.0, buf.as_mut_ptr().cast(), buf.len()) })?;
        leg_calls::count(&leg_calls::RECVS);
        Ok(n as usize)
    }

    /// Sends at most `len` bytes straight from the user buffers of the
    /// sendmsg being served (`msg` advances by what was taken), without
    /// blocking, held back (MSG_MORE) when `more` follows at once: Ok(n),
    /// Err(EAGAIN) when full, Err(EFAULT).
    pub(crate) fn send_from_user(
        &self,
        msg: &mut crate::sys::Msg,
        len: usize,
        more: bool,
    ) -> core::result::Result<usize, i32> {
        // SAFETY: self.0 is live; msg is the live msghdr of this sendmsg,
        // whose iterator the helper copies, truncates and advances.
        let n = to_result(unsafe {
            afx_tcp_send_msg_nb(self.0, msg.as_raw(), len, c_int::from(more))
        })?;
        leg_calls::count(&leg_calls::SENDS);
        Ok(n as usize)
    }

    /// Receives at most `len` bytes straight into the user buffers of the
    /// recvmsg being served (`msg` advances), without blocking: Ok(0) at
    /// EOF, Err(EAGAIN) when nothing, Err(EFAULT) with the data left queued.
    pub(crate) fn recv_to_user(
        &self,
        msg: &mut crate::sys::Msg,
        len: usize,
    ) -> core::result::Result<usize, i32> {
        // SAFETY: self.0 is live; msg is the live msghdr of this recvmsg,
        // whose iterator the helper copies, truncates and advances.
        let n = to_result(unsafe { afx_tcp_recv_msg(self.0, msg.as_raw(), len) })?;
        leg_calls::count(&leg_calls::RECVS);
        Ok(n as usize)
    }

    /// Whether a read would find something now (bytes, an error or EOF).
    pub(crate) fn readable(&self) -> bool {
        // SAFETY: self.0 is live; the helper reads its queue locklessly.
        unsafe { afx_tcp_readable(self.0) != 0 }
    }

    /// The leg's state for /proc/net/af_xen_tcp: bytes unacknowledged,
    /// wmem queued, sndbuf, SOCK_NOSPACE, writeable, bytes unread, owner
    /// flags (-1: none); lockless snapshots.
    pub(crate) fn info(&self) -> [i32; 7] {
        let mut out = [0 as c_int; 7];
        // SAFETY: self.0 is live; the helper writes exactly 7 ints.
        unsafe { afx_tcp_leg_info(self.0, out.as_mut_ptr()) };
        out
    }

    /// Whether a send would take bytes now (TCP's own EPOLLOUT).
    pub(crate) fn writable(&self) -> bool {
        // SAFETY: self.0 is live; the helper reads its send space locklessly.
        unsafe { afx_tcp_writable(self.0) != 0 }
    }

    /// The AF_XEN socket whose waiters this leg's callbacks wake from now
    /// on (None: nobody's), and what it does itself: `pulls`, its recvmsg
    /// reads this leg (its data then does not schedule the work item);
    /// `writes`, its writer flushes what is queued for this leg (a drain
    /// then does not schedule the work item either). The caller clears it
    /// before that socket can go (`carrier::disown`, under the switch
    /// locks that set it).
    pub(crate) fn set_owner(&self, owner: Option<&crate::sys::Sk>, pulls: bool, writes: bool) {
        let p = owner.map_or(core::ptr::null_mut(), |o| o.as_raw());
        let flags = c_int::from(pulls) | (c_int::from(writes) << 1);
        // SAFETY: self.0 is live; the owner is live now and is cleared here
        // (under sk_callback_lock, which the callbacks read it under)
        // before its socket is released.
        unsafe { afx_tcp_set_owner(self.0, p, flags) }
    }

    /// Sends all of `buf` (may block for room).
    #[cfg(afx_test_hooks)]
    pub(crate) fn send_all(&self, mut buf: &[u8]) -> core::result::Result<(), i32> {
        while !buf.is_empty() {
            // SAFETY: self.0 is live; buf is readable for buf.len() bytes.
            let n = to_result(unsafe { afx_tcp_send(self.0, buf.as_ptr().cast(), buf.len()) })?
                as usize;
            if n == 0 || n > buf.len() {
                return Err(crate::sys::errno::EPIPE);
            }
            buf = &buf[n..];
        }
        Ok(())
    }
}

/// Calls into the legs' TCP sockets that returned without error, for
/// /proc/net/af_xen_stats: each is a lock_sock/release_sock, and each
/// send or receive a clock read in TCP itself (tcp_write_xmit,
/// tcp_rcv_space_adjust), which a PV guest pays dearly under the lab's
/// emulation. Per 64 KiB against plain TCP's one send or recv per
/// application call, they say what the carrier adds on the leg.
pub(crate) mod leg_calls {
    use core::sync::atomic::{AtomicI64, Ordering};
    pub(crate) static SENDS: AtomicI64 = AtomicI64::new(0);
    pub(crate) static RECVS: AtomicI64 = AtomicI64::new(0);
    pub(crate) fn count(c: &AtomicI64) {
        c.fetch_add(1, Ordering::Relaxed);
    }
    pub(crate) fn get(c: &AtomicI64) -> i64 {
        c.load(Ordering::Relaxed)
    }
    /// "Not writeable" answers about a leg that had to arm its
    /// SOCK_NOSPACE (`afx_tcp_writable`): before that, sleeps no drain ended.
    pub(crate) fn nospace_armed() -> i64 {
        // SAFETY: reads an atomic counter.
        (unsafe { super::afx_tcp_nospace_armed() }) as i64
    }
}

impl Drop for TcpSock {
    fn drop(&mut self) {
        // SAFETY: self.0 is live and owned by us; not used after this.
        unsafe { afx_tcp_release(self.0) }
    }
}
