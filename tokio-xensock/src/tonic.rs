// SPDX-License-Identifier: MIT OR Apache-2.0
//! tonic's [`Connected`] for [`XenStream`] (feature `tonic`): a gRPC
//! server fed xensock connections (`Server::serve_with_incoming`) gives
//! its handlers the caller's address in the request's extensions, as
//! `TcpConnectInfo` does for TCP.

use tonic::transport::server::Connected;

use crate::{SockAddrXen, XenStream};

/// What a tonic handler can learn about a xensock caller:
/// `request.extensions().get::<XenConnectInfo>()`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct XenConnectInfo {
    /// The server's end (domain id and port), if still known.
    pub local: Option<SockAddrXen>,
    /// The caller's end, if still known.
    pub peer: Option<SockAddrXen>,
}

impl Connected for XenStream {
    type ConnectInfo = XenConnectInfo;

    fn connect_info(&self) -> XenConnectInfo {
        XenConnectInfo {
            local: self.local_addr().ok(),
            peer: self.peer_addr().ok(),
        }
    }
}
