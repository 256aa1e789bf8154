// SPDX-License-Identifier: MIT OR Apache-2.0
//! The manager thread: XenStore watch events, link kicks, the kick timer
//! and the sweep that brings connections on TCP back to rings.

use super::*;

/// How often the manager retries ring offers for connections on TCP.
pub(super) const CARRIER_SWEEP: Duration = Duration::from_millis(20);
/// The sweep's interval doubles up to this while no carrier connection has
/// a usable link or a kept offer (nothing a sweep could do), and is back
/// at `CARRIER_SWEEP` after any event: every 20 ms it cost the process
/// 20-40 ms of CPU per second in a lab guest with its links down, on the
/// streaming application's vCPU.
pub(super) const CARRIER_SWEEP_IDLE_MAX: Duration = Duration::from_millis(320);

pub(super) fn manager_thread(inner: Arc<Inner>) {
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 64];
    let mut last_sweep = Instant::now();
    let mut sweep_every = CARRIER_SWEEP;
    while !inner.stop.load(Ordering::Acquire) {
        let carriers = inner.carriers.load(Ordering::Relaxed) > 0;
        if carriers && last_sweep.elapsed() >= sweep_every {
            last_sweep = Instant::now();
            sweep_every = if inner.sweep_carriers() {
                CARRIER_SWEEP
            } else {
                (sweep_every * 2).min(CARRIER_SWEEP_IDLE_MAX)
            };
        }
        let timeout = if carriers {
            sweep_every
                .saturating_sub(last_sweep.elapsed())
                .as_millis()
                .max(1) as i32
        } else {
            -1
        };
        let n = sys::epoll_wait(inner.epoll.as_fd(), &mut events, timeout);
        if n < 0 {
            if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                continue;
            }
            break;
        }
        if inner.stop.load(Ordering::Acquire) {
            break;
        }
        if n > 0 {
            // something changed: a link, the table, a kick; sweep soon
            sweep_every = CARRIER_SWEEP;
        }
        let mut ready = Vec::new();
        let mut owed = false;
        for ev in &events[..n as usize] {
            let token = ev.u64;
            if token == 0 {
                inner.sink.wake.drain();
            } else if token == KICK_TIMER_TOKEN {
                sys::read_counter(inner.kick_timer.as_fd());
                // Before scanning: a Close sent after this re-arms it.
                inner.kick_timer_armed.store(false, Ordering::Release);
                owed = true;
            } else {
                ready.push((token - 1) as DomId);
            }
        }
        let evs = std::mem::take(&mut *lock(&inner.sink.events));
        if evs.iter().any(|p| p == store::DOMID) {
            inner.check_domid();
        }
        if evs.iter().any(|p| inner.is_table_event(p)) {
            // Failures leave the watches as they were; the next table
            // event (or connect) tries again.
            let _ = inner.refresh_peers(&inner.state());
            inner.follow_table();
        }
        let mut st = inner.state();
        if evs.iter().any(|p| inner.is_gone_event(p)) {
            let vanished: Vec<DomId> = st.vanished.iter().copied().collect();
            for p in vanished {
                inner.end_dead_peer(&mut st, p);
            }
        }
        let mut peers: Vec<DomId> = evs.iter().filter_map(|p| inner.is_link_event(p)).collect();
        peers.sort_unstable();
        peers.dedup();
        for p in peers {
            inner.on_peer_node(&mut st, p);
        }
        let active = !ready.is_empty();
        for p in ready {
            inner.service_link(&mut st, p);
        }
        if owed {
            let peers: Vec<DomId> = st
                .links
                .iter()
                .filter(|(_, l)| l.kick_owed)
                .map(|(p, _)| *p)
                .collect();
            for p in peers {
                if let Some(link) = st.links.get_mut(&p) {
                    if inner.flush_link(link).is_err() {
                        inner.link_down(&mut st, p, true);
                    }
                }
            }
        }
        drop(st);
        if active {
            inner.spin_links();
        }
    }
}
