// SPDX-License-Identifier: MIT OR Apache-2.0
//! The C ABI that `c/btl_xensock.c` calls (declared in
//! `c/xensock_btl.h`). Every function takes the engine handle
//! `xsbtl_open` returned; none unwinds into C (a panic aborts, as the
//! crate is built with the default `panic = unwind` but every entry
//! catches it). Strings for C are NUL-terminated and cut to the buffer.

use std::ffi::{c_char, c_int, c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use parking_lot::ReentrantMutex;

use crate::card::Card;
use crate::engine::{Config, EndpointId, Engine, Events, Sent};
use crate::error::Error;
use crate::sys::Confined;

/// Sizes, from Open MPI's MCA parameters.
#[repr(C)]
pub struct XsbtlConfig {
    /// Largest fragment (`btl_xensock_max_send_size`).
    pub max_payload: usize,
    /// Receive ring per connection in bytes, 0 for the backend's default.
    pub recv_buffer: usize,
    /// Finalize waits this long for queued fragments, in milliseconds.
    pub linger_ms: u32,
    /// Nonzero: `FIONREAD` before each read on the kernel family.
    pub check_readable: c_int,
}

/// Open MPI's side of [`Events`].
#[repr(C)]
#[derive(Clone, Copy)]
pub struct XsbtlCallbacks {
    /// Passed back as the first argument of each callback.
    pub ctx: *mut c_void,
    /// A fragment arrived.
    pub deliver: extern "C" fn(*mut c_void, *mut c_void, u8, *const u8, usize),
    /// A send queued in place completed (1) or was dropped (0).
    pub completed: extern "C" fn(*mut c_void, *mut c_void, c_int),
    /// An endpoint failed.
    pub failed: extern "C" fn(*mut c_void, *mut c_void, *const c_char),
    /// A verbose line.
    pub note: extern "C" fn(*mut c_void, *const c_char),
    /// A rank with no endpoint connected: add it (1) or not (0).
    pub unknown_rank: extern "C" fn(*mut c_void, u64) -> c_int,
}

/// The handle C holds. Threads take turns on the engine (one reentrant
/// lock: a callback that calls back in stays on its thread).
pub struct XsbtlEngine {
    lock: ReentrantMutex<Confined<Engine>>,
    callbacks: XsbtlCallbacks,
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', " ")).unwrap_or_default()
}

impl Events for XsbtlCallbacks {
    fn deliver(&self, endpoint: usize, tag: u8, payload: &[u8]) {
        (self.deliver)(
            self.ctx,
            endpoint as *mut c_void,
            tag,
            payload.as_ptr(),
            payload.len(),
        )
    }
    fn completed(&self, send: usize, ok: bool) {
        (self.completed)(self.ctx, send as *mut c_void, c_int::from(ok))
    }
    fn failed(&self, endpoint: usize, why: &Error) {
        let s = c_string(&why.to_string());
        (self.failed)(self.ctx, endpoint as *mut c_void, s.as_ptr())
    }
    fn note(&self, what: &str) {
        let s = c_string(what);
        (self.note)(self.ctx, s.as_ptr())
    }
    fn unknown_rank(&self, name: u64) -> bool {
        (self.unknown_rank)(self.ctx, name) != 0
    }
}

/// Copies `text` into C's buffer, cut and NUL-terminated; returns the
/// full length.
fn put(text: &[u8], buf: *mut u8, len: usize, nul: bool) -> usize {
    if !buf.is_null() && len > 0 {
        let room = if nul { len - 1 } else { len };
        let n = text.len().min(room);
        // SAFETY: C passes a writable buffer of `len` bytes (or NULL,
        // checked above); n + 1 <= len when a NUL is added.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), buf, n);
            if nul {
                *buf.add(n) = 0;
            }
        }
    }
    text.len()
}

fn say(why: *mut c_char, len: usize, text: &str) {
    put(text.as_bytes(), why.cast(), len, true);
}

fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

/// Opens this rank's engine; NULL with the reason in `err` when xensock
/// cannot be used here.
///
/// # Safety
/// `cfg` and `cb` point to valid structures; `err` is NULL or writable
/// for `errlen` bytes.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_open(
    name: u64,
    cfg: *const XsbtlConfig,
    cb: *const XsbtlCallbacks,
    err: *mut c_char,
    errlen: usize,
) -> *mut XsbtlEngine {
    if cfg.is_null() || cb.is_null() {
        say(err, errlen, "xsbtl_open: NULL argument");
        return std::ptr::null_mut();
    }
    // SAFETY: both checked non-NULL; the caller passes valid structures.
    let (cfg, callbacks) = unsafe { (&*cfg, *cb) };
    let config = Config {
        max_payload: cfg.max_payload,
        recv_buffer: (cfg.recv_buffer > 0).then_some(cfg.recv_buffer),
        linger: Duration::from_millis(cfg.linger_ms.into()),
        check_readable: cfg.check_readable != 0,
    };
    guarded(std::ptr::null_mut(), || match Engine::open(name, config) {
        Ok(engine) => Box::into_raw(Box::new(XsbtlEngine {
            lock: ReentrantMutex::new(Confined(engine)),
            callbacks,
        })),
        Err(e) => {
            say(err, errlen, &e.to_string());
            std::ptr::null_mut()
        }
    })
}

/// This rank's modex card; returns its length (copies at most `len`).
///
/// # Safety
/// `e` came from `xsbtl_open`; `buf` is NULL or writable for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_card(e: *const XsbtlEngine, buf: *mut u8, len: usize) -> usize {
    // SAFETY: the caller passes the handle xsbtl_open returned.
    let Some(e) = (unsafe { e.as_ref() }) else {
        return 0;
    };
    let held = e.lock.lock();
    let engine = &held.0;
    put(&engine.card().encode(), buf, len, false)
}

/// One line saying where this rank listens and over what.
///
/// # Safety
/// As [`xsbtl_card`]; the line is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_describe(e: *const XsbtlEngine, buf: *mut c_char, len: usize) {
    // SAFETY: the caller passes the handle xsbtl_open returned.
    let Some(e) = (unsafe { e.as_ref() }) else {
        return;
    };
    let held = e.lock.lock();
    let engine = &held.0;
    let c = engine.card();
    let line = format!(
        "domain {} port {} uuid {} over {}",
        c.domid,
        c.port,
        c.uuid_or("unknown"),
        engine.backend()
    );
    say(buf, len, &line);
}

fn card_from(card: *const u8, len: usize) -> Result<Card, Error> {
    if card.is_null() {
        return Err(Error::Card("no card".into()));
    }
    // SAFETY: C passes the modex buffer of `len` bytes it received.
    let bytes: &[u8] = unsafe { std::slice::from_raw_parts(card, len) };
    Card::decode(bytes)
}

/// Adds the rank `name` that published `card` if this BTL should reach
/// it: returns 1 and its id in `id`, or 0 with the reason in `why`.
///
/// # Safety
/// `e` came from `xsbtl_open`; `card` holds `len` bytes; `id` is
/// writable; `why` is NULL or writable for `whylen` bytes.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_add(
    e: *const XsbtlEngine,
    name: u64,
    card: *const u8,
    len: usize,
    cookie: *mut c_void,
    id: *mut u32,
    why: *mut c_char,
    whylen: usize,
) -> c_int {
    // SAFETY: the caller passes the handle xsbtl_open returned.
    let Some(e) = (unsafe { e.as_ref() }) else {
        return 0;
    };
    let held = e.lock.lock();
    let engine = &held.0;
    if id.is_null() {
        say(why, whylen, "xsbtl_add: NULL id");
        return 0;
    }
    guarded(0, || {
        let card = match card_from(card, len) {
            Ok(c) => c,
            Err(err) => {
                say(why, whylen, &err.to_string());
                return 0;
            }
        };
        if let Err(reason) = engine.reachable(&card) {
            say(why, whylen, &reason);
            return 0;
        }
        let new = engine.add_endpoint(name, card, cookie as usize);
        // SAFETY: checked non-NULL above; C passes a writable u32.
        unsafe { *id = new };
        1
    })
}

/// Says goodbye to an endpoint's peer and forgets it.
///
/// # Safety
/// `e` came from `xsbtl_open`.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_remove(e: *const XsbtlEngine, id: u32) {
    // SAFETY: the caller passes the handle xsbtl_open returned.
    if let Some(e) = unsafe { e.as_ref() } {
        guarded((), || e.lock.lock().0.remove_endpoint(id, &e.callbacks));
    }
}

/// Sends one fragment of `iovcnt` pieces for `tag`. With a `cookie`, the
/// pieces may be kept until `completed(cookie)` (returns 0), else what
/// cannot leave now is copied; 1 when the caller's buffers are free, -1
/// with the reason in `why` on failure.
///
/// # Safety
/// `e` came from `xsbtl_open`; `iov` holds `iovcnt` valid iovecs; with a
/// non-NULL `cookie` their memory stays valid until `completed(cookie)`
/// when 0 is returned; `why` is NULL or writable for `whylen` bytes.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_send(
    e: *const XsbtlEngine,
    id: u32,
    tag: u8,
    iov: *const libc::iovec,
    iovcnt: c_int,
    cookie: *mut c_void,
    why: *mut c_char,
    whylen: usize,
) -> c_int {
    // SAFETY: the caller passes the handle xsbtl_open returned.
    let Some(e) = (unsafe { e.as_ref() }) else {
        return -1;
    };
    let held = e.lock.lock();
    let engine = &held.0;
    let n = usize::try_from(iovcnt).unwrap_or(0);
    if iov.is_null() && n > 0 {
        say(why, whylen, "xsbtl_send: NULL iov");
        return -1;
    }
    let mut parts: Vec<&[u8]> = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: iov holds iovcnt entries (caller's contract).
        let v = unsafe { &*iov.add(i) };
        if v.iov_len > 0 {
            // SAFETY: each iovec describes readable memory of iov_len bytes.
            parts.push(unsafe { std::slice::from_raw_parts(v.iov_base.cast::<u8>(), v.iov_len) });
        }
    }
    guarded(-1, || {
        let r = if cookie.is_null() {
            engine
                .send_copy(id as EndpointId, tag, &parts)
                .map(|()| Sent::Done)
        } else {
            // SAFETY: the caller keeps the iovecs' memory until
            // completed(cookie) when this returns Queued (contract above).
            unsafe { engine.send_in_place(id as EndpointId, tag, &parts, cookie as usize) }
        };
        match r {
            Ok(Sent::Done) => 1,
            Ok(Sent::Queued) => 0,
            Err(err) => {
                say(why, whylen, &err.to_string());
                -1
            }
        }
    })
}

/// Moves bytes; returns the fragments and completions handled.
///
/// # Safety
/// `e` came from `xsbtl_open`.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_progress(e: *const XsbtlEngine) -> c_int {
    // SAFETY: the caller passes the handle xsbtl_open returned.
    let Some(e) = (unsafe { e.as_ref() }) else {
        return 0;
    };
    guarded(0, || {
        // Another thread progressing the engine is doing this one's work.
        let Some(held) = e.lock.try_lock() else {
            return 0;
        };
        c_int::try_from(held.0.progress(&e.callbacks)).unwrap_or(c_int::MAX)
    })
}

/// Says goodbye to every peer and frees the engine.
///
/// # Safety
/// `e` came from `xsbtl_open` and is not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn xsbtl_close(e: *mut XsbtlEngine) {
    if e.is_null() {
        return;
    }
    // SAFETY: e came from Box::into_raw in xsbtl_open and is given up here.
    let e = unsafe { Box::from_raw(e) };
    guarded((), || e.lock.lock().0.close(&e.callbacks));
}
