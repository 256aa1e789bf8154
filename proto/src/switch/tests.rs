// SPDX-License-Identifier: MIT OR Apache-2.0
//! The switch machines' unit tests.

use super::*;

/// What both hosts do with an offer whose link died: abandon it (back
/// to TCP, with the `Consumed` that says so).
fn abandon(rx: &mut RxPath, epoch: Epoch) -> ConsumedNotice {
    assert_eq!(rx.state(), RxState::Offered { epoch });
    rx.freeze_local().expect("an offer out is answered")
}

#[test]
fn the_control_queue_keeps_arrival_order_and_refuses_a_flood() {
    let mut q = RxControlQueue::new();
    assert!(q.is_empty());
    assert_eq!(q.run_end(), None);
    for k in 0..RX_CONTROL_MAX as u64 {
        q.push(RxControl::RawFrom { offset: k }).unwrap();
    }
    assert!(q.push(RxControl::Fin { offset: 0 }).is_err());
    assert_eq!(q.len(), RX_CONTROL_MAX);
    q.pop();
    assert_eq!(q.front(), Some(RxControl::RawFrom { offset: 1 }));
    // wraps around the array
    q.push(RxControl::RingFrom {
        epoch: 1,
        offset: 9,
    })
    .unwrap();
    assert_eq!(q.run_end(), Some(9));
    for _ in 0..RX_CONTROL_MAX - 1 {
        q.pop();
    }
    assert_eq!(
        q.front(),
        Some(RxControl::RingFrom {
            epoch: 1,
            offset: 9
        })
    );
    q.pop();
    assert!(q.is_empty());
    q.pop();
    assert_eq!(q.front(), None);
}

#[test]
fn a_run_ends_at_its_ring_from_once_its_bytes_are_read() {
    let mut path = RxPath::on_tcp();
    let mut order = RxControlOrder::new();
    assert_eq!(
        order.take(&mut path, RxControl::RawFrom { offset: 0 }),
        Ok(Some(RxControlTaken::Run))
    );
    assert!(order.run_open());
    let epoch = path.offer_ring().unwrap();
    let ring_from = RxControl::RingFrom { epoch, offset: 10 };
    // the bytes before it are not read yet: it waits
    assert_eq!(order.take(&mut path, ring_from), Ok(None));
    path.on_data(0, 10).unwrap();
    assert_eq!(
        order.take(&mut path, ring_from),
        Ok(Some(RxControlTaken::RingFrom {
            epoch,
            offset: 10,
            outcome: RingFromOutcome::Switch
        }))
    );
    assert!(!order.run_open());
    assert!(path.reads_ring());
    // on the ring, a Fin waits for the ring's bytes
    assert_eq!(
        order.take(&mut path, RxControl::Fin { offset: 12 }),
        Ok(None)
    );
}

#[test]
fn control_frames_out_of_order_are_refused() {
    let mut path = RxPath::on_tcp();
    let mut order = RxControlOrder::new();
    assert_eq!(
        order.take(
            &mut path,
            RxControl::RingFrom {
                epoch: 1,
                offset: 0
            },
        ),
        Err(RxControlError::RingFromWithoutRun)
    );
    // a run must start where the reader stands
    assert!(matches!(
        order.take(&mut path, RxControl::RawFrom { offset: 5 }),
        Err(RxControlError::Switch(SwitchError::BadOffset {
            got: 5,
            ..
        }))
    ));
    order
        .take(&mut path, RxControl::RawFrom { offset: 0 })
        .unwrap();
    assert_eq!(
        order.take(&mut path, RxControl::RawFrom { offset: 0 }),
        Err(RxControlError::RawFromInsideRun)
    );
}

/// A run read on past its end at 8 (to 20): its RingFrom named an
/// offer that was taken back, so the reader kept reading TCP.
fn read_past_an_abandoned_run() -> (RxPath, RxControlOrder) {
    let mut path = RxPath::on_tcp();
    let mut order = RxControlOrder::new();
    order
        .take(&mut path, RxControl::RawFrom { offset: 0 })
        .unwrap();
    let epoch = path.offer_ring().unwrap();
    abandon(&mut path, epoch);
    path.on_data(0, 20).unwrap();
    assert_eq!(
        order.take(&mut path, RxControl::RingFrom { epoch, offset: 8 }),
        Ok(Some(RxControlTaken::RingFrom {
            epoch,
            offset: 8,
            outcome: RingFromOutcome::Ignore
        }))
    );
    assert_eq!(order.join_at(), Some(8));
    (path, order)
}

#[test]
fn after_reading_past_an_abandoned_run_the_next_run_joins_at_its_end() {
    let (mut path, mut order) = read_past_an_abandoned_run();
    assert_eq!(
        order.take(&mut path, RxControl::RawFrom { offset: 9 }),
        Err(RxControlError::RunNotFromRunEnd { end: 8, offset: 9 })
    );
    let (mut path, mut order) = read_past_an_abandoned_run();
    assert_eq!(
        order.take(&mut path, RxControl::RawFrom { offset: 8 }),
        Ok(Some(RxControlTaken::Run))
    );
    assert_eq!(order.join_at(), None);
    assert!(order.run_open());
}

/// The receiver abandons its offer (the link died) after the sender
/// took it and wrote into it; the sender then freezes that ring. The
/// receiver must answer the freeze too (its own `Consumed` may come
/// later), or the sender stays frozen for good.
#[test]
fn an_abandoned_offer_the_sender_took_is_answered_when_it_freezes() {
    let mut tx = TxPath::on_ring();
    let mut rx = RxPath::on_ring();
    tx.record_sent(100).unwrap();
    rx.record_ring_taken(100).unwrap();
    // both to TCP
    let f = tx.freeze(0).unwrap();
    let c = rx.on_tx_freeze(f.epoch, Some(f.offset)).unwrap().unwrap();
    assert!(matches!(
        tx.on_consumed(c.epoch, c.offset).unwrap(),
        ConsumedOutcome::Resend(_)
    ));
    tx.record_sent(50).unwrap();
    rx.on_data(100, 50).unwrap();
    // a new ring offered; the sender takes it and writes 30 bytes
    let epoch = rx.offer_ring().unwrap();
    let from = tx.on_ring_offer(epoch).unwrap().unwrap();
    assert_eq!(from, 150);
    tx.record_sent(30).unwrap();
    // the link dies: the receiver abandons, the sender freezes
    let own = abandon(&mut rx, epoch);
    assert_eq!(own, ConsumedNotice { epoch, offset: 150 });
    assert_eq!(
        rx.on_ring_from(epoch, from).unwrap(),
        RingFromOutcome::Ignore
    );
    let f = tx.freeze(30).unwrap();
    assert_eq!(f.epoch, epoch);
    let c = rx
        .on_tx_freeze(f.epoch, Some(f.offset))
        .unwrap()
        .expect("a Consumed for the abandoned ring");
    assert_eq!(c, ConsumedNotice { epoch, offset: 150 });
    match tx.on_consumed(c.epoch, c.offset).unwrap() {
        ConsumedOutcome::Resend(r) => assert_eq!((r.from, r.len), (150, 30)),
        other => panic!("{other:?}"),
    }
    // a repeat is answered too, and the sender ignores it, as it
    // ignores the receiver's own Consumed coming after
    let again = rx.on_tx_freeze(f.epoch, Some(f.offset)).unwrap().unwrap();
    for late in [again, own] {
        assert_eq!(
            tx.on_consumed(late.epoch, late.offset).unwrap(),
            ConsumedOutcome::Ignore
        );
    }
}

/// Two offers abandoned before the sender's freeze of the first one
/// came: its freeze is answered (the simulation's seed 105367).
#[test]
fn every_abandoned_ring_the_sender_froze_is_answered() {
    let mut tx = TxPath::on_tcp();
    let mut rx = RxPath::on_tcp();
    let first = rx.offer_ring().unwrap();
    let from = tx.on_ring_offer(first).unwrap().unwrap();
    tx.record_sent(10).unwrap();
    let own_first = abandon(&mut rx, first);
    let second = rx.offer_ring().unwrap();
    let own_second = abandon(&mut rx, second);
    let third = rx.offer_ring().unwrap();
    let f = tx.freeze(10).unwrap();
    assert_eq!(f.epoch, first);
    let c = rx.on_tx_freeze(f.epoch, Some(f.offset)).unwrap().unwrap();
    assert_eq!(
        c,
        ConsumedNotice {
            epoch: first,
            offset: from
        }
    );
    match tx.on_consumed(c.epoch, c.offset).unwrap() {
        ConsumedOutcome::Resend(r) => assert_eq!((r.from, r.len), (0, 10)),
        other => panic!("{other:?}"),
    }
    // the receiver's own Consumed coming after change nothing
    for late in [own_first, own_second] {
        assert_eq!(
            tx.on_consumed(late.epoch, late.offset).unwrap(),
            ConsumedOutcome::Ignore
        );
    }
    // the offer out stands
    assert_eq!(rx.state(), RxState::Offered { epoch: third });
}

/// A freeze of an older ring that crosses our offer leaves the offer
/// standing: the sender takes it and no new ring is needed.
#[test]
fn a_salvaged_ring_needs_no_resend_from_a_peer_without_its_copy() {
    // the sender wrote 300 bytes, the receiver took 100; the sender
    // vanished (saved without freezing) and comes back without the
    // ring it mapped: its freeze knows nothing unconsumed
    let mut tx = TxPath::on_ring();
    let mut rx = RxPath::on_ring();
    tx.record_sent(300).unwrap();
    rx.record_ring_taken(100).unwrap();
    let c = rx.freeze_salvaged(200).unwrap();
    assert_eq!((c.epoch, c.offset), (0, 300));
    assert_eq!(rx.state(), RxState::Tcp);
    assert_eq!(rx.taken(), 300);
    tx.freeze(0).unwrap();
    match tx.on_consumed(c.epoch, c.offset).unwrap() {
        ConsumedOutcome::Resend(r) => assert_eq!((r.from, r.skip, r.len), (300, 0, 0)),
        other => panic!("{other:?}"),
    }
    // TCP goes on from there
    rx.on_data(300, 5).unwrap();
}

#[test]
fn a_receiver_that_kept_less_than_a_copyless_sender_wrote_is_refused() {
    // the receiver kept only what it took (it did not salvage): the
    // sender without a copy cannot resend the rest, and says so
    let mut tx = TxPath::on_ring();
    let mut rx = RxPath::on_ring();
    tx.record_sent(300).unwrap();
    rx.record_ring_taken(100).unwrap();
    let c = rx.freeze_local().unwrap();
    tx.freeze(0).unwrap();
    assert!(matches!(
        tx.on_consumed(c.epoch, c.offset),
        Err(SwitchError::BadOffset { got: 100, .. })
    ));
}

#[test]
fn salvaging_off_a_ring_is_a_plain_freeze() {
    let mut rx = RxPath::on_tcp();
    assert_eq!(rx.freeze_salvaged(7), None);
    assert_eq!(rx.taken(), 0);
    let epoch = rx.offer_ring().unwrap();
    let c = rx.freeze_salvaged(7).unwrap();
    assert_eq!((c.epoch, c.offset), (epoch, 0));
    assert_eq!(rx.taken(), 0);
}

#[test]
fn an_offer_outstanding_when_an_older_freeze_arrives_is_taken() {
    let mut tx = TxPath::on_ring();
    let mut rx = RxPath::on_ring();
    tx.record_sent(166).unwrap();
    rx.record_ring_taken(4).unwrap();
    // both leave ring 0 on their own (the link went): the receiver
    // says what it consumed, the sender says it froze
    let c = rx.freeze_local().unwrap();
    let f = tx.freeze(162).unwrap();
    match tx.on_consumed(c.epoch, c.offset).unwrap() {
        ConsumedOutcome::Resend(r) => assert_eq!((r.from, r.len), (4, 162)),
        other => panic!("{other:?}"),
    }
    rx.on_data(4, 162).unwrap();
    // the new link: the receiver offers ring 1 and the sender takes it
    // before the receiver has read the sender's freeze of ring 0
    let epoch = rx.offer_ring().unwrap();
    let from = tx.on_ring_offer(epoch).unwrap().unwrap();
    // the older freeze is answered (the sender ignores it) and voids
    // nothing
    let again = rx.on_tx_freeze(f.epoch, Some(f.offset)).unwrap().unwrap();
    assert_eq!(
        tx.on_consumed(again.epoch, again.offset).unwrap(),
        ConsumedOutcome::Ignore
    );
    assert_eq!(rx.state(), RxState::Offered { epoch });
    assert_eq!(
        rx.on_ring_from(epoch, from).unwrap(),
        RingFromOutcome::Switch
    );
    assert_eq!(rx.state(), RxState::Ring { epoch, start: 166 });
}

/// An abandoned ring the sender took is answered when it freezes, also
/// when a newer offer is out by then.
#[test]
fn an_abandoned_ring_is_answered_while_a_newer_offer_is_out() {
    let mut tx = TxPath::on_tcp();
    let mut rx = RxPath::on_tcp();
    let first = rx.offer_ring().unwrap();
    let from = tx.on_ring_offer(first).unwrap().unwrap();
    tx.record_sent(30).unwrap();
    abandon(&mut rx, first);
    let second = rx.offer_ring().unwrap();
    assert_eq!(
        rx.on_ring_from(first, from).unwrap(),
        RingFromOutcome::Ignore
    );
    let f = tx.freeze(30).unwrap();
    let c = rx
        .on_tx_freeze(f.epoch, Some(f.offset))
        .unwrap()
        .expect("a Consumed for the abandoned ring");
    assert_eq!(
        c,
        ConsumedNotice {
            epoch: first,
            offset: 0
        }
    );
    match tx.on_consumed(c.epoch, c.offset).unwrap() {
        ConsumedOutcome::Resend(r) => assert_eq!((r.from, r.len), (0, 30)),
        other => panic!("{other:?}"),
    }
    // the newer offer still stands, and the sender can take it
    assert_eq!(rx.state(), RxState::Offered { epoch: second });
    let from = tx.on_ring_offer(second).unwrap().unwrap();
    rx.on_data(0, 30).unwrap();
    assert_eq!(
        rx.on_ring_from(second, from).unwrap(),
        RingFromOutcome::Switch
    );
}

#[test]
fn sender_moves_receiver_keeps_what_it_took() {
    let mut tx = TxPath::on_ring();
    let mut rx = RxPath::on_ring();
    tx.record_sent(100).unwrap();
    rx.record_ring_taken(40).unwrap();
    // Sender froze with 60 unconsumed bytes copied back.
    let notice = tx.freeze(60).unwrap();
    assert_eq!(
        notice,
        TxFreezeNotice {
            epoch: 0,
            offset: 100
        }
    );
    assert!(!tx.writable());
    // Receiver stayed: it keeps the 40 it took, the sender resends 60.
    let c = rx.on_tx_freeze(0, Some(100)).unwrap().unwrap();
    assert_eq!(
        c,
        ConsumedNotice {
            epoch: 0,
            offset: 40
        }
    );
    assert_eq!(rx.state(), RxState::Tcp);
    assert!(rx.record_ring_taken(1).is_err());
    let out = tx.on_consumed(c.epoch, c.offset).unwrap();
    assert_eq!(
        out,
        ConsumedOutcome::Resend(Resend {
            from: 40,
            skip: 0,
            len: 60
        })
    );
}

#[test]
fn receiver_moves_sender_resends() {
    let mut tx = TxPath::on_ring();
    let mut rx = RxPath::on_ring();
    tx.record_sent(100).unwrap();
    rx.record_ring_taken(40).unwrap();
    let c = rx.freeze_local().unwrap();
    assert_eq!(c.offset, 40);
    assert_eq!(tx.on_consumed(0, 40).unwrap(), ConsumedOutcome::FreezeFirst);
    tx.freeze(60).unwrap();
    assert_eq!(
        tx.on_consumed(0, 40).unwrap(),
        ConsumedOutcome::Resend(Resend {
            from: 40,
            skip: 0,
            len: 60
        })
    );
    rx.on_data(40, 60).unwrap();
    assert_eq!(rx.taken(), 100);
    // A duplicate or a gap is refused.
    assert!(rx.on_data(40, 1).is_err());
    assert!(rx.on_data(101, 1).is_err());
}

#[test]
fn upgrade_and_abandoned_offer() {
    let mut tx = TxPath::on_tcp();
    let mut rx = RxPath::on_tcp();
    tx.record_sent(10).unwrap();
    rx.on_data(0, 10).unwrap();
    let e = rx.offer_ring().unwrap();
    assert_eq!(e, 1);
    let m = tx.on_ring_offer(e).unwrap().unwrap();
    assert_eq!(m, 10);
    assert_eq!(rx.on_ring_from(e, m).unwrap(), RingFromOutcome::Switch);
    assert_eq!(
        Connection {
            tx: tx.clone(),
            rx: rx.clone()
        }
        .phase(),
        Phase::Ring
    );

    // Offer lost in a move: the sender's TxFreeze leaves it standing,
    // the link's loss (the peer moved) abandons it.
    let mut tx = TxPath::on_tcp();
    let mut rx = RxPath::on_tcp();
    let e = rx.offer_ring().unwrap();
    let notice = tx.freeze(0).unwrap();
    let again = rx
        .on_tx_freeze(notice.epoch, Some(notice.offset))
        .unwrap()
        .unwrap();
    assert_eq!(
        tx.on_consumed(again.epoch, again.offset).unwrap(),
        ConsumedOutcome::Ignore
    );
    let c = rx.freeze_local().unwrap();
    assert_eq!(c.epoch, e);
    assert_eq!(
        tx.on_consumed(c.epoch, c.offset).unwrap(),
        ConsumedOutcome::Ignore
    );
    // The stale offer arriving late is declined.
    assert_eq!(tx.on_ring_offer(e).unwrap(), None);
}

#[test]
fn offer_overtaking_its_consumed_waits() {
    let mut tx = TxPath::on_ring();
    let mut rx = RxPath::on_ring();
    tx.record_sent(10).unwrap();
    rx.record_ring_taken(4).unwrap();
    // The receiver moves and at once offers a new ring.
    let c = rx.freeze_local().unwrap();
    let e = rx.offer_ring().unwrap();
    // The offer reaches the sender before the Consumed.
    assert!(tx.offer_waits_for_consumed(e));
    assert!(tx.on_ring_offer(e).is_err());
    assert!(!tx.offer_waits_for_consumed(0), "stale offers never wait");
    assert_eq!(
        tx.on_consumed(c.epoch, c.offset).unwrap(),
        ConsumedOutcome::FreezeFirst
    );
    tx.freeze(6).unwrap();
    assert!(tx.offer_waits_for_consumed(e), "still frozen on ring 0");
    assert!(matches!(
        tx.on_consumed(c.epoch, c.offset).unwrap(),
        ConsumedOutcome::Resend(_)
    ));
    // Now on TCP: the kept offer is handed in and taken.
    assert!(!tx.offer_waits_for_consumed(e));
    assert_eq!(tx.on_ring_offer(e).unwrap(), Some(10));
    rx.on_data(4, 6).unwrap();
    assert_eq!(rx.on_ring_from(e, 10).unwrap(), RingFromOutcome::Switch);
}

#[test]
fn hostile_offsets_are_errors() {
    let mut tx = TxPath::on_ring();
    tx.record_sent(10).unwrap();
    assert!(tx.freeze(11).is_err());
    tx.freeze(5).unwrap();
    assert!(tx.on_consumed(0, 11).is_err());
    assert!(tx.on_consumed(0, 4).is_err());
    let mut rx = RxPath::on_ring();
    rx.record_ring_taken(3).unwrap();
    // a sender that says it sent less than we took
    assert!(rx.on_tx_freeze(0, Some(2)).is_err());
    assert!(rx.on_tx_freeze(7, Some(5)).is_err());
}
