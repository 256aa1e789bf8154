// SPDX-License-Identifier: MIT OR Apache-2.0
//! The sim's grant table and event channels through the XenBackend trait.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use xensock_sim::{DomainConfig, MigrateTo, SimDomain, SimHost, SimXen};
use xensock_xenif::{
    Access, EventChannel, GrantedRegion, MappedRegion, PeerState, SharedRegion, UnmapNotify,
    XenBackend, XenError, PAGE_SIZE,
};

const T: Duration = Duration::from_secs(5);

fn setup(n: usize) -> (SimHost, Vec<(SimDomain, SimXen)>) {
    let host = SimHost::start().unwrap();
    let doms = (0..n)
        .map(|i| {
            let d = host
                .create_domain(DomainConfig::new(format!("d{i}")))
                .unwrap();
            let x = SimXen::connect(host.dir(), d.domid).unwrap();
            (d, x)
        })
        .collect();
    (host, doms)
}

fn put(r: &impl SharedRegion, off: usize, v: u8) {
    assert!(off < r.len());
    // SAFETY: in bounds of a live region.
    unsafe { r.as_ptr().add(off).write_volatile(v) }
}

fn get(r: &impl SharedRegion, off: usize) -> u8 {
    assert!(off < r.len());
    // SAFETY: in bounds of a live region.
    unsafe { r.as_ptr().add(off).read_volatile() }
}

fn assert_clean(host: &SimHost) {
    let s = host.stats();
    assert!(s.grants_and_channels_released(), "leak: {s:?}");
}

#[test]
fn only_the_grantee_can_map_and_memory_is_shared() {
    let (host, d) = setup(3);
    let ((a, xa), (b, xb), (c, xc)) = (&d[0], &d[1], &d[2]);
    let g = xa.grant(b.domid, 2, Access::ReadWrite).unwrap();
    assert_eq!(g.refs().len(), 2);
    assert_eq!(g.len(), 2 * PAGE_SIZE);
    let m = xb.map(a.domid, g.refs(), Access::ReadWrite).unwrap();
    put(&g, 0, 1);
    put(&m, PAGE_SIZE + 7, 2);
    assert_eq!(get(&m, 0), 1);
    assert_eq!(get(&g, PAGE_SIZE + 7), 2);
    // Pages in another order map in that order.
    let rev = xb
        .map(a.domid, &[g.refs()[1], g.refs()[0]], Access::ReadOnly)
        .unwrap();
    assert_eq!(get(&rev, 7), 2);
    assert_eq!(get(&rev, PAGE_SIZE), 1);
    // Not the grantee: refused, whoever asks.
    for (x, who) in [(xc, "third domain"), (xa, "granter itself")] {
        match x.map(a.domid, g.refs(), Access::ReadOnly) {
            Err(XenError::PermissionDenied(_)) => {}
            other => panic!("{who}: expected PermissionDenied, got {other:?}"),
        }
    }
    let dom0 = SimXen::connect(host.dir(), 0).unwrap();
    assert!(matches!(
        dom0.map(a.domid, g.refs(), Access::ReadOnly),
        Err(XenError::PermissionDenied(_))
    ));
    // Wrong granter or unknown refs.
    assert!(matches!(
        xb.map(c.domid, g.refs(), Access::ReadOnly),
        Err(XenError::NotFound(_))
    ));
    assert!(matches!(
        xb.map(a.domid, &[9999], Access::ReadOnly),
        Err(XenError::NotFound(_))
    ));
    assert!(matches!(
        xb.map(a.domid, &[], Access::ReadOnly),
        Err(XenError::Invalid(_))
    ));
    assert!(matches!(
        xa.grant(b.domid, 0, Access::ReadOnly),
        Err(XenError::Invalid(_))
    ));
    assert_eq!(host.stats().mappings, 2);
    drop((m, rev, g));
    assert_clean(&host);
}

#[test]
fn read_only_grants_map_read_only() {
    let (host, d) = setup(2);
    let ((a, xa), (b, xb)) = (&d[0], &d[1]);
    let g = xa.grant(b.domid, 1, Access::ReadOnly).unwrap();
    assert_eq!(g.peer_access(), Access::ReadOnly);
    assert!(matches!(
        xb.map(a.domid, g.refs(), Access::ReadWrite),
        Err(XenError::PermissionDenied(_))
    ));
    let m = xb.map(a.domid, g.refs(), Access::ReadOnly).unwrap();
    assert!(!m.writable());
    put(&g, 100, 42);
    assert_eq!(get(&m, 100), 42);
    // The kernel refuses to make the mapping writable: it comes from a
    // read-only descriptor.
    // SAFETY: mprotect on our own mapping; failure is what we expect.
    let rc = unsafe {
        libc::mprotect(
            m.as_ptr().cast(),
            m.len(),
            libc::PROT_READ | libc::PROT_WRITE,
        )
    };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EACCES)
    );
    // Clearing a byte needs a writable mapping.
    let mut m = m;
    assert!(matches!(
        m.set_unmap_notify(UnmapNotify {
            clear_byte: Some(0),
            send_event: None
        }),
        Err(XenError::Invalid(_))
    ));
    drop((m, g));
    assert_clean(&host);
}

#[test]
fn ending_access_while_mapped_is_deferred_until_unmap() {
    let (host, d) = setup(2);
    let ((a, xa), (b, xb)) = (&d[0], &d[1]);
    let g = xa.grant(b.domid, 1, Access::ReadWrite).unwrap();
    let refs = g.refs().to_vec();
    let m = xb.map(a.domid, &refs, Access::ReadWrite).unwrap();
    put(&g, 3, 9);
    drop(g);
    let s = host.stats();
    assert_eq!(
        (s.grants, s.deferred_grants, s.mappings),
        (0, 1, 1),
        "{s:?}"
    );
    // The mapper keeps the page; new mappings are refused.
    assert_eq!(get(&m, 3), 9);
    assert!(matches!(
        xb.map(a.domid, &refs, Access::ReadWrite),
        Err(XenError::NotFound(_))
    ));
    drop(m);
    assert_clean(&host);
}

#[test]
fn event_channels_connect_notify_and_close() {
    let (host, d) = setup(3);
    let ((a, xa), (b, xb), (_c, xc)) = (&d[0], &d[1], &d[2]);
    let ca = xa.alloc_unbound(b.domid).unwrap();
    assert_eq!(ca.peer_state().unwrap(), PeerState::Unbound);
    // Only the named remote domain may bind.
    assert!(matches!(
        xc.bind_interdomain(a.domid, ca.local_port()),
        Err(XenError::PermissionDenied(_))
    ));
    assert!(matches!(
        xb.bind_interdomain(a.domid, 4242),
        Err(XenError::NotFound(_))
    ));
    let cb = xb.bind_interdomain(a.domid, ca.local_port()).unwrap();
    assert_eq!(cb.remote_domid(), a.domid);
    assert_eq!(ca.peer_state().unwrap(), PeerState::Connected);
    assert_eq!(cb.peer_state().unwrap(), PeerState::Connected);
    assert!(matches!(
        xc.bind_interdomain(a.domid, ca.local_port()),
        Err(XenError::Invalid(_)) | Err(XenError::PermissionDenied(_))
    ));
    // Kicks in both directions; the fd is pollable; ack consumes.
    assert!(!ca.ack().unwrap());
    cb.notify().unwrap();
    cb.notify().unwrap();
    let mut pfd = libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&ca),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd.
    assert_eq!(unsafe { libc::poll(&mut pfd, 1, 5000) }, 1);
    assert!(ca.wait(Some(T)).unwrap());
    assert!(!ca.ack().unwrap(), "two kicks coalesce into one wakeup");
    ca.notify().unwrap();
    assert!(cb.wait(Some(T)).unwrap());
    assert!(!cb.wait(Some(Duration::from_millis(20))).unwrap());
    // Closing one end is visible at the other.
    drop(cb);
    assert_eq!(ca.peer_state().unwrap(), PeerState::Closed);
    // As in Xen, the end left behind is unbound again for the same remote
    // domain (a guest's next process binds the port a kernel driver
    // allocated once), and for no other.
    assert!(matches!(
        xc.bind_interdomain(a.domid, ca.local_port()),
        Err(XenError::PermissionDenied(_))
    ));
    let cb = xb.bind_interdomain(a.domid, ca.local_port()).unwrap();
    assert_eq!(ca.peer_state().unwrap(), PeerState::Connected);
    cb.notify().unwrap();
    assert!(ca.wait(Some(T)).unwrap());
    drop(cb);
    drop(ca);
    assert_clean(&host);
}

#[test]
fn unmap_notifications_fire_on_drop() {
    let (host, d) = setup(2);
    let ((a, xa), (b, xb)) = (&d[0], &d[1]);
    let ca = xa.alloc_unbound(b.domid).unwrap();
    let cb = xb.bind_interdomain(a.domid, ca.local_port()).unwrap();
    // Mapper side (gntdev): clear byte 5 and kick when B unmaps.
    let mut g = xa.grant(b.domid, 1, Access::ReadWrite).unwrap();
    let mut m = xb.map(a.domid, g.refs(), Access::ReadWrite).unwrap();
    m.set_unmap_notify(UnmapNotify {
        clear_byte: Some(5),
        send_event: Some(cb.local_port()),
    })
    .unwrap();
    assert!(matches!(
        m.set_unmap_notify(UnmapNotify {
            clear_byte: Some(PAGE_SIZE),
            send_event: None
        }),
        Err(XenError::Invalid(_))
    ));
    put(&g, 5, 0xaa);
    drop(m);
    assert!(ca.wait(Some(T)).unwrap(), "no kick from unmap");
    assert_eq!(get(&g, 5), 0);
    // Granter side (gntalloc): clear byte 9 and kick when A ungrants.
    let m = xb.map(a.domid, g.refs(), Access::ReadWrite).unwrap();
    g.set_unmap_notify(UnmapNotify {
        clear_byte: Some(9),
        send_event: Some(ca.local_port()),
    })
    .unwrap();
    put(&m, 9, 0xbb);
    drop(g);
    assert!(cb.wait(Some(T)).unwrap(), "no kick from ungrant");
    assert_eq!(get(&m, 9), 0);
    drop((m, ca, cb));
    assert_clean(&host);
}

#[test]
fn unmap_notification_fires_when_the_mapping_process_dies() {
    let (host, d) = setup(2);
    let ((a, xa), (b, _)) = (&d[0], &d[1]);
    let ca = xa.alloc_unbound(b.domid).unwrap();
    let g = xa.grant(b.domid, 1, Access::ReadWrite).unwrap();
    put(&g, 5, 0xaa);
    let mut child = b
        .command(env!("CARGO_BIN_EXE_xensock-sim"))
        .args([
            "hold",
            "--peer",
            &a.domid.to_string(),
            "--refs",
            &g.refs()[0].to_string(),
            "--port",
            &ca.local_port().to_string(),
            "--clear-byte",
            "5",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    assert_eq!(host.stats().mappings, 1);
    assert_eq!(ca.peer_state().unwrap(), PeerState::Connected);
    assert_eq!(get(&g, 5), 0xaa);
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(ca.wait(Some(T)).unwrap(), "no kick after the process died");
    assert_eq!(get(&g, 5), 0, "byte not cleared");
    // Its mapping and port went with it.
    assert_eq!(host.stats().mappings, 0);
    assert_eq!(ca.peer_state().unwrap(), PeerState::Closed);
    drop((g, ca));
    assert_clean(&host);
}

#[test]
fn destroying_a_domain_releases_its_grants_maps_and_channels() {
    let (host, d) = setup(2);
    let ((a, xa), (b, xb)) = (&d[0], &d[1]);
    let ca = xa.alloc_unbound(b.domid).unwrap();
    let cb = xb.bind_interdomain(a.domid, ca.local_port()).unwrap();
    let ga = xa.grant(b.domid, 1, Access::ReadWrite).unwrap();
    let mut mb = xb.map(a.domid, ga.refs(), Access::ReadWrite).unwrap();
    mb.set_unmap_notify(UnmapNotify {
        clear_byte: Some(1),
        send_event: Some(cb.local_port()),
    })
    .unwrap();
    let gb = xb.grant(a.domid, 1, Access::ReadWrite).unwrap();
    let ma = xa.map(b.domid, gb.refs(), Access::ReadWrite).unwrap();
    put(&ga, 1, 7);
    put(&gb, 0, 8);
    host.destroy_domain(b.domid).unwrap();
    let s = host.stats();
    // B's mapping is gone; B's grant is deferred while A maps it; B's port
    // is closed; A's own grant and port remain.
    assert_eq!(
        (s.mappings, s.grants, s.deferred_grants, s.ports),
        (1, 1, 1, 1),
        "{s:?}"
    );
    assert_eq!(ca.peer_state().unwrap(), PeerState::Closed);
    // A dying domain runs no unmap code: no notification.
    assert_eq!(get(&ga, 1), 7);
    assert!(!ca.ack().unwrap());
    // A still reads B's last data (Xen keeps a dying domain's mapped pages).
    assert_eq!(get(&ma, 0), 8);
    assert!(xb.is_closed());
    assert!(matches!(
        xb.grant(a.domid, 1, Access::ReadOnly),
        Err(XenError::Revoked)
    ));
    assert!(matches!(cb.notify(), Err(XenError::Revoked)));
    drop((mb, gb, cb));
    drop((ma, ga, ca));
    assert_clean(&host);
    assert!(host.domain(b.domid).is_none());
}

#[test]
fn migration_tears_down_and_the_domain_continues_under_a_new_domid() {
    let (host, d) = setup(2);
    let ((a, xa), (b, xb)) = (&d[0], &d[1]);
    let ca = xa.alloc_unbound(b.domid).unwrap();
    let cb = xb.bind_interdomain(a.domid, ca.local_port()).unwrap();
    let ga = xa.grant(b.domid, 1, Access::ReadWrite).unwrap();
    let mb = xb.map(a.domid, ga.refs(), Access::ReadWrite).unwrap();
    let gb = xb.grant(a.domid, 1, Access::ReadWrite).unwrap();
    let ma = xa.map(b.domid, gb.refs(), Access::ReadWrite).unwrap();
    put(&ga, 0, 1);
    put(&gb, 0, 2);
    assert_eq!(get(&mb, 0), 1);
    let new = host
        .migrate_domain(b.domid, MigrateTo::SameHost)
        .unwrap()
        .unwrap();
    // The handle learns of the move from the host's event, asynchronously.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while xb.domid() != new && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(xb.domid(), new);
    assert!(!xb.is_closed());
    // B's view of A's page and its own granted page are gone (zero pages),
    // and no longer shared: writes do not cross any more.
    assert_eq!(get(&mb, 0), 0);
    put(&ga, 0, 3);
    assert_eq!(get(&mb, 0), 0);
    put(&gb, 0, 4);
    assert_eq!(get(&ma, 0), 2, "A keeps B's old page as it was");
    assert!(matches!(cb.notify(), Err(XenError::Revoked)));
    assert_eq!(ca.peer_state().unwrap(), PeerState::Closed);
    // A grant to the old domid cannot be mapped by the migrated domain.
    let old_g = xa.grant(b.domid, 1, Access::ReadWrite).unwrap();
    assert!(matches!(
        xb.map(a.domid, old_g.refs(), Access::ReadWrite),
        Err(XenError::PermissionDenied(_))
    ));
    // Under its new identity it works again.
    let g2 = xa.grant(new, 1, Access::ReadWrite).unwrap();
    let m2 = xb.map(a.domid, g2.refs(), Access::ReadWrite).unwrap();
    put(&g2, 0, 5);
    assert_eq!(get(&m2, 0), 5);
    let c2 = xa.alloc_unbound(new).unwrap();
    let cb2 = xb.bind_interdomain(a.domid, c2.local_port()).unwrap();
    cb2.notify().unwrap();
    assert!(c2.wait(Some(T)).unwrap());
    drop((mb, gb, cb, m2, cb2));
    drop((ma, ga, ca, old_g, g2, c2));
    assert_clean(&host);
}

#[test]
fn spawned_domain_lives_as_long_as_its_process() {
    let host = SimHost::start().unwrap();
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("30");
    let (dom, _pid) = host.spawn_domain(DomainConfig::new("short"), cmd).unwrap();
    assert!(host.domain(dom.domid).is_some());
    // Destroying the domain kills its process; the waiter reaps it.
    host.destroy_domain(dom.domid).unwrap();
    assert!(host.domain(dom.domid).is_none());
    let mut cmd = std::process::Command::new("true");
    cmd.arg("ignored");
    let (dom2, _) = host.spawn_domain(DomainConfig::new("brief"), cmd).unwrap();
    let deadline = std::time::Instant::now() + T;
    while host.domain(dom2.domid).is_some() {
        assert!(
            std::time::Instant::now() < deadline,
            "domain outlived its process"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}
