// SPDX-License-Identifier: GPL-2.0
//! The leg test trigger (setsockopt XENSOCK_TEST_OPEN_LEG), in the lab's
//! build only (cfg `afx_test_hooks`).

use super::*;

/// Test trigger (hostile_test=1, setsockopt XENSOCK_TEST_OPEN_LEG): open
/// this connection's outbound leg (the switch connects it and sends
/// `TcpHello{peer's conn id, cookie}`; the peer connects its own in turn);
/// `wrong_cookie` instead sends, on a separate socket, a hello whose cookie
/// differs in one bit (the peer must refuse and count it). Process context
/// (that connect blocks).
pub(crate) fn test_open_leg(
    xs: &Arc<XenSock>,
    wrong_cookie: bool,
) -> core::result::Result<(), i32> {
    use crate::sys::errno as e;
    let (st, peer_conn, t) = {
        let i = xs.inner.lock();
        (i.state, i.peer_conn, i.tcp)
    };
    if st != SockState::Connected || xs.inner.lock().link.is_none() {
        return Err(e::ENOTCONN);
    }
    let a = &t.peer.addr;
    if t.peer.port == 0 || a[..10].iter().any(|b| *b != 0) || a[10] != 0xff || a[11] != 0xff {
        return Err(e::ENETUNREACH);
    }
    if !wrong_cookie {
        return open_leg(xs);
    }
    let sock = TcpSock::connect([a[12], a[13], a[14], a[15]], t.peer.port)?;
    let mut b = [0u8; leg::HELLO_LEN];
    let n = Message::TcpHello {
        conn_id: peer_conn,
        cookie: t.cookie ^ 1,
    }
    .encode(&mut b)
    .map_err(|_| e::EINVAL)?;
    sock.send_all(&b[..n])?;
    leg::leg_out();
    Ok(())
}

/// Test trigger (XENSOCK_TEST_OPEN_LEG 1): connect this connection's
/// outbound leg now, without a switch.
fn open_leg(xs: &Arc<XenSock>) -> core::result::Result<(), i32> {
    let Some(sw) = sw_of(xs) else {
        return Err(e::EOPNOTSUPP);
    };
    {
        let mut t = sw.tx.lock();
        tx_activate(&mut t)?;
        t.want_leg = true;
    }
    {
        let mut r = sw.rx.lock();
        rx_activate(&mut r)?;
    }
    activate(xs, &sw);
    net::schedule();
    Ok(())
}
