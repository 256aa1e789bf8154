// SPDX-License-Identifier: MIT OR Apache-2.0
//! Every XenStore node xensock reads or writes, named once for the kernel
//! module, the user-space transport, the dom0 agent and the tools
//! (`docs/protocol.md` 6). Paths without a leading `/` are relative to a
//! domain's home, `/local/domain/<domid>`.
//!
//! ```text
//! /local/domain/<guest>/
//!   domid                         the guest's own domid (Xen's node)
//!   data/xensock/                 the guest's advert (guest-owned)
//!     addrs  version
//!     link/<peer>/                one half of a link (crate::link::node)
//!   xensock/                      dom0-owned, guest-readable
//!     label                       the guest's tenant label
//!     peers/<domid>/              the co-residency table
//!       uuid  addrs  version
//!     moved/<uuid>                peers that left for another host
//!     gone/<domid>                peers released for good (= UUID)
//! /tool/xensock/
//!   moved/<uuid>                  the toolstack's note of a move
//!   away/<uuid>                   dom0's drill: treat as moved
//! ```

use core::fmt;

/// Where every domain's home is (Xen's node).
pub const DOMAINS: &str = "/local/domain";

/// The absolute path of `rel` in `domid`'s home,
/// `/local/domain/<domid>/<rel>` (the home itself when `rel` is empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InHome<'a> {
    /// The domain whose home it is.
    pub domid: u32,
    /// The path below it, without a leading `/`.
    pub rel: &'a str,
}

impl fmt::Display for InHome<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.rel.is_empty() {
            write!(f, "{DOMAINS}/{}", self.domid)
        } else {
            write!(f, "{DOMAINS}/{}/{}", self.domid, self.rel)
        }
    }
}

/// A guest's own domid, relative to its home (Xen's node, written by the
/// toolstack; it changes when the guest is restored or migrated).
pub const DOMID: &str = "domid";

/// The xensock protocol version guests advertise.
pub const PROTOCOL_VERSION: &str = "1";

/// The guest's advert directory (guest-owned, in its `data/` subtree).
pub const ADVERT: &str = "data/xensock";
/// Space-separated IP addresses of the guest.
pub const ADVERT_ADDRS: &str = "data/xensock/addrs";
/// The guest's xensock version.
pub const ADVERT_VERSION: &str = "data/xensock/version";

/// One directory per peer a guest has a link with,
/// `data/xensock/link/<peer>`, holding [`crate::link::node`]s. dom0's
/// agent makes them for co-resident pairs.
pub const LINK_DIR: &str = "data/xensock/link";

/// Dom0-owned, guest-readable xensock directory of a guest.
pub const XENSOCK: &str = "xensock";
/// The guest's tenant label, set by dom0.
pub const LABEL: &str = "xensock/label";
/// Below [`XENSOCK`]: the co-residency table, one directory per
/// co-resident peer's domid, holding [`peer_node`]s.
pub const PEERS: &str = "peers";
/// [`PEERS`] relative to the guest's home.
pub const PEERS_DIR: &str = "xensock/peers";
/// Below [`XENSOCK`]: UUIDs of peers that left for another host.
pub const MOVED: &str = "moved";
/// Below [`XENSOCK`]: domids of peers released from this host without a
/// move marker (`gone/<domid>` = UUID): gone for good unless the guest
/// retracted its links first, as a guest being saved does. Removed when
/// the domid is in use again.
pub const GONE: &str = "gone";
/// [`GONE`] relative to the guest's home.
pub const GONE_DIR: &str = "xensock/gone";

/// The values of a peer's entry in [`PEERS`].
pub mod peer_node {
    /// The peer's UUID.
    pub const UUID: &str = "uuid";
    /// The peer's IP addresses, space-separated.
    pub const ADDRS: &str = "addrs";
    /// The peer's xensock version.
    pub const VERSION: &str = "version";
}

/// Where the toolstack notes that a domain left for another host:
/// `/tool/xensock/moved/<uuid>` = destination host.
pub const TOOL_MOVED: &str = "/tool/xensock/moved";

/// Where dom0 marks a domain as moved to another host while it actually
/// stays on this one (`/tool/xensock/away/<uuid>` = destination host
/// label): the agent then separates it from its co-resident peers exactly
/// as if it had left, and brings it back when the node is removed. For
/// tests and drills of the migration switch without a second host.
pub const TOOL_AWAY: &str = "/tool/xensock/away";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_home_path_is_absolute() {
        extern crate std;
        use std::string::ToString;
        let at = |domid, rel| InHome { domid, rel }.to_string();
        assert_eq!(at(3, ""), "/local/domain/3");
        assert_eq!(at(3, PEERS_DIR), "/local/domain/3/xensock/peers");
    }

    #[test]
    fn the_relative_spellings_agree() {
        fn below<'a>(dir: &'a str, parent: &str) -> Option<&'a str> {
            dir.strip_prefix(parent)?.strip_prefix('/')
        }
        assert_eq!(below(PEERS_DIR, XENSOCK), Some(PEERS));
        assert_eq!(below(GONE_DIR, XENSOCK), Some(GONE));
        assert_eq!(below(LINK_DIR, ADVERT), Some("link"));
        assert_eq!(below(ADVERT_ADDRS, ADVERT), Some("addrs"));
        assert_eq!(below(ADVERT_VERSION, ADVERT), Some("version"));
        assert_eq!(below(LABEL, XENSOCK), Some("label"));
    }
}
