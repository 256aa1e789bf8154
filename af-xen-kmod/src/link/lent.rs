// SPDX-License-Identifier: GPL-2.0
//! Receive rings lent to the peer after their connection closed, until
//! the peer answers or `LINGER_MAX_MS` passes (`reap`).

use super::*;

/// How long a closed connection's receive ring stays lent to the peer
/// without the peer's Close or Reset (see `Lent`). The peer only needs it
/// until it has mapped the ring (it answers our ConnectAccept by mapping
/// it, milliseconds under TCG); after that, ending the grant is deferred by
/// Xen until the peer unmaps. So the bound only matters for a peer that
/// never answers, and is far above any honest delay.
pub(crate) const LINGER_MAX_MS: u64 = 60_000;

/// A receive ring of a connection we accepted and have closed, kept
/// granted until the peer says it is done with it (its Close or Reset), the
/// link goes down, or `LINGER_MAX_MS` passes. Without it an acceptor that
/// closes at once ended the grant before the connector had mapped it, and
/// the connector's connect failed with ECONNREFUSED instead of reading the
/// data and EOF.
pub(crate) struct Lent<R> {
    pub(super) _ring: R,
    pub(super) deadline_ms: u64,
}

impl<R> Lent<R> {
    pub(crate) fn new(ring: R) -> Self {
        sys::counters::add(&sys::counters::LINGERING, 1);
        Lent {
            _ring: ring,
            deadline_ms: crate::sys::net::now_ms() + LINGER_MAX_MS,
        }
    }
}

impl<R> Drop for Lent<R> {
    fn drop(&mut self) {
        // the pipe (and with it the grant) goes after this: Xen defers
        // freeing the pages while the peer still maps them
        sys::counters::add(&sys::counters::LINGERING, -1);
    }
}

/// Lends `rx`, the receive ring of our closed connection `conn_id`, to the
/// link's peer until its Close or Reset (see `Lent`). Called with the link
/// locked, in the same critical section that took the connection off
/// `conns`, so a Close handled by the work item either found the socket
/// (and it does not lend) or finds the ring here.
pub(crate) fn lend<C: LinkConn>(i: &mut LinkInner<C>, conn_id: u32, rx: C::Ring) {
    // no memory for the entry: the grant ends now, as it did before lending
    if i.lent
        .try_create_and_insert(conn_id, Lent::new(rx), GFP_KERNEL)
        .is_ok()
    {
        sys::schedule_reap(LINGER_MAX_MS as u32 + 100);
    }
}

/// The delayed work for the links' deadlines: ends lent rings whose peer
/// never answered within `LINGER_MAX_MS` (counted in `linger_expired`;
/// ending is kept pending while the peer maps the ring), fails connects
/// whose answer did not come in time (`LinkConn::connect_deadline`)
/// (ETIMEDOUT), and runs again for the rest.
pub(crate) fn reap<C: LinkConn>() {
    let links: KVec<Arc<Link<C>>> = {
        let t = C::links().lock();
        if t.stopping {
            return;
        }
        let mut v = KVec::new();
        for l in t.links.iter() {
            if v.push(l.clone(), GFP_KERNEL).is_err() {
                break;
            }
        }
        v
    };
    let now = crate::sys::net::now_ms();
    let mut next: Option<u64> = None;
    for l in links.iter() {
        let mut expired: KVec<Lent<C::Ring>> = KVec::new();
        let mut n_expired = 0i64;
        {
            let mut i = l.inner.lock();
            let mut due: KVec<u32> = KVec::new();
            for (id, lent) in i.lent.iter() {
                if lent.deadline_ms <= now {
                    if due.push(*id, GFP_KERNEL).is_err() {
                        break;
                    }
                } else {
                    next = Some(next.map_or(lent.deadline_ms, |n| n.min(lent.deadline_ms)));
                }
            }
            let mut late: KVec<Arc<C>> = KVec::new();
            for (_, s) in i.conns.iter() {
                match s.connect_deadline() {
                    Some(d) if d <= now => {
                        let _ = late.push(s.clone(), GFP_KERNEL);
                    }
                    Some(d) => next = Some(next.map_or(d, |n| n.min(d))),
                    None => {}
                }
            }
            for s in late.iter() {
                i.conns.remove(&s.conn_id());
                C::connect_failed(s, e::ETIMEDOUT);
            }
            for id in due.iter() {
                if let Some(lent) = i.lent.remove(id) {
                    n_expired += 1;
                    // no room to carry it out: it ends here, under the
                    // link's mutex (may sleep: fine in a work item)
                    let _ = expired.push(lent, GFP_KERNEL);
                }
            }
        }
        if n_expired > 0 {
            sys::counters::add(&sys::counters::LINGER_EXPIRED, n_expired);
            pr_info!(
                "link to dom{}: {} closed connection(s) got no Close or Reset within {} s; their rings' grants end now\n",
                l.peer,
                n_expired,
                LINGER_MAX_MS / 1000
            );
        }
        // ending grants (and vfree) outside the link's lock
        drop(expired);
    }
    if let Some(n) = next {
        sys::schedule_reap((n.saturating_sub(now) + 100).min(u32::MAX as u64) as u32);
    }
}
