// SPDX-License-Identifier: MIT OR Apache-2.0
//! Where discovery keeps things in XenStore: proto's node names
//! ([`xensock_proto::store`]) and helpers over them. Paths without a
//! leading `/` are relative to a domain's home, `/local/domain/<id>`.

use xensock_xenif::DomId;

pub use xensock_proto::store::{
    peer_node, ADVERT, ADVERT_ADDRS, ADVERT_VERSION, DOMAINS, DOMID, GONE, LABEL, LINK_DIR, MOVED,
    PEERS, PROTOCOL_VERSION, TOOL_AWAY, TOOL_MOVED, XENSOCK,
};

/// `/local/domain/<domid>`.
pub fn home(domid: DomId) -> String {
    xensock_proto::store::InHome {
        domid: u32::from(domid),
        rel: "",
    }
    .to_string()
}

/// Whether `s` looks like a UUID (8-4-4-4-12 hex digits).
pub fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}
