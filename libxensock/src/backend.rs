// SPDX-License-Identifier: MIT OR Apache-2.0
//! Which grant/event-channel backend this process uses, and why.
//!
//! Order of preference (see [`backend`]):
//! 1. the AF_XEN kernel family, when `af_xen.ko` is loaded
//!    (`/sys/module/af_xen/parameters/family` holds its family number):
//!    `XenStream::connect` and `XenListener::bind` then make plain AF_XEN
//!    sockets;
//! 2. the user-space transport ([`crate::Transport`]) over the real
//!    `/dev/xen/{gntalloc,gntdev,evtchn}` devices;
//! 3. the user-space transport over the simulated host named by
//!    `XENSOCK_SIM` / `XENSOCK_SIM_DOMID`.
//!
//! A [`crate::Transport`] is always the user-space transport (2 or 3, see
//! [`BackendReport::user_space`]), even where the module is loaded: a
//! program can still choose it explicitly (the lab benchmark measures both
//! in one boot). The two must not run in one domain at the same time:
//! both own the domain's `data/xensock/link` nodes in XenStore.

use std::fmt;
use std::path::Path;

use crate::kernel::{probe_family, FamilyProbe, FAMILY_PARAM_IN_SYSFS};

use xensock_xenif::{
    Access, DomId, EventChannel, GrantRef, GrantedRegion, MappedRegion, Port, XenBackend, XenError,
};

/// Where the kernel module publishes its family number.
pub const KERNEL_FAMILY_PARAM: &str = "/sys/module/af_xen/parameters/family";

/// The kind of backend in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendKind {
    /// The AF_XEN kernel family (`af_xen.ko`).
    Kernel,
    /// The user-space transport over the real `/dev/xen` devices.
    DevXen,
    /// The user-space transport over the simulated host.
    Sim,
    /// The guest's user-space transport, shared by `xensock daemon`
    /// ([`crate::daemon`]): a stream is a Unix socket the daemon relays.
    Daemon,
    /// Nothing usable.
    None,
}

impl BackendKind {
    /// A short name for scripts: `kernel`, `dev-xen`, `sim`, `daemon`,
    /// `none` (what `xensock status --json` reports).
    pub fn token(&self) -> &'static str {
        match self {
            BackendKind::Kernel => "kernel",
            BackendKind::DevXen => "dev-xen",
            BackendKind::Sim => "sim",
            BackendKind::Daemon => "daemon",
            BackendKind::None => "none",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            BackendKind::Kernel => "kernel AF_XEN family",
            BackendKind::DevXen => "user-space transport over /dev/xen",
            BackendKind::Sim => "user-space transport over the simulated host",
            BackendKind::Daemon => "user-space transport shared by xensock daemon",
            BackendKind::None => "none",
        })
    }
}

/// What [`backend`] found: the choice and the reasons for it, one line per
/// candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendReport {
    /// The backend `XenStream::connect` / `XenListener::bind` will use.
    pub kind: BackendKind,
    /// The kernel family number, when `kind` is [`BackendKind::Kernel`].
    pub family: Option<i32>,
    /// What [`crate::Transport::from_env`] (the user-space transport)
    /// will run over: [`BackendKind::DevXen`], [`BackendKind::Sim`] or
    /// [`BackendKind::None`]. Equal to `kind` unless the module is loaded.
    pub user_space: BackendKind,
    /// One line per candidate, in order of preference.
    pub reasons: Vec<String>,
}

impl BackendReport {
    /// The reasons on one line, for an error message.
    pub(crate) fn why(&self) -> String {
        self.reasons.join("; ")
    }
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

/// The running kernel's configuration file, when it says the kernel has
/// no Rust support (every mainstream distribution's kernel today).
/// Read once per process (a file of a few hundred KiB): the running
/// kernel's configuration does not change while it runs.
fn kernel_without_rust() -> Option<std::path::PathBuf> {
    static FOUND: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
            let release = release.trim();
            config_without_rust([
                format!("/boot/config-{release}").into(),
                format!("/lib/modules/{release}/build/.config").into(),
            ])
        })
        .clone()
}

/// The first of `configs` that exists, if it has no `CONFIG_RUST=y`.
fn config_without_rust(
    configs: impl IntoIterator<Item = std::path::PathBuf>,
) -> Option<std::path::PathBuf> {
    let (path, text) = configs
        .into_iter()
        .find_map(|p| std::fs::read_to_string(&p).ok().map(|t| (p, t)))?;
    (!text.lines().any(|l| l == "CONFIG_RUST=y")).then_some(path)
}

fn dev_xen_present() -> bool {
    ["/dev/xen/gntalloc", "/dev/xen/gntdev", "/dev/xen/evtchn"]
        .iter()
        .all(|p| Path::new(p).exists())
}

/// Reports which backend `XenStream::connect` / `XenListener::bind` will
/// use, and why (and, in [`BackendReport::user_space`], what
/// [`crate::Transport::from_env`] would use). Cheap: looks at files and
/// environment variables only.
pub fn backend() -> BackendReport {
    backend_with_sysfs(Path::new("/sys"))
}

/// [`backend`] with the kernel family looked up under `sysfs_root`
/// instead of `/sys` (`<root>/module/af_xen/parameters/family`), for tests
/// and for tools that inspect another root. `/dev/xen` and `XENSOCK_SIM`
/// are looked up as usual.
pub fn backend_with_sysfs(sysfs_root: &Path) -> BackendReport {
    let mut reasons = Vec::new();
    let param = sysfs_root.join(FAMILY_PARAM_IN_SYSFS);
    let family = match probe_family(sysfs_root) {
        FamilyProbe::Loaded(f) => {
            reasons.push(format!(
                "kernel family: af_xen is loaded as family {f} ({})",
                param.display()
            ));
            Some(f)
        }
        FamilyProbe::Absent => {
            let why = match kernel_without_rust() {
                Some(config) => format!(
                    "; this kernel is built without Rust support (no CONFIG_RUST=y in {}), \
                     so af_xen.ko cannot run on it: the user-space transport is the way here",
                    config.display()
                ),
                None => String::new(),
            };
            reasons.push(format!(
                "kernel family: not loaded ({} absent){why}",
                param.display()
            ));
            None
        }
        FamilyProbe::Invalid(why) => {
            reasons.push(format!("kernel family: unusable: {why}"));
            None
        }
    };
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
    let user_space = if dev {
        BackendKind::DevXen
    } else if sim_ok {
        BackendKind::Sim
    } else {
        BackendKind::None
    };
    let kind = if family.is_some() {
        BackendKind::Kernel
    } else {
        user_space
    };
    BackendReport {
        kind,
        family,
        user_space,
        reasons,
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_config_without_rust_is_named() {
        let d = tempfile::tempdir().unwrap();
        let debian = d.path().join("config-6.12.0-debian");
        std::fs::write(
            &debian,
            "CONFIG_XEN=y\nCONFIG_HAVE_RUST=y\n# CONFIG_RUST is not set\n",
        )
        .unwrap();
        let lab = d.path().join("config-lab");
        std::fs::write(&lab, "CONFIG_XEN=y\nCONFIG_RUST=y\n").unwrap();
        let missing = d.path().join("missing");
        assert_eq!(
            config_without_rust([missing.clone(), debian.clone()]),
            Some(debian)
        );
        assert_eq!(config_without_rust([lab, missing.clone()]), None);
        assert_eq!(config_without_rust([missing]), None);
    }

    struct FakeSysfs(std::path::PathBuf);

    impl FakeSysfs {
        fn new(tag: &str, family: Option<&str>) -> FakeSysfs {
            let root = std::env::temp_dir()
                .join(format!("libxensock-backend-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&root);
            std::fs::create_dir_all(&root).unwrap();
            if let Some(f) = family {
                let p = root.join(FAMILY_PARAM_IN_SYSFS);
                std::fs::create_dir_all(p.parent().unwrap()).unwrap();
                std::fs::write(p, f).unwrap();
            }
            FakeSysfs(root)
        }
    }

    impl Drop for FakeSysfs {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn loaded_module_selects_the_kernel_family() {
        let root = FakeSysfs::new("loaded", Some("19\n"));
        let r = backend_with_sysfs(&root.0);
        assert_eq!(r.kind, BackendKind::Kernel);
        assert_eq!(r.family, Some(19));
        // the user-space transport's choice is still reported
        assert_ne!(r.user_space, BackendKind::Kernel);
        assert!(r.reasons[0].contains("family 19"), "{r}");
    }

    #[test]
    fn absent_or_garbled_module_falls_back_to_user_space() {
        for (tag, content) in [("absent", None), ("garbled", Some("nineteen"))] {
            let root = FakeSysfs::new(tag, content);
            let r = backend_with_sysfs(&root.0);
            assert_eq!(r.family, None, "{tag}");
            assert_eq!(r.kind, r.user_space, "{tag}");
            assert_ne!(r.kind, BackendKind::Kernel, "{tag}");
        }
        let root = FakeSysfs::new("garbled2", Some("nineteen"));
        assert!(backend_with_sysfs(&root.0).reasons[0].contains("unusable"));
    }

    #[test]
    fn real_sysfs_is_the_default_root() {
        // On a host without af_xen both views agree; with it loaded, both
        // say Kernel. Either way backend() is backend_with_sysfs("/sys").
        assert_eq!(backend(), backend_with_sysfs(Path::new("/sys")));
    }
}
