// SPDX-License-Identifier: MIT OR Apache-2.0
//! The control protocol between a domain's processes and the sim host, over
//! `<dir>/dom<id>/control.sock` (`SOCK_SEQPACKET`, one message per packet).
//!
//! Request: `u32 req_id` (non-zero), `u8 op`, arguments. Reply: the same
//! `req_id`, `u8 status`; on success (0) the connection's `u32` revocation
//! generation then the results, on failure (an [`ErrCode`]) a UTF-8
//! message. Descriptors (memfds, eventfds) travel with the reply as
//! `SCM_RIGHTS`. The host may push a message with `req_id` 0: `u8 kind`
//! ([`PUSH_REVOKED`]), a `u32` new domid (or `u32::MAX`: connection closes)
//! and the new `u32` generation.
//!
//! All integers are little-endian. Decoding never panics: short or
//! malformed messages are errors.

use xensock_xenif::XenError;

pub(crate) const OP_WHOAMI: u8 = 1;
pub(crate) const OP_GRANT: u8 = 2;
pub(crate) const OP_UNGRANT: u8 = 3;
pub(crate) const OP_GRANT_NOTIFY: u8 = 4;
pub(crate) const OP_MAP: u8 = 5;
pub(crate) const OP_UNMAP: u8 = 6;
pub(crate) const OP_MAP_NOTIFY: u8 = 7;
pub(crate) const OP_EVTCHN_UNBOUND: u8 = 8;
pub(crate) const OP_EVTCHN_BIND: u8 = 9;
pub(crate) const OP_EVTCHN_CLOSE: u8 = 10;
pub(crate) const OP_EVTCHN_STATUS: u8 = 11;

/// Pushed when this connection's domain was destroyed, migrated or moved
/// away: every grant, mapping and channel of the connection is gone.
pub(crate) const PUSH_REVOKED: u8 = 1;

/// Notification flags.
pub(crate) const NOTIFY_CLEAR: u8 = 1;
pub(crate) const NOTIFY_EVENT: u8 = 2;

/// Port states in OP_EVTCHN_STATUS replies.
pub(crate) const PORT_UNBOUND: u8 = 0;
pub(crate) const PORT_CONNECTED: u8 = 1;
pub(crate) const PORT_CLOSED: u8 = 2;

/// Error codes in replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum ErrCode {
    PermissionDenied = 1,
    Invalid = 2,
    NotFound = 3,
    Exhausted = 4,
    Revoked = 5,
    Other = 6,
}

pub(crate) fn err_code(e: &XenError) -> ErrCode {
    match e {
        XenError::PermissionDenied(_) => ErrCode::PermissionDenied,
        XenError::Invalid(_) => ErrCode::Invalid,
        XenError::NotFound(_) => ErrCode::NotFound,
        XenError::Exhausted(_) => ErrCode::Exhausted,
        XenError::Revoked => ErrCode::Revoked,
        // (a failure the wire has no code for travels as Other)
        _ => ErrCode::Other,
    }
}

pub(crate) fn err_from(code: u8, msg: String) -> XenError {
    match code {
        1 => XenError::PermissionDenied(msg),
        2 => XenError::Invalid(msg),
        3 => XenError::NotFound(msg),
        4 => XenError::Exhausted(msg),
        5 => XenError::Revoked,
        _ => XenError::Os {
            op: "sim host",
            source: std::io::Error::other(msg),
        },
    }
}

/// Message builder.
#[derive(Default)]
pub(crate) struct Enc(pub Vec<u8>);

impl Enc {
    pub(crate) fn new() -> Enc {
        Enc(Vec::new())
    }
    pub(crate) fn u8(mut self, v: u8) -> Enc {
        self.0.push(v);
        self
    }
    pub(crate) fn u16(mut self, v: u16) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u32(mut self, v: u32) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn u64(mut self, v: u64) -> Enc {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn bytes(mut self, v: &[u8]) -> Enc {
        self.0.extend_from_slice(v);
        self
    }
}

/// Message reader.
pub(crate) struct Dec<'a>(pub &'a [u8]);

/// A message was too short or malformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Short;

impl<'a> Dec<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Short> {
        if self.0.len() < n {
            return Err(Short);
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    pub(crate) fn u8(&mut self) -> Result<u8, Short> {
        Ok(self.take(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16, Short> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    pub(crate) fn u32(&mut self) -> Result<u32, Short> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub(crate) fn u64(&mut self) -> Result<u64, Short> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.0)
    }
    /// A count-prefixed list of u32, bounded by `max` entries.
    pub(crate) fn u32_list(&mut self, max: usize) -> Result<Vec<u32>, Short> {
        let n = self.u32()? as usize;
        if n > max || n * 4 > self.0.len() {
            return Err(Short);
        }
        (0..n).map(|_| self.u32()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_short_input() {
        let m = Enc::new().u8(1).u16(2).u32(3).u64(4).u32(2).u32(7).u32(8).0;
        let mut d = Dec(&m);
        assert_eq!(d.u8(), Ok(1));
        assert_eq!(d.u16(), Ok(2));
        assert_eq!(d.u32(), Ok(3));
        assert_eq!(d.u64(), Ok(4));
        assert_eq!(d.u32_list(10), Ok(vec![7, 8]));
        assert_eq!(d.u8(), Err(Short));
        let huge = Enc::new().u32(u32::MAX).0;
        assert_eq!(Dec(&huge).u32_list(1 << 20), Err(Short));
    }

    #[test]
    fn error_codes_round_trip() {
        for e in [
            XenError::PermissionDenied("x".into()),
            XenError::Invalid("x".into()),
            XenError::NotFound("x".into()),
            XenError::Exhausted("x".into()),
            XenError::Revoked,
        ] {
            let code = err_code(&e) as u8;
            assert_eq!(err_code(&err_from(code, "x".into())), err_code(&e));
        }
    }
}
