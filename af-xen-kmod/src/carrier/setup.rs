// SPDX-License-Identifier: GPL-2.0
//! How a connection gets its carriers: the rings, and for a stream the
//! switch and its TCP legs' identity, that a connect, an accept and a
//! loopback connect make. The socket core asks for them here and stores
//! what it gets; it builds no ring, switch or leg itself.

use super::leg::{local_endpoint, new_cookie, ConnTcp};
use super::ring::{remote_rx_ring_capacity, rx_ring_capacity, Pipe};
use super::switch::Switch;
use super::{Link, XenSock};
use crate::proto::ctrl::{RingGrant, TcpEndpoint};
use crate::sys::Sk;
use kernel::sync::Arc;

/// What a connect over a link offers the peer: our receive ring, granted
/// to it, the grant its ConnectRequest names, and for a stream the switch
/// and the cookie of its TCP legs.
pub(crate) struct Offer {
    pub(crate) rx: Arc<Pipe>,
    pub(crate) grant: RingGrant,
    pub(crate) sw: Option<Arc<Switch>>,
    pub(crate) tcp: ConnTcp,
}

/// The carriers of a connect to `link`'s peer as connection `conn_id`,
/// for a socket whose buffers `sk` sets. A stream that cannot get its
/// switch (it could never follow its peer's moves) fails here, ENOMEM,
/// rather than connecting without one.
pub(crate) fn offer(
    sk: &Sk,
    link: &Arc<Link>,
    me: u32,
    conn_id: u32,
    stream: bool,
) -> core::result::Result<Offer, i32> {
    use crate::sys::errno::ENOMEM;
    let cap = remote_rx_ring_capacity(sk, stream);
    let (rx, grant) = Pipe::new_granted(link, me, conn_id, cap, 0).map_err(|_| ENOMEM)?;
    let sw = if stream {
        Some(Switch::new(cap).map_err(|_| ENOMEM)?)
    } else {
        None
    };
    let tcp = ConnTcp {
        cookie: new_cookie(),
        peer: TcpEndpoint::NONE,
    };
    Ok(Offer { rx, grant, sw, tcp })
}

/// Where this domain's TCP legs are reached, for a ConnectRequest or
/// ConnectAccept to announce.
pub(crate) fn leg_endpoint() -> TcpEndpoint {
    local_endpoint()
}

/// The TCP legs' identity of an accepted connection: the requester's
/// `cookie`, and where its legs are reached.
pub(crate) fn accepted_legs(cookie: u64, peer: TcpEndpoint) -> ConnTcp {
    ConnTcp { cookie, peer }
}

/// The peer's receive ring of a connection, named by its ConnectRequest or
/// ConnectAccept (`rg`), mapped and checked.
pub(crate) fn peer_ring(
    link: &Arc<Link>,
    me: u32,
    rg: &RingGrant,
    peer_conn: u32,
) -> core::result::Result<Arc<Pipe>, ()> {
    Pipe::new_mapped(link, me, rg, peer_conn, 0).map_err(|_| ())
}

/// Why an accept could not get its carriers.
pub(crate) enum NotAccepted {
    /// no memory or grants for our ring or the switch
    NoResources,
    /// the requester's ring could not be mapped or does not check
    BadRing,
}

/// What an accept over a link sets up: our receive ring and the grant
/// the ConnectAccept names, the requester's ring mapped, a stream's
/// switch.
pub(crate) struct Accepted {
    pub(crate) tx: Arc<Pipe>,
    pub(crate) rx: Arc<Pipe>,
    pub(crate) grant: RingGrant,
    pub(crate) sw: Option<Arc<Switch>>,
}

/// The carriers of an accepted connection `my_id` (the requester's
/// `peer_conn`, whose ring `rg` names), for the child whose buffers `sk`
/// sets. A stream that cannot get its switch is refused rather than
/// accepted without one.
pub(crate) fn accept(
    sk: &Sk,
    link: &Arc<Link>,
    me: u32,
    my_id: u32,
    rg: &RingGrant,
    peer_conn: u32,
    stream: bool,
) -> core::result::Result<Accepted, NotAccepted> {
    let cap = remote_rx_ring_capacity(sk, stream);
    let (rx, grant) =
        Pipe::new_granted(link, me, my_id, cap, 0).map_err(|_| NotAccepted::NoResources)?;
    let tx = peer_ring(link, me, rg, peer_conn).map_err(|_| NotAccepted::BadRing)?;
    let sw = if stream {
        Some(Switch::new(cap).map_err(|_| NotAccepted::NoResources)?)
    } else {
        None
    };
    Ok(Accepted { tx, rx, grant, sw })
}

/// The two rings of a loopback connection between `connector` and the
/// listener's `child` (on `port` of this domain `me`), in local memory,
/// each sized by its reader's SO_RCVBUF and knowing both ends: (the ring
/// the child reads, the ring the connector reads).
pub(crate) fn loopback(
    connector: &Arc<XenSock>,
    child: &Arc<XenSock>,
    me: u32,
    port: u32,
) -> core::result::Result<(Arc<Pipe>, Arc<Pipe>), i32> {
    use crate::sys::errno::ENOMEM;
    let to_child = Pipe::new_local(rx_ring_capacity(&child.sk), me, port).map_err(|_| ENOMEM)?;
    let to_connector =
        Pipe::new_local(rx_ring_capacity(&connector.sk), me, port).map_err(|_| ENOMEM)?;
    to_child.set_ends(Some(child.clone()), Some(connector.clone()));
    to_connector.set_ends(Some(connector.clone()), Some(child.clone()));
    Ok((to_child, to_connector))
}
