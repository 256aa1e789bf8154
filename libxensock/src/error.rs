// SPDX-License-Identifier: MIT OR Apache-2.0
//! Internal errors and their errno.

use std::io;

use xensock_discovery::xs::XsError;
use xensock_proto::layout::LayoutError;
use xensock_proto::ring::RingError;
use xensock_xenif::XenError;

/// What went wrong inside the transport. Public APIs turn it into an
/// `io::Error` carrying the errno a socket user expects ([`Error::errno`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A grant, mapping or event-channel operation failed.
    #[error("xen backend: {0}")]
    Xen(#[from] XenError),
    /// A XenStore operation failed.
    #[error("xenstore: {0}")]
    Xs(#[from] XsError),
    /// A peer's ring header or directory was refused.
    #[error("ring layout: {0}")]
    Layout(LayoutError),
    /// A peer broke the ring protocol.
    #[error("ring: {0}")]
    Ring(RingError),
    /// A peer broke the control protocol, or a backend misbehaved.
    #[error("protocol error: {0}")]
    Protocol(&'static str),
    /// An OS call failed.
    #[error("{0}")]
    Io(#[from] io::Error),
}

impl Error {
    /// The errno to report.
    pub fn errno(&self) -> i32 {
        match self {
            Error::Xen(e) => match e {
                XenError::Exhausted(_) => libc::ENOBUFS,
                XenError::Unavailable(_) => libc::ENODEV,
                other => other.errno(),
            },
            // xenstored did not answer within the reply bound
            Error::Xs(XsError::Unanswered { .. }) => libc::ETIMEDOUT,
            Error::Xs(_) => libc::EIO,
            Error::Layout(_) | Error::Ring(_) | Error::Protocol(_) => libc::EPROTO,
            Error::Io(e) => e.raw_os_error().unwrap_or(libc::EIO),
        }
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        match e {
            Error::Io(e) => e,
            other => io::Error::from_raw_os_error(other.errno()),
        }
    }
}

/// An `io::Error` for `errno`.
pub(crate) fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}
