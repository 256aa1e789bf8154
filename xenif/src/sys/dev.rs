// SPDX-License-Identifier: MIT OR Apache-2.0
//! The real-Xen backend: grants through `/dev/xen/gntalloc`, mappings
//! through `/dev/xen/gntdev`, event channels through `/dev/xen/evtchn`
//! (Linux's `xen-gntalloc`, `xen-gntdev` and `xen-evtchn` drivers).
//!
//! The ioctl numbers and argument layouts follow Linux's public
//! `include/uapi/xen/{gntalloc,gntdev,evtchn}.h`. Exercised on real Xen by
//! the lab; on other machines [`DevXen::open`] fails with
//! [`XenError::Unavailable`].

use std::ffi::CStr;
use std::mem::size_of;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use crate::backend::{
    Access, DomId, EventChannel, GrantRef, GrantedRegion, MappedRegion, PeerState, Port,
    SharedRegion, UnmapNotify, XenBackend, XenError, PAGE_SIZE,
};

/// Path of the grant-allocation device.
pub const GNTALLOC_PATH: &CStr = c"/dev/xen/gntalloc";
/// Path of the grant-mapping device.
pub const GNTDEV_PATH: &CStr = c"/dev/xen/gntdev";
/// Path of the event-channel device.
pub const EVTCHN_PATH: &CStr = c"/dev/xen/evtchn";

/// `_IOC(_IOC_NONE, ty, nr, size)` for the architectures where `_IOC_NONE`
/// is 0 and the size field is 14 bits at bit 16 (x86, arm, riscv...).
const fn ioc_none(ty: u8, nr: u8, size: usize) -> libc::c_ulong {
    ((size as libc::c_ulong) << 16) | ((ty as libc::c_ulong) << 8) | nr as libc::c_ulong
}

#[repr(C)]
struct GntallocAllocGref {
    domid: u16,
    flags: u16,
    count: u32,
    index: u64,
    gref_ids: [u32; 1],
}

#[repr(C)]
struct GntallocDeallocGref {
    index: u64,
    count: u32,
}

#[repr(C)]
struct UnmapNotifyArg {
    index: u64,
    action: u32,
    event_channel_port: u32,
}

#[repr(C)]
struct GntdevGrantRef {
    domid: u32,
    gref: u32,
}

#[repr(C)]
struct GntdevMapGrantRef {
    count: u32,
    pad: u32,
    index: u64,
    refs: [GntdevGrantRef; 1],
}

#[repr(C)]
struct GntdevUnmapGrantRef {
    index: u64,
    count: u32,
    pad: u32,
}

#[repr(C)]
struct EvtchnBindInterdomain {
    remote_domain: u32,
    remote_port: u32,
}

#[repr(C)]
struct EvtchnPort {
    port: u32,
}

const GNTALLOC_FLAG_WRITABLE: u16 = 1;
const UNMAP_NOTIFY_CLEAR_BYTE: u32 = 0x1;
const UNMAP_NOTIFY_SEND_EVENT: u32 = 0x2;

const IOCTL_GNTALLOC_ALLOC_GREF: libc::c_ulong = ioc_none(b'G', 5, size_of::<GntallocAllocGref>());
const IOCTL_GNTALLOC_DEALLOC_GREF: libc::c_ulong =
    ioc_none(b'G', 6, size_of::<GntallocDeallocGref>());
const IOCTL_GNTALLOC_SET_UNMAP_NOTIFY: libc::c_ulong =
    ioc_none(b'G', 7, size_of::<UnmapNotifyArg>());
const IOCTL_GNTDEV_MAP_GRANT_REF: libc::c_ulong = ioc_none(b'G', 0, size_of::<GntdevMapGrantRef>());
const IOCTL_GNTDEV_UNMAP_GRANT_REF: libc::c_ulong =
    ioc_none(b'G', 1, size_of::<GntdevUnmapGrantRef>());
const IOCTL_GNTDEV_SET_UNMAP_NOTIFY: libc::c_ulong = ioc_none(b'G', 7, size_of::<UnmapNotifyArg>());
const IOCTL_EVTCHN_BIND_INTERDOMAIN: libc::c_ulong =
    ioc_none(b'E', 1, size_of::<EvtchnBindInterdomain>());
const IOCTL_EVTCHN_BIND_UNBOUND_PORT: libc::c_ulong = ioc_none(b'E', 2, size_of::<EvtchnPort>());
const IOCTL_EVTCHN_UNBIND: libc::c_ulong = ioc_none(b'E', 3, size_of::<EvtchnPort>());
const IOCTL_EVTCHN_NOTIFY: libc::c_ulong = ioc_none(b'E', 4, size_of::<EvtchnPort>());

/// Largest number of pages mapped or granted in one call (the drivers'
/// default per-file limits are of this order; bigger rings use a directory).
pub const MAX_PAGES_PER_CALL: usize = 1024;

fn open_dev(path: &CStr, extra_flags: libc::c_int) -> Result<OwnedFd, XenError> {
    // SAFETY: `path` is a valid NUL-terminated string; open has no other
    // memory-safety preconditions.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC | extra_flags) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENODEV) | Some(libc::ENXIO) => XenError::Unavailable(
                format!("{}: {e} (not running on Xen?)", path.to_string_lossy()),
            ),
            _ => XenError::Os {
                op: "open Xen device",
                source: e,
            },
        });
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Runs an ioctl whose argument is `arg`, mapping failure to `XenError`.
///
/// # Safety
/// `arg` must point to memory laid out as the ioctl `req` expects, valid
/// for reads and writes of the size the driver accesses.
unsafe fn ioctl_ptr<T>(
    fd: RawFd,
    req: libc::c_ulong,
    arg: *mut T,
    op: &'static str,
) -> Result<libc::c_int, XenError> {
    // SAFETY: forwarded from the caller's contract.
    let rc = unsafe { libc::ioctl(fd, req as _, arg) };
    if rc < 0 {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) => {
                XenError::PermissionDenied(format!("{op}: {e}"))
            }
            Some(libc::EINVAL) => XenError::Invalid(format!("{op}: {e}")),
            Some(libc::ENOSPC) | Some(libc::ENOMEM) => XenError::Exhausted(format!("{op}: {e}")),
            _ => XenError::Os { op, source: e },
        });
    }
    Ok(rc)
}

fn check_pages(pages: usize) -> Result<usize, XenError> {
    if pages == 0 || pages > MAX_PAGES_PER_CALL {
        return Err(XenError::Invalid(format!(
            "page count {pages} not in 1..={MAX_PAGES_PER_CALL}"
        )));
    }
    Ok(pages * PAGE_SIZE)
}

fn notify_arg(index: u64, len: usize, n: UnmapNotify) -> Result<UnmapNotifyArg, XenError> {
    let mut action = 0;
    let mut offset = 0;
    if let Some(off) = n.clear_byte {
        if off >= len {
            return Err(XenError::Invalid(format!(
                "clear_byte offset {off} outside region of {len} bytes"
            )));
        }
        action |= UNMAP_NOTIFY_CLEAR_BYTE;
        offset = off as u64;
    }
    if n.send_event.is_some() {
        action |= UNMAP_NOTIFY_SEND_EVENT;
    }
    Ok(UnmapNotifyArg {
        index: index + offset,
        action,
        event_channel_port: n.send_event.unwrap_or(0),
    })
}

/// A zeroed, 8-byte aligned buffer of at least `bytes` bytes for the
/// variable-length ioctl arguments.
fn ioctl_buffer(bytes: usize) -> Vec<u64> {
    vec![0u64; bytes.div_ceil(8)]
}

/// The real `/dev/xen` backend.
///
/// ```no_run
/// use xensock_xenif::{dev::DevXen, Access, XenBackend};
/// let xen = DevXen::open()?;
/// let ring = xen.grant(3, 1, Access::ReadWrite)?;
/// # Ok::<(), xensock_xenif::XenError>(())
/// ```
#[derive(Debug, Clone)]
pub struct DevXen {
    gntalloc: Arc<OwnedFd>,
    gntdev: Arc<OwnedFd>,
}

impl DevXen {
    /// Opens `/dev/xen/gntalloc` and `/dev/xen/gntdev`.
    pub fn open() -> Result<DevXen, XenError> {
        Ok(DevXen {
            gntalloc: Arc::new(open_dev(GNTALLOC_PATH, 0)?),
            gntdev: Arc::new(open_dev(GNTDEV_PATH, 0)?),
        })
    }
}

/// Maps `len` bytes of `fd` at `offset`, shared.
fn mmap_shared(fd: RawFd, len: usize, offset: u64, writable: bool) -> Result<*mut u8, XenError> {
    let prot = if writable {
        libc::PROT_READ | libc::PROT_WRITE
    } else {
        libc::PROT_READ
    };
    let off = libc::off_t::try_from(offset)
        .map_err(|_| XenError::Invalid(format!("mmap offset {offset} too large")))?;
    // SAFETY: a fresh shared mapping chosen by the kernel (addr NULL); it
    // aliases no Rust object.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, off) };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        return Err(match e.raw_os_error() {
            Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EFAULT) => {
                XenError::PermissionDenied(format!("mapping grants: {e}"))
            }
            _ => XenError::Os {
                op: "mmap grants",
                source: e,
            },
        });
    }
    Ok(p.cast())
}

/// Pages allocated with `/dev/xen/gntalloc`.
#[derive(Debug)]
pub struct DevGrant {
    dev: Arc<OwnedFd>,
    index: u64,
    ptr: *mut u8,
    len: usize,
    refs: Vec<GrantRef>,
    peer: DomId,
    peer_access: Access,
}

// SAFETY: the region is plain shared memory owned by this value; the raw
// pointer is only an address, and concurrent access discipline is the
// caller's (documented on SharedRegion).
unsafe impl Send for DevGrant {}

impl SharedRegion for DevGrant {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn writable(&self) -> bool {
        true
    }
    fn peer(&self) -> DomId {
        self.peer
    }
}

impl GrantedRegion for DevGrant {
    fn refs(&self) -> &[GrantRef] {
        &self.refs
    }
    fn peer_access(&self) -> Access {
        self.peer_access
    }
    fn set_unmap_notify(&mut self, notify: UnmapNotify) -> Result<(), XenError> {
        let mut arg = notify_arg(self.index, self.len, notify)?;
        // SAFETY: `arg` is a live, correctly laid out ioctl_gntalloc_unmap_notify.
        unsafe {
            ioctl_ptr(
                self.dev.as_raw_fd(),
                IOCTL_GNTALLOC_SET_UNMAP_NOTIFY,
                &mut arg,
                "IOCTL_GNTALLOC_SET_UNMAP_NOTIFY",
            )
        }?;
        Ok(())
    }
}

impl Drop for DevGrant {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe the mapping created in `grant`, which no
        // one else unmaps.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        let mut arg = GntallocDeallocGref {
            index: self.index,
            count: self.refs.len() as u32,
        };
        // SAFETY: `arg` is a live ioctl_gntalloc_dealloc_gref. The driver
        // defers freeing pages the peer still maps, as Xen requires.
        let _ = unsafe {
            ioctl_ptr(
                self.dev.as_raw_fd(),
                IOCTL_GNTALLOC_DEALLOC_GREF,
                &mut arg,
                "IOCTL_GNTALLOC_DEALLOC_GREF",
            )
        };
    }
}

/// A peer's grants mapped with `/dev/xen/gntdev`.
#[derive(Debug)]
pub struct DevMapping {
    dev: Arc<OwnedFd>,
    index: u64,
    ptr: *mut u8,
    len: usize,
    pages: u32,
    writable: bool,
    peer: DomId,
}

// SAFETY: as for DevGrant: an owned shared mapping addressed by a raw pointer.
unsafe impl Send for DevMapping {}

impl SharedRegion for DevMapping {
    fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn writable(&self) -> bool {
        self.writable
    }
    fn peer(&self) -> DomId {
        self.peer
    }
}

impl MappedRegion for DevMapping {
    fn set_unmap_notify(&mut self, notify: UnmapNotify) -> Result<(), XenError> {
        if notify.clear_byte.is_some() && !self.writable {
            return Err(XenError::Invalid(
                "clear_byte needs a writable mapping".into(),
            ));
        }
        let mut arg = notify_arg(self.index, self.len, notify)?;
        // SAFETY: `arg` is a live, correctly laid out ioctl_gntdev_unmap_notify.
        unsafe {
            ioctl_ptr(
                self.dev.as_raw_fd(),
                IOCTL_GNTDEV_SET_UNMAP_NOTIFY,
                &mut arg,
                "IOCTL_GNTDEV_SET_UNMAP_NOTIFY",
            )
        }?;
        Ok(())
    }
}

fn gntdev_unmap(dev: RawFd, index: u64, pages: u32) {
    let mut arg = GntdevUnmapGrantRef {
        index,
        count: pages,
        pad: 0,
    };
    // SAFETY: `arg` is a live ioctl_gntdev_unmap_grant_ref.
    let _ = unsafe {
        ioctl_ptr(
            dev,
            IOCTL_GNTDEV_UNMAP_GRANT_REF,
            &mut arg,
            "IOCTL_GNTDEV_UNMAP_GRANT_REF",
        )
    };
}

impl Drop for DevMapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len describe the mapping created in `map`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
        gntdev_unmap(self.dev.as_raw_fd(), self.index, self.pages);
    }
}

/// One event-channel port bound through its own `/dev/xen/evtchn` handle.
#[derive(Debug)]
pub struct DevChannel {
    fd: OwnedFd,
    port: Port,
    remote: DomId,
}

impl DevChannel {
    fn bind(
        req: libc::c_ulong,
        remote: DomId,
        arg: &mut [u32],
        op: &'static str,
    ) -> Result<DevChannel, XenError> {
        let fd = open_dev(EVTCHN_PATH, libc::O_NONBLOCK)?;
        // SAFETY: `arg` is a live array laid out as the bind ioctl's struct
        // (one or two unsigned ints).
        let port = unsafe { ioctl_ptr(fd.as_raw_fd(), req, arg.as_mut_ptr(), op) }?;
        Ok(DevChannel {
            fd,
            port: port as Port,
            remote,
        })
    }
}

impl AsFd for DevChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for DevChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl EventChannel for DevChannel {
    fn local_port(&self) -> Port {
        self.port
    }
    fn wait_readable(&self, timeout_ms: i32) -> std::io::Result<bool> {
        super::poll_readable(self.fd.as_fd(), timeout_ms)
    }
    fn remote_domid(&self) -> DomId {
        self.remote
    }
    fn notify(&self) -> Result<(), XenError> {
        let mut arg = EvtchnPort { port: self.port };
        // SAFETY: `arg` is a live ioctl_evtchn_notify.
        unsafe {
            ioctl_ptr(
                self.fd.as_raw_fd(),
                IOCTL_EVTCHN_NOTIFY,
                &mut arg,
                "IOCTL_EVTCHN_NOTIFY",
            )
        }?;
        Ok(())
    }
    fn ack(&self) -> Result<bool, XenError> {
        let mut ports = [0u32; 16];
        // SAFETY: reading into a live buffer of the given size.
        let n = unsafe {
            libc::read(
                self.fd.as_raw_fd(),
                ports.as_mut_ptr().cast(),
                size_of::<[u32; 16]>(),
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(false);
            }
            return Err(XenError::Os {
                op: "read /dev/xen/evtchn",
                source: e,
            });
        }
        let n = n as usize;
        if n == 0 {
            return Ok(false);
        }
        // Writing the ports back unmasks them.
        // SAFETY: writing `n` initialised bytes from the buffer just filled.
        let w = unsafe { libc::write(self.fd.as_raw_fd(), ports.as_ptr().cast(), n) };
        if w < 0 {
            return Err(XenError::last_os("unmask /dev/xen/evtchn"));
        }
        Ok(true)
    }
    fn peer_state(&self) -> Result<PeerState, XenError> {
        Ok(PeerState::Unknown)
    }
}

impl Drop for DevChannel {
    fn drop(&mut self) {
        let mut arg = EvtchnPort { port: self.port };
        // SAFETY: `arg` is a live ioctl_evtchn_unbind; closing the fd
        // afterwards would unbind anyway.
        let _ = unsafe {
            ioctl_ptr(
                self.fd.as_raw_fd(),
                IOCTL_EVTCHN_UNBIND,
                &mut arg,
                "IOCTL_EVTCHN_UNBIND",
            )
        };
    }
}

impl XenBackend for DevXen {
    type Grant = DevGrant;
    type Mapping = DevMapping;
    type Channel = DevChannel;

    fn grant(&self, peer: DomId, pages: usize, access: Access) -> Result<DevGrant, XenError> {
        let len = check_pages(pages)?;
        let header = size_of::<GntallocAllocGref>() - size_of::<u32>();
        let mut buf = ioctl_buffer(header + pages * size_of::<u32>());
        let arg = buf.as_mut_ptr().cast::<GntallocAllocGref>();
        // SAFETY: `buf` is 8-byte aligned and large enough for the header
        // plus `pages` gref ids; we write the IN fields through the raw
        // pointer before the driver fills the OUT fields.
        unsafe {
            (*arg).domid = peer;
            (*arg).flags = if access == Access::ReadWrite {
                GNTALLOC_FLAG_WRITABLE
            } else {
                0
            };
            (*arg).count = pages as u32;
            ioctl_ptr(
                self.gntalloc.as_raw_fd(),
                IOCTL_GNTALLOC_ALLOC_GREF,
                arg,
                "IOCTL_GNTALLOC_ALLOC_GREF",
            )?;
        }
        // SAFETY: the driver filled `index` and `pages` gref ids, all inside
        // `buf`, which stays alive until the end of this function.
        let (index, refs) = unsafe {
            let ids = std::ptr::addr_of!((*arg).gref_ids).cast::<u32>();
            (
                (*arg).index,
                (0..pages).map(|i| ids.add(i).read()).collect::<Vec<_>>(),
            )
        };
        let ptr = match mmap_shared(self.gntalloc.as_raw_fd(), len, index, true) {
            Ok(p) => p,
            Err(e) => {
                let mut d = GntallocDeallocGref {
                    index,
                    count: pages as u32,
                };
                // SAFETY: `d` is a live ioctl_gntalloc_dealloc_gref.
                let _ = unsafe {
                    ioctl_ptr(
                        self.gntalloc.as_raw_fd(),
                        IOCTL_GNTALLOC_DEALLOC_GREF,
                        &mut d,
                        "IOCTL_GNTALLOC_DEALLOC_GREF",
                    )
                };
                return Err(e);
            }
        };
        Ok(DevGrant {
            dev: self.gntalloc.clone(),
            index,
            ptr,
            len,
            refs,
            peer,
            peer_access: access,
        })
    }

    fn map(&self, peer: DomId, refs: &[GrantRef], access: Access) -> Result<DevMapping, XenError> {
        let len = check_pages(refs.len())?;
        let header = size_of::<GntdevMapGrantRef>() - size_of::<GntdevGrantRef>();
        let mut buf = ioctl_buffer(header + refs.len() * size_of::<GntdevGrantRef>());
        let arg = buf.as_mut_ptr().cast::<GntdevMapGrantRef>();
        // SAFETY: `buf` is 8-byte aligned and large enough for the header
        // plus one (domid, ref) pair per page.
        let index = unsafe {
            (*arg).count = refs.len() as u32;
            let pairs = std::ptr::addr_of_mut!((*arg).refs).cast::<GntdevGrantRef>();
            for (i, r) in refs.iter().enumerate() {
                pairs.add(i).write(GntdevGrantRef {
                    domid: u32::from(peer),
                    gref: *r,
                });
            }
            ioctl_ptr(
                self.gntdev.as_raw_fd(),
                IOCTL_GNTDEV_MAP_GRANT_REF,
                arg,
                "IOCTL_GNTDEV_MAP_GRANT_REF",
            )?;
            (*arg).index
        };
        let writable = access == Access::ReadWrite;
        let ptr = match mmap_shared(self.gntdev.as_raw_fd(), len, index, writable) {
            Ok(p) => p,
            Err(e) => {
                gntdev_unmap(self.gntdev.as_raw_fd(), index, refs.len() as u32);
                return Err(e);
            }
        };
        Ok(DevMapping {
            dev: self.gntdev.clone(),
            index,
            ptr,
            len,
            pages: refs.len() as u32,
            writable,
            peer,
        })
    }

    fn alloc_unbound(&self, remote: DomId) -> Result<DevChannel, XenError> {
        let mut arg = [u32::from(remote)];
        DevChannel::bind(
            IOCTL_EVTCHN_BIND_UNBOUND_PORT,
            remote,
            &mut arg,
            "IOCTL_EVTCHN_BIND_UNBOUND_PORT",
        )
    }

    fn bind_interdomain(&self, remote: DomId, remote_port: Port) -> Result<DevChannel, XenError> {
        let mut arg = [u32::from(remote), remote_port];
        DevChannel::bind(
            IOCTL_EVTCHN_BIND_INTERDOMAIN,
            remote,
            &mut arg,
            "IOCTL_EVTCHN_BIND_INTERDOMAIN",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    fn ioctl_numbers_match_the_uapi_headers() {
        // Values of the _IOC() expressions in Linux's uapi headers, computed
        // by hand: (size << 16) | (type << 8) | nr.
        assert_eq!(IOCTL_GNTALLOC_ALLOC_GREF, (24 << 16) | (0x47 << 8) | 5);
        assert_eq!(IOCTL_GNTALLOC_DEALLOC_GREF, (16 << 16) | (0x47 << 8) | 6);
        assert_eq!(
            IOCTL_GNTALLOC_SET_UNMAP_NOTIFY,
            (16 << 16) | (0x47 << 8) | 7
        );
        assert_eq!(IOCTL_GNTDEV_MAP_GRANT_REF, (24 << 16) | (0x47 << 8));
        assert_eq!(IOCTL_GNTDEV_UNMAP_GRANT_REF, (16 << 16) | (0x47 << 8) | 1);
        assert_eq!(IOCTL_GNTDEV_SET_UNMAP_NOTIFY, (16 << 16) | (0x47 << 8) | 7);
        assert_eq!(IOCTL_EVTCHN_BIND_INTERDOMAIN, (8 << 16) | (0x45 << 8) | 1);
        assert_eq!(IOCTL_EVTCHN_BIND_UNBOUND_PORT, (4 << 16) | (0x45 << 8) | 2);
        assert_eq!(IOCTL_EVTCHN_UNBIND, (4 << 16) | (0x45 << 8) | 3);
        assert_eq!(IOCTL_EVTCHN_NOTIFY, (4 << 16) | (0x45 << 8) | 4);
    }

    #[test]
    fn notify_argument_is_checked_against_the_region() {
        let n = UnmapNotify {
            clear_byte: Some(4096),
            send_event: None,
        };
        assert!(matches!(notify_arg(0, 4096, n), Err(XenError::Invalid(_))));
        let n = UnmapNotify {
            clear_byte: Some(10),
            send_event: Some(7),
        };
        let a = notify_arg(8192, 4096, n).unwrap();
        assert_eq!(a.index, 8202);
        assert_eq!(a.action, UNMAP_NOTIFY_CLEAR_BYTE | UNMAP_NOTIFY_SEND_EVENT);
        assert_eq!(a.event_channel_port, 7);
    }

    #[test]
    fn open_without_xen_reports_unavailable() {
        if std::path::Path::new("/dev/xen/gntalloc").exists() {
            return; // running on Xen: the lab exercises the devices.
        }
        match DevXen::open() {
            Err(XenError::Unavailable(msg)) => assert!(msg.contains("gntalloc"), "{msg}"),
            other => panic!("expected Unavailable, got {other:?}"),
        }
    }

    #[test]
    fn page_count_is_bounded() {
        assert!(check_pages(0).is_err());
        assert!(check_pages(MAX_PAGES_PER_CALL + 1).is_err());
        assert_eq!(check_pages(2).unwrap(), 8192);
    }
}
