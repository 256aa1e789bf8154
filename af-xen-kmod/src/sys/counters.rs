// SPDX-License-Identifier: GPL-2.0
//! Resource counters of the module, for leak checks, and what
//! /proc/net/af_xen_stats shows of them.

use super::{grants_pended, grants_pending, map_failures, Seq};
use core::sync::atomic::{AtomicI64, Ordering};
/// pages of ours granted to another domain (grant not ended yet)
pub(crate) static GRANTS: AtomicI64 = AtomicI64::new(0);
/// foreign pages mapped
pub(crate) static MAPS: AtomicI64 = AtomicI64::new(0);
/// event-channel ports bound to an irq
pub(crate) static EVTCHNS: AtomicI64 = AtomicI64::new(0);
/// sockets (struct sock of ours with a XenSock)
pub(crate) static SOCKS: AtomicI64 = AtomicI64::new(0);
/// connections reset because the peer broke the ring protocol
pub(crate) static PROTO_RESETS: AtomicI64 = AtomicI64::new(0);
/// control frames a link's peer broke (dropped: undecodable, garbage
/// where a frame should start, or a corrupt control ring)
pub(crate) static LINK_FRAMES_BAD: AtomicI64 = AtomicI64::new(0);
/// links brought down (peer gone, restarted or unload)
pub(crate) static LINKS_DOWN: AtomicI64 = AtomicI64::new(0);
/// links whose peer domain dom0 said was gone for good while its
/// connections waited (they were reset at once)
pub(crate) static PEERS_DEAD: AtomicI64 = AtomicI64::new(0);
/// the longest pass of the TCP work item and of the link work item (ms)
pub(crate) static TCP_WORK_MAX_MS: AtomicI64 = AtomicI64::new(0);
pub(crate) static LINK_WORK_MAX_MS: AtomicI64 = AtomicI64::new(0);
/// data path cost (docs/design.md, "The lab benchmark"): event-channel
/// interrupts taken, sockets woken straight from them, work item runs
/// they scheduled, event-channel notifications sent for data rings
pub(crate) static IRQS: AtomicI64 = AtomicI64::new(0);
pub(crate) static IRQ_WAKES: AtomicI64 = AtomicI64::new(0);
pub(crate) static IRQ_WORK: AtomicI64 = AtomicI64::new(0);
pub(crate) static DATA_KICKS: AtomicI64 = AtomicI64::new(0);
/// waits that a short spin on the ring made unnecessary / that slept
pub(crate) static SPIN_HITS: AtomicI64 = AtomicI64::new(0);
pub(crate) static SLEEPS: AtomicI64 = AtomicI64::new(0);
/// where the time of the stream data path goes (ns, ktime; summed only
/// with the `time_data_path` module parameter on, calls always): sendmsg
/// and recvmsg calls and their time, the ring copies (and bytes)
/// inside them, their waits for the ring (busy-poll and sleep), the
/// data kicks (event-channel notify hypercalls) and the event-channel
/// interrupt handler; xlbench prints them per MiB
pub(crate) static SEND_CALLS: AtomicI64 = AtomicI64::new(0);
pub(crate) static SEND_NS: AtomicI64 = AtomicI64::new(0);
pub(crate) static RECV_CALLS: AtomicI64 = AtomicI64::new(0);
pub(crate) static RECV_NS: AtomicI64 = AtomicI64::new(0);
pub(crate) static TX_COPY_NS: AtomicI64 = AtomicI64::new(0);
pub(crate) static TX_COPY_BYTES: AtomicI64 = AtomicI64::new(0);
pub(crate) static RX_COPY_NS: AtomicI64 = AtomicI64::new(0);
pub(crate) static RX_COPY_BYTES: AtomicI64 = AtomicI64::new(0);
/// Pipe::write_msg/read_msg steps (ring lock, checks, copy, commit, kick)
pub(crate) static STEP_NS: AtomicI64 = AtomicI64::new(0);
pub(crate) static WAIT_NS: AtomicI64 = AtomicI64::new(0);
pub(crate) static KICK_NS: AtomicI64 = AtomicI64::new(0);
pub(crate) static IRQ_NS: AtomicI64 = AtomicI64::new(0);
/// closed connections whose receive ring stays granted until the
/// peer's Close or Reset (`link::Lent`)
pub(crate) static LINGERING: AtomicI64 = AtomicI64::new(0);
/// lingering rings ended by the bound, without the peer's Close or Reset
pub(crate) static LINGER_EXPIRED: AtomicI64 = AtomicI64::new(0);
pub(crate) fn add(c: &AtomicI64, n: i64) {
    c.fetch_add(n, Ordering::Relaxed);
}
pub(crate) fn get(c: &AtomicI64) -> i64 {
    c.load(Ordering::Relaxed)
}
/// Records a work item's pass of `ms` milliseconds in `max`.
pub(crate) fn note_work_ms(max: &AtomicI64, ms: u64) {
    let ms = i64::try_from(ms).unwrap_or(i64::MAX);
    if ms > max.fetch_max(ms, Ordering::Relaxed) && ms >= 1000 {
        kernel::pr_info!("a work item's pass took {} ms\n", ms);
    }
}

/// /proc/net/af_xen_stats: the floor's own counters (the layers above add
/// theirs through [`entry::EntryPoints::stats_show`]).
pub(crate) fn show_counters(seq: &mut Seq) {
    seq.counters(&[
        ("grants", get(&GRANTS)),
        ("maps", get(&MAPS)),
        ("evtchns", get(&EVTCHNS)),
        ("sockets", get(&SOCKS)),
        ("proto_resets", get(&PROTO_RESETS)),
        ("links_down", get(&LINKS_DOWN)),
        ("link_frames_bad", get(&LINK_FRAMES_BAD)),
        ("peers_dead", get(&PEERS_DEAD)),
        // grant entries whose peer still mapped them when we ended them,
        // kept until it unmaps (af_xen_xen.c, afx_end_one): now, and ever
        ("grants_pending", grants_pending()),
        ("grants_pended", grants_pended()),
        ("map_failures", map_failures()),
        ("lingering", get(&LINGERING)),
        ("linger_expired", get(&LINGER_EXPIRED)),
        ("irqs", get(&IRQS)),
        ("irq_wakes", get(&IRQ_WAKES)),
        ("irq_work", get(&IRQ_WORK)),
        ("data_kicks", get(&DATA_KICKS)),
        ("spin_hits", get(&SPIN_HITS)),
        ("sleeps", get(&SLEEPS)),
        ("send_calls", get(&SEND_CALLS)),
        ("send_ns", get(&SEND_NS)),
        ("recv_calls", get(&RECV_CALLS)),
        ("recv_ns", get(&RECV_NS)),
        ("tx_copy_ns", get(&TX_COPY_NS)),
        ("tx_copy_bytes", get(&TX_COPY_BYTES)),
        ("rx_copy_ns", get(&RX_COPY_NS)),
        ("rx_copy_bytes", get(&RX_COPY_BYTES)),
        ("step_ns", get(&STEP_NS)),
        ("wait_ns", get(&WAIT_NS)),
        ("kick_ns", get(&KICK_NS)),
        ("irq_ns", get(&IRQ_NS)),
    ]);
}
