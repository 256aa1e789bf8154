// SPDX-License-Identifier: GPL-2.0
//! The table of links: finding or making one, the XenStore watches,
//! suspend and resume, the link work item, shutdown.

use super::*;

/// The link to `peer`, advertised now if dom0 made its directory for us.
pub(crate) fn get_or_create<C: LinkConn>(peer: u32) -> core::result::Result<Arc<Link<C>>, i32> {
    let me = own_domid();
    let mut t = C::links().lock();
    if t.stopping || t.suspended {
        return Err(e::ENETUNREACH);
    }
    if let Some(l) = t.links.iter().find(|l| l.peer == peer) {
        return Ok(l.clone());
    }
    let dir = root(me).map_err(|_| e::ENOMEM)?;
    let mut ids = [0u32; 64];
    let n = xs::dir_ids(&dir, &mut ids);
    if !ids[..n].contains(&peer) {
        return Err(e::EHOSTUNREACH);
    }
    let l = Link::<C>::create(me, peer).map_err(|x| {
        pr_warn!("link to dom{}: cannot advertise: {:?}\n", peer, x);
        e::EHOSTUNREACH
    })?;
    t.links.push(l.clone(), GFP_KERNEL).map_err(|_| e::ENOMEM)?;
    Ok(l)
}

/// A link half in our link directory that the user-space transport
/// (libxensock) advertises: the peer's domid. It writes `generation`,
/// which the module never does. Module init refuses to start beside it:
/// both would own these nodes and withdraw each other's links.
pub(crate) fn user_space_link(me: u32) -> Option<u32> {
    let dir = root(me).ok()?;
    let mut ids = [0u32; 64];
    let n = xs::dir_ids(&dir, &mut ids);
    ids[..n].iter().copied().find(|peer| {
        let Ok(half) = CString::try_from_fmt(fmt!(
            "{}",
            HalfPath {
                owner: me,
                peer: *peer
            }
        )) else {
            return false;
        };
        HalfValues {
            generation: xs::read_u32(&half, node::GENERATION),
            state: xs::read_u32(&half, node::STATE),
            ..HalfValues::default()
        }
        .held_by_user_space()
    })
}

/// Module init: watch our link directory (dom0 creating a link) and domain
/// deaths, then look once.
pub(crate) fn start<C: LinkConn>() {
    let me = own_domid();
    if me == 0 {
        return;
    }
    let mut t = C::links().lock();
    add_watches(&mut t, me);
    drop(t);
    sys::schedule_work();
}

/// Our link directory (dom0 creating a link) and domain deaths.
pub(super) fn add_watches<C: LinkConn>(t: &mut LinkTable<C>, me: u32) {
    if let Ok(p) = root(me) {
        if let Ok(w) = xs::Watch::add(&p) {
            let _ = t.watches.push(w, GFP_KERNEL);
        }
    }
    // dom0 saying a peer is gone for good (`end_dead_peer`)
    if let Ok(p) = gone_dir(me) {
        if let Ok(w) = xs::Watch::add(&p) {
            let _ = t.watches.push(w, GFP_KERNEL);
        }
    }
    if let Ok(p) = CString::try_from_fmt(fmt!("@releaseDomain")) {
        if let Ok(w) = xs::Watch::add(&p) {
            let _ = t.watches.push(w, GFP_KERNEL);
        }
    }
}

/// Set by the restore hook: the work item starts over under our new domid.
pub(super) static RESUMED: AtomicBool = AtomicBool::new(false);

/// This guest is about to be saved (`xl save`/`migrate`; the freeze hook,
/// with grants, mappings and event channels still valid): every link goes
/// down properly, its stream connections move to TCP (their switches: the
/// read-back copy is taken from the peer's pages while they are mapped),
/// and our advertisements are retracted. Nothing of it is left to touch
/// after the restore, when all of it would be stale.
pub(crate) fn suspend_all<C: LinkConn>() {
    let (links, watches) = {
        let mut t = C::links().lock();
        if t.stopping {
            return;
        }
        t.suspended = true;
        (
            core::mem::replace(&mut t.links, KVec::new()),
            core::mem::replace(&mut t.watches, KVec::new()),
        )
    };
    drop(watches);
    for l in links.iter() {
        let (w, mine) = {
            let mut i = l.inner.lock();
            l.detach(&mut i, "this domain is being saved");
            (i.watch.take(), i.mine.take())
        };
        drop(w);
        xs::retract(&l.my_dir);
        drop(mine);
    }
    pr_info!(
        "suspend: {} links down, stream connections on TCP\n",
        links.len()
    );
}

/// The freeze is over: restored (a new domain, maybe a new domid) or the
/// suspend was cancelled. The work item starts the links over.
pub(crate) fn resumed<C: LinkConn>(restored: bool) {
    pr_info!(
        "{}: links start over\n",
        if restored {
            "restored"
        } else {
            "suspend cancelled"
        }
    );
    RESUMED.store(true, Ordering::Release);
    C::resumed();
    sys::schedule_work();
}

/// Work item, after a restore: our domid as XenStore says now, watches on
/// our (new) link directory.
pub(super) fn start_over<C: LinkConn>() {
    let old = own_domid();
    let me = read_own_domid().unwrap_or(old);
    set_own_domid(me);
    let mut t = C::links().lock();
    t.suspended = false;
    let w = core::mem::replace(&mut t.watches, KVec::new());
    add_watches(&mut t, me);
    drop(t);
    drop(w);
    pr_info!("back as dom{} (was dom{})\n", me, old);
}

/// The work item.
pub(crate) fn work<C: LinkConn>() {
    let t0 = crate::sys::net::now_ms();
    work_pass::<C>();
    sys::counters::note_work_ms(
        &sys::counters::LINK_WORK_MAX_MS,
        crate::sys::net::now_ms() - t0,
    );
}

pub(super) fn work_pass<C: LinkConn>() {
    let resumed = RESUMED.swap(false, Ordering::AcqRel);
    if resumed {
        start_over::<C>();
    }
    let me = own_domid();
    if me == 0 {
        return;
    }
    let xs_changed = sys::take_xs_dirty() || resumed;
    let mut ids = [0u32; 64];
    let mut n = 0;
    if let Ok(dir) = root(me).and_then(|d| if xs_changed { Ok(d) } else { Err(EAGAIN) }) {
        n = xs::dir_ids(&dir, &mut ids);
        for &peer in &ids[..n] {
            if peer != me {
                let _ = get_or_create::<C>(peer);
            }
        }
    }
    let Some(links) = links_snapshot::<C>(|_| true) else {
        return;
    };
    #[cfg(afx_test_hooks)]
    let forge = sys::test_hooks::take_inject_ring_offers();
    for l in links.iter() {
        if xs_changed && ids[..n].contains(&l.peer) {
            l.readvertise();
        }
        #[cfg(afx_test_hooks)]
        if forge > 0 && l.is_up() {
            l.send_forged_offers(forge);
        }
        l.service(xs_changed);
        // dom0's word may come after the peer's half vanished
        if xs_changed && l.vanished.load(Ordering::Acquire) && dead_marked(me, l.peer) {
            let mut i = l.inner.lock();
            l.end_dead_peer(&mut i);
        }
    }
}

/// The links `keep` selects, taken out of the table so they can be
/// serviced without its lock; None while the module stops or the guest
/// is suspended.
pub(super) fn links_snapshot<C: LinkConn>(
    keep: impl Fn(&Link<C>) -> bool,
) -> Option<KVec<Arc<Link<C>>>> {
    let t = C::links().lock();
    if t.stopping || t.suspended {
        return None;
    }
    let mut v = KVec::new();
    for l in t.links.iter() {
        if keep(l) && v.push(l.clone(), GFP_KERNEL).is_err() {
            break;
        }
    }
    Some(v)
}

/// While stream connections wait on TCP for their link to come back:
/// look at the links that are down as if a watch had fired (the TCP work
/// item calls this at most every 500 ms). A watch event can be missed
/// while a link directory is being made again (one side re-advertised,
/// the other never attached to it), and a connection must not stay on TCP because of it.
pub(crate) fn poll_down_links<C: LinkConn>() {
    static LAST_MS: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);
    let now = crate::sys::net::now_ms();
    let last = LAST_MS.load(Ordering::Relaxed);
    if now < last + 500
        || LAST_MS
            .compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
    {
        return;
    }
    let me = own_domid();
    let Some(links) = links_snapshot::<C>(|l| !l.is_up()) else {
        return;
    };
    if links.is_empty() {
        return;
    }
    let mut ids = [0u32; 64];
    let n = root(me).map(|d| xs::dir_ids(&d, &mut ids)).unwrap_or(0);
    for l in links.iter() {
        if !ids[..n].contains(&l.peer) {
            continue;
        }
        l.readvertise();
        let mut i = l.inner.lock();
        if i.mine.is_some() && i.peer.is_none() {
            l.follow_peer(&mut i);
        }
    }
}

/// Module exit (no sockets left): stop the work, retract every link.
pub(crate) fn shutdown_all<C: LinkConn>() {
    let (watches, links) = {
        let mut t = C::links().lock();
        t.stopping = true;
        (
            core::mem::replace(&mut t.watches, KVec::new()),
            core::mem::replace(&mut t.links, KVec::new()),
        )
    };
    drop(watches);
    for l in links.iter() {
        let (w, ph, mine) = {
            let mut i = l.inner.lock();
            l.up.store(false, Ordering::Release);
            l.wake.set_up(false);
            l.kick_port.store(0, Ordering::Release);
            (i.watch.take(), i.peer.take(), i.mine.take())
        };
        drop(w);
        drop(ph);
        xs::retract(&l.my_dir);
        drop(mine);
        // lent rings hold the link (the pipes' `link`): break the cycle
        let lent = core::mem::replace(&mut l.inner.lock().lent, RBTree::new());
        drop(lent);
    }
    sys::cancel_work();
    sys::cancel_reap();
    drop(links);
}
