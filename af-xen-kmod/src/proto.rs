// SPDX-License-Identifier: GPL-2.0
//! proto's sources (`xensock-proto`), compiled into this crate since Kbuild
//! has no cargo: the wire format, ring layout, the link handshake's layout
//! and the pure decisions both hosts share. Nothing here is re-implemented by the module.

#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/control_stream.rs"]
pub(crate) mod control_stream;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/ctrl.rs"]
pub(crate) mod ctrl;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/dial.rs"]
pub(crate) mod dial;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/layout.rs"]
pub(crate) mod layout;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/leg.rs"]
pub(crate) mod leg;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/link.rs"]
pub(crate) mod link;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/link_half.rs"]
pub(crate) mod link_half;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/liveness.rs"]
pub(crate) mod liveness;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[allow(unsafe_code)] // proto's floor: the ring over raw shared memory
#[path = "../../proto/src/mem.rs"]
pub(crate) mod mem;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/offer.rs"]
pub(crate) mod offer;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/record.rs"]
pub(crate) mod record;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/ring.rs"]
pub(crate) mod ring;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/store.rs"]
pub(crate) mod store;
#[allow(dead_code, unreachable_pub, missing_docs, clippy::all)]
#[path = "../../proto/src/switch.rs"]
pub(crate) mod switch;
