//! Which grant/event-channel backend this process uses, and why.
//!
//! Order of preference (see [`backend`]):
//! 1. the AF_XEN kernel family, when `af_xen.ko` is loaded
//!    (`/sys/module/af_xen/parameters/family` exists) -- not implemented by
//!    this version of the library: it is reported, and the user-space
//!    transport is used anyway;
//! 2. the real `/dev/xen/{gntalloc,gntdev,evtchn}` devices;
//! 3. the simulated host named by `XENSOCK_SIM` / `XENSOCK_SIM_DOMID`.

use std::fmt;
use std::path::Path;

use xensock_xenif::{
    Access, DomId, EventChannel, GrantRef, GrantedRegion, MappedRegion, Port, XenBackend, XenError,
};

/// Where the kernel module publishes its family number.
pub const KERNEL_FAMILY_PARAM: &str = "/sys/module/af_xen/parameters/family";

/// The kind of backend in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The AF_XEN kernel family (a later issue; never chosen today).
    Kernel,
    /// The user-space transport over the real `/dev/xen` devices.
    DevXen,
    /// The user-space transport over the simulated host.
    Sim,
    /// Nothing usable.
    None,
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Kernel => "kernel AF_XEN family",
            BackendKind::DevXen => "user-space transport over /dev/xen",
            BackendKind::Sim => "user-space transport over the simulated host",
            BackendKind::None => "none",
        })
    }
}

/// What [`backend`] found: the choice and the reasons for it, one line per
/// candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendReport {
    /// The backend that will be used.
    pub kind: BackendKind,
    /// One line per candidate, in order of preference.
    pub reasons: Vec<String>,
}

impl fmt::Display for BackendReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "backend: {}", self.kind)?;
        for r in &self.reasons {
            writeln!(f, "  {r}")?;
        }
        Ok(())
    }
}

fn dev_xen_present() -> bool {
    ["/dev/xen/gntalloc", "/dev/xen/gntdev", "/dev/xen/evtchn"]
        .iter()
        .all(|p| Path::new(p).exists())
}

/// Reports which backend [`crate::Transport::from_env`] (and so the
/// `XenListener::bind` / `XenStream::connect` free constructors) will use,
/// and why. Cheap: looks at files and environment variables only.
pub fn backend() -> BackendReport {
    let mut reasons = Vec::new();
    let kernel = Path::new(KERNEL_FAMILY_PARAM).exists();
    if kernel {
        reasons.push(format!(
            "kernel family: af_xen is loaded ({KERNEL_FAMILY_PARAM}), but this libxensock has no kernel-family path yet; using the user-space transport"
        ));
    } else {
        reasons.push(format!(
            "kernel family: not loaded ({KERNEL_FAMILY_PARAM} absent)"
        ));
    }
    let dev = dev_xen_present();
    reasons.push(if dev {
        "/dev/xen: gntalloc, gntdev and evtchn present".to_string()
    } else {
        "/dev/xen: gntalloc/gntdev/evtchn not all present".to_string()
    });
    let sim = std::env::var_os(xensock_sim::ENV_SIM_DIR);
    let sim_ok = sim.as_ref().is_some_and(|d| Path::new(d).is_dir());
    reasons.push(match (&sim, sim_ok) {
        (Some(d), true) => format!(
            "sim: XENSOCK_SIM={} (domain {})",
            Path::new(d).display(),
            std::env::var(xensock_sim::ENV_SIM_DOMID).unwrap_or_else(|_| "unset".into())
        ),
        (Some(d), false) => format!(
            "sim: XENSOCK_SIM={} is not a directory",
            Path::new(d).display()
        ),
        (None, _) => "sim: XENSOCK_SIM not set".to_string(),
    });
    let kind = if dev {
        BackendKind::DevXen
    } else if sim_ok {
        BackendKind::Sim
    } else {
        BackendKind::None
    };
    BackendReport { kind, reasons }
}

/// An object-safe view of a [`XenBackend`], so the transport is not generic.
pub(crate) trait DynXen: Send + Sync {
    fn grant(
        &self,
        peer: DomId,
        pages: usize,
        access: Access,
    ) -> Result<Box<dyn GrantedRegion>, XenError>;
    fn map(
        &self,
        peer: DomId,
        refs: &[GrantRef],
        access: Access,
    ) -> Result<Box<dyn MappedRegion>, XenError>;
    fn alloc_unbound(&self, remote: DomId) -> Result<Box<dyn EventChannel>, XenError>;
    fn bind_interdomain(
        &self,
        remote: DomId,
        port: Port,
    ) -> Result<Box<dyn EventChannel>, XenError>;
}

pub(crate) struct Dyn<B>(pub B);

impl<B> DynXen for Dyn<B>
where
    B: XenBackend,
    B::Grant: 'static,
    B::Mapping: 'static,
    B::Channel: 'static,
{
    fn grant(
        &self,
        peer: DomId,
        pages: usize,
        access: Access,
    ) -> Result<Box<dyn GrantedRegion>, XenError> {
        Ok(Box::new(self.0.grant(peer, pages, access)?))
    }
    fn map(
        &self,
        peer: DomId,
        refs: &[GrantRef],
        access: Access,
    ) -> Result<Box<dyn MappedRegion>, XenError> {
        Ok(Box::new(self.0.map(peer, refs, access)?))
    }
    fn alloc_unbound(&self, remote: DomId) -> Result<Box<dyn EventChannel>, XenError> {
        Ok(Box::new(self.0.alloc_unbound(remote)?))
    }
    fn bind_interdomain(
        &self,
        remote: DomId,
        port: Port,
    ) -> Result<Box<dyn EventChannel>, XenError> {
        Ok(Box::new(self.0.bind_interdomain(remote, port)?))
    }
}
