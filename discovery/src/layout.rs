// SPDX-License-Identifier: MIT OR Apache-2.0
//! Where discovery keeps things in XenStore. Paths without a leading `/`
//! are relative to a domain's home, `/local/domain/<id>`.

use xensock_xenif::DomId;

/// The xensock protocol version guests advertise.
pub const PROTOCOL_VERSION: &str = "1";

/// The guest's advert directory (guest-owned, in its `data/` subtree).
pub const ADVERT: &str = "data/xensock";
/// Space-separated IP addresses of the guest.
pub const ADVERT_ADDRS: &str = "data/xensock/addrs";
/// The guest's xensock version.
pub const ADVERT_VERSION: &str = "data/xensock/version";

/// Below a guest's home: one directory per peer it has a link with,
/// `data/xensock/link/<peer>` (`docs/protocol.md` 6.1). The agent makes
/// them for co-resident pairs.
pub const LINK_DIR: &str = xensock_proto::link::LINK_DIR;

/// Dom0-owned, guest-readable xensock directory of a guest.
pub const XENSOCK: &str = "xensock";
/// The guest's tenant label, set by dom0 (`xensock/label`).
pub const LABEL: &str = "xensock/label";
/// Below [`XENSOCK`]: the peers table, one directory per peer domid.
pub const PEERS: &str = "peers";
/// Below [`XENSOCK`]: UUIDs of peers that left for another host.
pub const MOVED: &str = "moved";
/// Below [`XENSOCK`]: domids of peers released from this host without a
/// move marker (`gone/<domid>` = UUID): gone for good unless the guest
/// retracted its links first, as a guest being saved does. Removed when
/// the domid is in use again.
pub const GONE: &str = "gone";

/// Where the toolstack notes that a domain left for another host:
/// `/tool/xensock/moved/<uuid>` = destination host.
pub const TOOL_MOVED: &str = "/tool/xensock/moved";

/// Where dom0 marks a domain as moved to another host while it actually
/// stays on this one (`/tool/xensock/away/<uuid>` = destination host
/// label): the agent then separates it from its co-resident peers exactly
/// as if it had left, and brings it back when the node is removed. For
/// tests and drills of the migration switch without a second host.
pub const TOOL_AWAY: &str = "/tool/xensock/away";

/// `/local/domain/<domid>`.
pub fn home(domid: DomId) -> String {
    format!("/local/domain/{domid}")
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
