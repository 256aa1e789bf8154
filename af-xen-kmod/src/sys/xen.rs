// SPDX-License-Identifier: GPL-2.0
//! Inter-domain plumbing through the C glue (`af_xen_xen.c`): the work
//! items, event channels, grants and mappings (of one page and of many),
//! XenStore.

use super::*;

extern "C" {
    fn afx_schedule();
    fn afx_cancel_work();
    fn afx_evtchn_alloc_unbound(remote: c_uint, port: *mut c_uint) -> c_int;
    fn afx_evtchn_bind_interdomain(remote: c_uint, rport: c_uint, lport: *mut c_uint) -> c_int;
    fn afx_evtchn_close(port: c_uint);
    fn afx_bind_irq(
        port: c_uint,
        handler: unsafe extern "C" fn(c_int, *mut c_void) -> bindings::irqreturn_t,
        cookie: *const c_void,
    ) -> c_int;
    fn afx_unbind_irq(irq: c_int, cookie: *const c_void);
    fn afx_notify(port: c_uint);
    fn afx_grant_page(domid: c_uint, gref: *mut c_uint) -> *mut c_void;
    fn afx_end_grant(gref: c_uint, p: *mut c_void);
    fn afx_grants_pending() -> c_long;
    fn afx_grants_pended() -> c_long;
    fn afx_map_failures() -> c_long;
    fn afx_msleep(ms: c_uint);
    fn afx_pending_kick();
    fn afx_pending_exit();
    fn afx_map_page(domid: c_uint, gref: c_uint, cookie: *mut *mut c_void) -> *mut c_void;
    fn afx_unmap_page(cookie: *mut c_void);
    fn afx_xs_advertise(dir: *const u8, gref: c_uint, port: c_uint, state: c_int) -> c_int;
    fn afx_xs_write_state(dir: *const u8, state: c_int) -> c_int;
    fn afx_xs_retract(dir: *const u8);
    fn afx_xs_read_uint(dir: *const u8, node: *const u8, out: *mut c_uint) -> c_int;
    fn afx_xs_dir_ids(dir: *const u8, out: *mut c_uint, max: c_int) -> c_int;
    fn afx_watch_add(path: *const u8) -> *mut c_void;
    fn afx_watch_del(w: *mut c_void);
    fn afx_take_xs_dirty() -> c_int;
}

/// Whether a watch fired since the last call (XenStore must be re-read).
pub(crate) fn take_xs_dirty() -> bool {
    // SAFETY: atomic exchange on a static.
    unsafe { afx_take_xs_dirty() != 0 }
}

/// Queues the module's work item (control frames, link states, wakeups).
pub(crate) fn schedule_work() {
    // SAFETY: the work item is static in the glue.
    unsafe { afx_schedule() }
}

/// Waits for a running work item and cancels a queued one (module exit).
pub(crate) fn cancel_work() {
    // SAFETY: may sleep; called from module exit (process context).
    unsafe { afx_cancel_work() }
}

extern "C" {
    fn afx_schedule_reap(ms: c_uint);
    fn afx_cancel_reap();
}

/// Runs `link::reap` in `ms` milliseconds, or earlier if it is queued for
/// an earlier time already (it re-arms itself for the rest).
pub(crate) fn schedule_reap(ms: u32) {
    // SAFETY: schedules a static delayed work item.
    unsafe { afx_schedule_reap(ms) }
}

/// Waits for a running reap and cancels a queued one (module exit).
pub(crate) fn cancel_reap() {
    // SAFETY: may sleep; called from module exit (process context).
    unsafe { afx_cancel_reap() }
}

/// What an event channel's interrupt calls (hard irq context): it must
/// not sleep.
pub(crate) trait IrqTarget: Send + Sync {
    fn irq(&self);
}

/// An event channel port of ours bound to an irq whose handler calls its
/// target's [`IrqTarget::irq`]. Dropping it unbinds the irq and closes the
/// port.
pub(crate) struct Evtchn<T: IrqTarget> {
    pub(crate) port: u32,
    irq: c_int,
    /// the handler's argument: kept alive while the irq is bound
    target: Arc<T>,
}

/// The irq handler of every `Evtchn<T>` (hard irq context).
unsafe extern "C" fn irq_handler<T: IrqTarget>(
    _irq: c_int,
    cookie: *mut c_void,
) -> bindings::irqreturn_t {
    // SAFETY: the cookie of `Evtchn::<T>::bind`: a `T` kept alive by the
    // Evtchn until afx_unbind_irq has waited for running handlers.
    let target = unsafe { &*(cookie as *const T) };
    target.irq();
    bindings::irqreturn_IRQ_HANDLED
}

impl<T: IrqTarget> Evtchn<T> {
    fn bind(port: c_uint, target: &Arc<T>) -> Result<Evtchn<T>> {
        let cookie = &**target as *const T as *const c_void;
        // SAFETY: `port` is a port of ours, not bound to an irq yet; the
        // handler matches the cookie's type, and the cookie stays valid
        // until afx_unbind_irq (Evtchn keeps the Arc).
        let irq = unsafe { afx_bind_irq(port, irq_handler::<T>, cookie) };
        if irq < 0 {
            // SAFETY: our port, unused.
            unsafe { afx_evtchn_close(port) };
            return Err(Error::from_errno(irq));
        }
        counters::add(&counters::EVTCHNS, 1);
        Ok(Evtchn {
            port,
            irq,
            target: target.clone(),
        })
    }
    /// A fresh unbound port that `remote` may bind.
    pub(crate) fn alloc_unbound(remote: u32, target: &Arc<T>) -> Result<Evtchn<T>> {
        let mut port: c_uint = 0;
        // SAFETY: plain hypercall with an out parameter.
        let r = unsafe { afx_evtchn_alloc_unbound(remote, &mut port) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Self::bind(port, target)
    }
    /// Binds `remote`'s port `rport` (from XenStore: any value is checked by Xen).
    pub(crate) fn bind_interdomain(remote: u32, rport: u32, target: &Arc<T>) -> Result<Evtchn<T>> {
        let mut port: c_uint = 0;
        // SAFETY: plain hypercall with an out parameter.
        let r = unsafe { afx_evtchn_bind_interdomain(remote, rport, &mut port) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Self::bind(port, target)
    }
    pub(crate) fn notify(&self) {
        notify_port(self.port)
    }
}

/// Grant entries ended while the peer still mapped them, kept (with their
/// pages) until it unmaps: how many now, and how many ever.
pub(crate) fn grants_pending() -> i64 {
    // SAFETY: reads an atomic of the glue.
    unsafe { afx_grants_pending() as i64 }
}
pub(crate) fn grants_pended() -> i64 {
    // SAFETY: reads an atomic of the glue.
    unsafe { afx_grants_pended() as i64 }
}
/// Maps of a peer's grant that Xen refused, ever (af_xen_xen.c).
pub(crate) fn map_failures() -> i64 {
    // SAFETY: reads an atomic counter.
    unsafe { afx_map_failures() as i64 }
}

/// Sleeps `ms` milliseconds (process context, no lock held).
pub(crate) fn sleep_ms(ms: u32) {
    // SAFETY: msleep may sleep; callers hold no spinlock.
    unsafe { afx_msleep(ms) }
}

/// The peer is done with a connection, or gone: try the pending grants now.
pub(crate) fn pending_grants_kick() {
    // SAFETY: queues the glue's work item (any context).
    unsafe { afx_pending_kick() }
}

/// Module exit, after every socket and link: what a peer still maps goes to
/// Linux's deferred list.
pub(crate) fn pending_grants_exit() {
    // SAFETY: called once, from module exit, after every grant of ours ended.
    unsafe { afx_pending_exit() }
}

/// Kicks the other end of one of our ports (a closed port only fails the hypercall).
pub(crate) fn notify_port(port: u32) {
    // SAFETY: EVTCHNOP_send on a port number; Xen checks it.
    unsafe { afx_notify(port) }
}

impl<T: IrqTarget> Drop for Evtchn<T> {
    fn drop(&mut self) {
        let cookie = &*self.target as *const T as *const c_void;
        // SAFETY: irq bound in bind() with this cookie; frees it (waits for
        // a running handler) and closes the port.
        unsafe { afx_unbind_irq(self.irq, cookie) };
        counters::add(&counters::EVTCHNS, -1);
    }
}

/// A zeroed page of ours granted read-write to one domain. Dropping it ends
/// the grant and frees the page (kept pending by the glue while the peer
/// still maps it).
pub(crate) struct Grant {
    base: core::ptr::NonNull<u8>,
    pub(crate) gref: u32,
}

// SAFETY: kernel page, accessed only through proto's RawRing.
unsafe impl Send for Grant {}
// SAFETY: see above.
unsafe impl Sync for Grant {}

impl Grant {
    pub(crate) fn new(domid: u32) -> Result<Grant> {
        let mut gref: c_uint = 0;
        // SAFETY: allocates and grants a page; out parameter.
        let p = unsafe { afx_grant_page(domid, &mut gref) } as *mut u8;
        let base = core::ptr::NonNull::new(p).ok_or(ENOMEM)?;
        counters::add(&counters::GRANTS, 1);
        Ok(Grant { base, gref })
    }
    pub(crate) fn ring(
        &self,
        geometry: crate::proto::layout::RingGeometry,
    ) -> Option<crate::proto::mem::RawRing> {
        // SAFETY: a page-aligned page, alive while self lives (the caller
        // keeps it next to the ring), shared with the peer only through RawRing.
        unsafe { crate::proto::mem::RawRing::from_region(self.base, 4096, geometry) }.ok()
    }
}

impl Drop for Grant {
    fn drop(&mut self) {
        // SAFETY: page and ref from afx_grant_page; no ring over it is used any more.
        unsafe { afx_end_grant(self.gref, self.base.as_ptr().cast()) };
        counters::add(&counters::GRANTS, -1);
    }
}

/// A peer's granted page mapped into our address space, unmapped on drop.
pub(crate) struct Mapping {
    base: core::ptr::NonNull<u8>,
    cookie: *mut c_void,
}

// SAFETY: a mapping of a foreign page, accessed only through RawRing.
unsafe impl Send for Mapping {}
// SAFETY: see above.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `domid`'s grant `gref` (values from the peer: Xen validates them).
    pub(crate) fn map(domid: u32, gref: u32) -> Result<Mapping> {
        let mut cookie: *mut c_void = core::ptr::null_mut();
        // SAFETY: out parameter; the glue checks the map status.
        let p = unsafe { afx_map_page(domid, gref, &mut cookie) } as *mut u8;
        let base = core::ptr::NonNull::new(p).ok_or(ENXIO)?;
        counters::add(&counters::MAPS, 1);
        Ok(Mapping { base, cookie })
    }
    pub(crate) fn ring(
        &self,
        geometry: crate::proto::layout::RingGeometry,
    ) -> Option<crate::proto::mem::RawRing> {
        // SAFETY: a page-aligned mapping of one page, alive while self
        // lives; the peer may write it at any time, which RawRing tolerates.
        unsafe { crate::proto::mem::RawRing::from_region(self.base, 4096, geometry) }.ok()
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: cookie from afx_map_page; no ring over it is used any more.
        unsafe { afx_unmap_page(self.cookie) };
        counters::add(&counters::MAPS, -1);
    }
}

/// XenStore helpers; paths are NUL-terminated CStrings.
pub(crate) mod xs {
    use super::*;
    use kernel::str::CString;

    pub(crate) fn advertise(dir: &CString, gref: u32, port: u32, state: i32) -> Result {
        // SAFETY: NUL-terminated path.
        let r = unsafe { afx_xs_advertise(dir.as_bytes_with_nul().as_ptr(), gref, port, state) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Ok(())
    }
    pub(crate) fn write_state(dir: &CString, state: i32) -> Result {
        // SAFETY: NUL-terminated path.
        let r = unsafe { afx_xs_write_state(dir.as_bytes_with_nul().as_ptr(), state) };
        if r != 0 {
            return Err(Error::from_errno(r));
        }
        Ok(())
    }
    pub(crate) fn retract(dir: &CString) {
        // SAFETY: NUL-terminated path.
        unsafe { afx_xs_retract(dir.as_bytes_with_nul().as_ptr()) }
    }
    /// `dir/node` as a number; None if it is missing or not one.
    pub(crate) fn read_u32(dir: &CString, node: &str) -> Option<u32> {
        let node = CString::try_from_fmt(kernel::fmt!("{}", node)).ok()?;
        let mut v: c_uint = 0;
        // SAFETY: NUL-terminated strings, out parameter.
        let r = unsafe {
            afx_xs_read_uint(
                dir.as_bytes_with_nul().as_ptr(),
                node.as_ptr().cast(),
                &mut v,
            )
        };
        if r == 0 {
            Some(v)
        } else {
            None
        }
    }
    /// A domain's UUID as XenStore spells it (`xensock/peers/<domid>/uuid`
    /// in the agent's table): 36 characters, hex digits and dashes.
    #[derive(Clone, Copy, PartialEq, Eq)]
    pub(crate) struct Uuid(pub(crate) [u8; 36]);

    impl Uuid {
        pub(crate) fn as_str(&self) -> &str {
            // ASCII, checked by read_uuid
            core::str::from_utf8(&self.0).unwrap_or("?")
        }
    }

    /// `dir/node`'s value, handed to `f`; None if it is missing.
    pub(crate) fn read_value<R>(
        dir: &CString,
        node: &core::ffi::CStr,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Option<R> {
        let dir = core::ffi::CStr::from_bytes_with_nul(dir.as_bytes_with_nul()).ok()?;
        super::with_xenstore_value(dir, node, f)
    }

    /// `dir/node` if it holds a UUID; None if it is missing or not one.
    pub(crate) fn read_uuid(dir: &CString, node: &core::ffi::CStr) -> Option<Uuid> {
        let dashes = [8, 13, 18, 23];
        let dir = core::ffi::CStr::from_bytes_with_nul(dir.as_bytes_with_nul()).ok()?;
        let s = super::with_xenstore_value(dir, node, |s| {
            let valid = s.len() == 36
                && s.iter().enumerate().all(|(k, b)| {
                    if dashes.contains(&k) {
                        *b == b'-'
                    } else {
                        b.is_ascii_hexdigit()
                    }
                });
            valid.then(|| {
                let mut u = [0u8; 36];
                u.copy_from_slice(s);
                Uuid(u)
            })
        });
        s.flatten()
    }

    /// Numeric entries of a directory (at most 64).
    pub(crate) fn dir_ids(dir: &CString, out: &mut [u32; 64]) -> usize {
        // SAFETY: NUL-terminated path; out has room for 64 entries.
        let n = unsafe { afx_xs_dir_ids(dir.as_bytes_with_nul().as_ptr(), out.as_mut_ptr(), 64) };
        if n < 0 {
            0
        } else {
            n as usize
        }
    }

    /// A XenStore watch whose callback schedules the work item.
    pub(crate) struct Watch(*mut c_void);
    // SAFETY: an opaque handle, only passed back to the glue.
    unsafe impl Send for Watch {}
    // SAFETY: see above.
    unsafe impl Sync for Watch {}

    impl Watch {
        pub(crate) fn add(path: &CString) -> Result<Watch> {
            // SAFETY: NUL-terminated path (the glue copies it).
            let p = unsafe { afx_watch_add(path.as_bytes_with_nul().as_ptr()) };
            if p.is_null() {
                return Err(ENOMEM);
            }
            Ok(Watch(p))
        }
    }
    impl Drop for Watch {
        fn drop(&mut self) {
            // SAFETY: from afx_watch_add; unregisters (waits for callbacks) and frees.
            unsafe { afx_watch_del(self.0) }
        }
    }
}

// ---- rings larger than one page ------------------------------------------------

extern "C" {
    fn afx_grant_pages(
        domid: c_uint,
        n: c_uint,
        refs: *mut c_uint,
        cookie: *mut *mut c_void,
    ) -> *mut c_void;
    fn afx_end_grants(refs: *const c_uint, cookie: *mut c_void);
    fn afx_max_map_pages() -> c_uint;
    fn afx_map_pages(
        domid: c_uint,
        n: c_uint,
        refs: *const c_uint,
        cookie: *mut *mut c_void,
    ) -> *mut c_void;
    fn afx_unmap_pages(cookie: *mut c_void);
}

/// Most data pages a ring may have (4 MiB: proto's largest ring).
pub(crate) fn max_map_pages() -> usize {
    // SAFETY: returns a constant.
    unsafe { afx_max_map_pages() as usize }
}

impl Grant {
    /// This page as a grant directory (a page of atomics).
    pub(crate) fn directory(&self) -> &crate::proto::layout::GrantDirectory {
        // SAFETY: page aligned, 4096 bytes, alive while self is borrowed;
        // GrantDirectory is atomics only, so a shared view is sound.
        unsafe { &*(self.base.as_ptr() as *const crate::proto::layout::GrantDirectory) }
    }
    /// A large ring: this page is its header, `data` its data pages.
    pub(crate) fn large_ring(
        &self,
        data: &GrantedPages,
        g: crate::proto::layout::RingGeometry,
    ) -> Option<crate::proto::mem::RawRing> {
        if data.n * 4096 != g.data_size() {
            return None;
        }
        // SAFETY: header page and data pages alive as long as the caller
        // keeps both next to the ring; only accessed through RawRing.
        Some(unsafe { crate::proto::mem::RawRing::from_parts(self.base, data.base, g) })
    }
}

impl Mapping {
    /// This mapped page as a grant directory.
    pub(crate) fn directory(&self) -> &crate::proto::layout::GrantDirectory {
        // SAFETY: page-aligned mapping of one page, alive while self is
        // borrowed; atomics only (the peer may change it: read_refs reads
        // each slot once and Xen validates the refs).
        unsafe { &*(self.base.as_ptr() as *const crate::proto::layout::GrantDirectory) }
    }
    pub(crate) fn large_ring(
        &self,
        data: &MappedPages,
        g: crate::proto::layout::RingGeometry,
    ) -> Option<crate::proto::mem::RawRing> {
        if data.n * 4096 != g.data_size() {
            return None;
        }
        // SAFETY: as for Grant::large_ring; the peer may write the pages at
        // any time, which RawRing tolerates.
        Some(unsafe { crate::proto::mem::RawRing::from_parts(self.base, data.base, g) })
    }
}

/// Zeroed pages of ours, each granted to one domain, seen contiguously
/// through a vmap; grants end (and pages are freed, deferred while mapped)
/// on drop.
pub(crate) struct GrantedPages {
    base: core::ptr::NonNull<u8>,
    n: usize,
    cookie: *mut c_void,
    pub(crate) refs: KVec<u32>,
}

// SAFETY: kernel pages, accessed only through RawRing.
unsafe impl Send for GrantedPages {}
// SAFETY: see above.
unsafe impl Sync for GrantedPages {}

impl GrantedPages {
    pub(crate) fn new(domid: u32, n: usize) -> Result<GrantedPages> {
        if n == 0 || n > max_map_pages() {
            return Err(EINVAL);
        }
        let mut refs = KVec::with_capacity(n, GFP_KERNEL)?;
        for _ in 0..n {
            refs.push(0u32, GFP_KERNEL)?;
        }
        let mut cookie: *mut c_void = core::ptr::null_mut();
        // SAFETY: refs has room for n entries; cookie is an out parameter.
        let p = unsafe { afx_grant_pages(domid, n as c_uint, refs.as_mut_ptr(), &mut cookie) }
            as *mut u8;
        let base = core::ptr::NonNull::new(p).ok_or(ENOMEM)?;
        counters::add(&counters::GRANTS, n as i64);
        Ok(GrantedPages {
            base,
            n,
            cookie,
            refs,
        })
    }
}

impl Drop for GrantedPages {
    fn drop(&mut self) {
        // SAFETY: refs and cookie from afx_grant_pages (refs unchanged since);
        // no ring uses the pages any more.
        unsafe { afx_end_grants(self.refs.as_ptr(), self.cookie) };
        counters::add(&counters::GRANTS, -(self.n as i64));
    }
}

/// A peer's data pages mapped contiguously (grant mappings written into a
/// reserved vmap range: see the glue); unmapped on drop.
pub(crate) struct MappedPages {
    base: core::ptr::NonNull<u8>,
    n: usize,
    cookie: *mut c_void,
}

// SAFETY: a mapping of foreign pages, accessed only through RawRing.
unsafe impl Send for MappedPages {}
// SAFETY: see above.
unsafe impl Sync for MappedPages {}

impl MappedPages {
    pub(crate) fn map(domid: u32, refs: &[u32]) -> Result<MappedPages> {
        if refs.is_empty() || refs.len() > max_map_pages() {
            return Err(EINVAL);
        }
        let mut cookie: *mut c_void = core::ptr::null_mut();
        // SAFETY: refs valid for its length; out parameter.
        let p = unsafe { afx_map_pages(domid, refs.len() as c_uint, refs.as_ptr(), &mut cookie) }
            as *mut u8;
        let base = core::ptr::NonNull::new(p).ok_or(ENXIO)?;
        counters::add(&counters::MAPS, refs.len() as i64);
        Ok(MappedPages {
            base,
            n: refs.len(),
            cookie,
        })
    }
}

impl Drop for MappedPages {
    fn drop(&mut self) {
        // SAFETY: cookie from afx_map_pages; no ring uses the pages any more.
        unsafe { afx_unmap_pages(self.cookie) };
        counters::add(&counters::MAPS, -(self.n as i64));
    }
}
