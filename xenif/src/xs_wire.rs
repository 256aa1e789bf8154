// SPDX-License-Identifier: MIT OR Apache-2.0
//! The XenStore wire format (Xen's public `io/xs_wire.h`), written from the
//! header's documented layout.
//!
//! Every message, in both directions, is a 16-byte header followed by
//! `len` payload bytes:
//!
//! ```text
//! u32 type    one of MsgType
//! u32 req_id  echoed in the reply; chosen by the client
//! u32 tx_id   transaction id, 0 outside a transaction
//! u32 len     payload length, at most PAYLOAD_MAX
//! ```
//!
//! Fields are in the host's byte order (xenstored and its clients always run
//! on the same machine). Payloads are sequences of NUL-terminated strings,
//! except the value of `WRITE` and the reply to `READ`, which are raw bytes.
//! Errors come back as type `ERROR` with an errno *name* such as `"ENOENT\0"`.
//!
//! ```
//! use xensock_xenif::xs_wire::{Header, MsgType, encode_message};
//! let bytes = encode_message(MsgType::Read, 7, 0, b"/local/domain/0/name\0").unwrap();
//! let hdr = Header::decode(bytes[..16].try_into().unwrap());
//! assert_eq!(hdr.msg_type(), Some(MsgType::Read));
//! assert_eq!(hdr.req_id, 7);
//! assert_eq!(hdr.len as usize, bytes.len() - 16);
//! ```

use std::fmt;

/// Size of the message header in bytes.
pub const HEADER_LEN: usize = 16;
/// Largest payload either side may send (`XENSTORE_PAYLOAD_MAX`).
pub const PAYLOAD_MAX: usize = 4096;
/// Longest absolute path (`XENSTORE_ABS_PATH_MAX`).
pub const ABS_PATH_MAX: usize = 3072;
/// Longest path relative to a domain's home (`XENSTORE_REL_PATH_MAX`).
pub const REL_PATH_MAX: usize = 2048;

/// Message types of `enum xsd_sockmsg_type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum MsgType {
    /// `XS_CONTROL` (formerly `XS_DEBUG`): privileged daemon control.
    Control = 0,
    /// `XS_DIRECTORY`: list the children of a node.
    Directory = 1,
    /// `XS_READ`: read a node's value.
    Read = 2,
    /// `XS_GET_PERMS`: read a node's permissions.
    GetPerms = 3,
    /// `XS_WATCH`: register a watch (path, token).
    Watch = 4,
    /// `XS_UNWATCH`: remove a watch (path, token).
    Unwatch = 5,
    /// `XS_TRANSACTION_START`.
    TransactionStart = 6,
    /// `XS_TRANSACTION_END` with `"T"` (commit) or `"F"` (abort).
    TransactionEnd = 7,
    /// `XS_INTRODUCE`: privileged, toolstack introduces a domain.
    Introduce = 8,
    /// `XS_RELEASE`: privileged, toolstack releases a domain.
    Release = 9,
    /// `XS_GET_DOMAIN_PATH`: `/local/domain/<id>` for a domid.
    GetDomainPath = 10,
    /// `XS_WRITE`: path, then the raw value.
    Write = 11,
    /// `XS_MKDIR`.
    Mkdir = 12,
    /// `XS_RM`: remove a node and its subtree.
    Rm = 13,
    /// `XS_SET_PERMS`: path, then permission strings.
    SetPerms = 14,
    /// `XS_WATCH_EVENT`: asynchronous event (path, token), req_id 0.
    WatchEvent = 15,
    /// `XS_ERROR`: error reply carrying an errno name.
    Error = 16,
    /// `XS_IS_DOMAIN_INTRODUCED`: privileged.
    IsDomainIntroduced = 17,
    /// `XS_RESUME`: privileged.
    Resume = 18,
    /// `XS_SET_TARGET`: privileged.
    SetTarget = 19,
    /// `XS_RESET_WATCHES`: drop all watches (and transactions) of the connection.
    ResetWatches = 21,
    /// `XS_DIRECTORY_PART`: list children in chunks, with the node generation.
    DirectoryPart = 22,
}

impl MsgType {
    /// Every defined message type.
    pub const ALL: [MsgType; 22] = [
        MsgType::Control,
        MsgType::Directory,
        MsgType::Read,
        MsgType::GetPerms,
        MsgType::Watch,
        MsgType::Unwatch,
        MsgType::TransactionStart,
        MsgType::TransactionEnd,
        MsgType::Introduce,
        MsgType::Release,
        MsgType::GetDomainPath,
        MsgType::Write,
        MsgType::Mkdir,
        MsgType::Rm,
        MsgType::SetPerms,
        MsgType::WatchEvent,
        MsgType::Error,
        MsgType::IsDomainIntroduced,
        MsgType::Resume,
        MsgType::SetTarget,
        MsgType::ResetWatches,
        MsgType::DirectoryPart,
    ];

    /// The type for a raw header value, if it is a defined one.
    pub fn from_u32(v: u32) -> Option<MsgType> {
        MsgType::ALL.iter().copied().find(|t| *t as u32 == v)
    }

    /// The raw header value.
    pub fn as_u32(self) -> u32 {
        self as u32
    }
}

/// The `struct xsd_sockmsg` header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Header {
    /// Raw message type (may be undefined when received from a peer).
    pub msg_type: u32,
    /// Request id, echoed in replies.
    pub req_id: u32,
    /// Transaction id, 0 outside transactions.
    pub tx_id: u32,
    /// Payload length.
    pub len: u32,
}

impl Header {
    /// Builds a header.
    pub fn new(msg_type: MsgType, req_id: u32, tx_id: u32, len: u32) -> Header {
        Header {
            msg_type: msg_type.as_u32(),
            req_id,
            tx_id,
            len,
        }
    }

    /// The message type, if defined.
    pub fn msg_type(&self) -> Option<MsgType> {
        MsgType::from_u32(self.msg_type)
    }

    /// Serialises the header in host byte order.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&self.msg_type.to_ne_bytes());
        b[4..8].copy_from_slice(&self.req_id.to_ne_bytes());
        b[8..12].copy_from_slice(&self.tx_id.to_ne_bytes());
        b[12..16].copy_from_slice(&self.len.to_ne_bytes());
        b
    }

    /// Parses a header. Never fails: validation (type, length) is the
    /// receiver's job.
    pub fn decode(b: &[u8; HEADER_LEN]) -> Header {
        let word = |i: usize| u32::from_ne_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Header {
            msg_type: word(0),
            req_id: word(4),
            tx_id: word(8),
            len: word(12),
        }
    }
}

/// Errors building a wire message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The payload exceeds [`PAYLOAD_MAX`].
    #[error("payload of {0} bytes exceeds the XenStore maximum of {PAYLOAD_MAX}")]
    TooLong(usize),
    /// A string argument contains a NUL byte.
    #[error("argument contains a NUL byte")]
    EmbeddedNul,
}

/// Header plus payload, ready to write.
pub fn encode_message(
    msg_type: MsgType,
    req_id: u32,
    tx_id: u32,
    payload: &[u8],
) -> Result<Vec<u8>, WireError> {
    if payload.len() > PAYLOAD_MAX {
        return Err(WireError::TooLong(payload.len()));
    }
    let mut out = Vec::with_capacity(HEADER_LEN + payload.len());
    // The length fits in u32: it is at most PAYLOAD_MAX.
    out.extend_from_slice(&Header::new(msg_type, req_id, tx_id, payload.len() as u32).encode());
    out.extend_from_slice(payload);
    Ok(out)
}

/// Builds a payload of NUL-terminated strings, e.g. `["path", "token"]` ->
/// `b"path\0token\0"`.
pub fn nul_strings<S: AsRef<[u8]>>(parts: &[S]) -> Result<Vec<u8>, WireError> {
    let mut out = Vec::new();
    for p in parts {
        let p = p.as_ref();
        if p.contains(&0) {
            return Err(WireError::EmbeddedNul);
        }
        out.extend_from_slice(p);
        out.push(0);
    }
    Ok(out)
}

/// Splits a payload into its NUL-terminated strings. Bytes after the last NUL
/// (an unterminated tail) are returned separately.
///
/// ```
/// use xensock_xenif::xs_wire::split_strings;
/// let (parts, tail) = split_strings(b"a\0bc\0rest");
/// assert_eq!(parts, vec![&b"a"[..], &b"bc"[..]]);
/// assert_eq!(tail, b"rest");
/// ```
pub fn split_strings(payload: &[u8]) -> (Vec<&[u8]>, &[u8]) {
    let mut parts = Vec::new();
    let mut rest = payload;
    while let Some(pos) = rest.iter().position(|&b| b == 0) {
        parts.push(&rest[..pos]);
        rest = &rest[pos + 1..];
    }
    (parts, rest)
}

/// The errno values xenstored reports, by the names it puts on the wire
/// (`xsd_errors[]` in `xs_wire.h`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum XsErrno {
    /// `EINVAL`: malformed request or path.
    Inval,
    /// `EACCES`: permission denied.
    Acces,
    /// `EEXIST`: already exists (e.g. duplicate watch).
    Exist,
    /// `EISDIR`.
    IsDir,
    /// `ENOENT`: no such node, transaction or watch.
    NoEnt,
    /// `ENOMEM`.
    NoMem,
    /// `ENOSPC`: a quota was exceeded.
    NoSpc,
    /// `EIO`.
    Io,
    /// `ENOTEMPTY`.
    NotEmpty,
    /// `ENOSYS`: unknown or unsupported operation.
    NoSys,
    /// `EROFS`.
    RoFs,
    /// `EBUSY`.
    Busy,
    /// `EAGAIN`: transaction conflict, retry.
    Again,
    /// `EISCONN`.
    IsConn,
    /// `E2BIG`: reply too large, or too many watches.
    TooBig,
    /// `EPERM`: operation not permitted (e.g. changing a node's owner).
    Perm,
}

const ERRNO_TABLE: [(XsErrno, &str, i32); 16] = [
    (XsErrno::Inval, "EINVAL", libc::EINVAL),
    (XsErrno::Acces, "EACCES", libc::EACCES),
    (XsErrno::Exist, "EEXIST", libc::EEXIST),
    (XsErrno::IsDir, "EISDIR", libc::EISDIR),
    (XsErrno::NoEnt, "ENOENT", libc::ENOENT),
    (XsErrno::NoMem, "ENOMEM", libc::ENOMEM),
    (XsErrno::NoSpc, "ENOSPC", libc::ENOSPC),
    (XsErrno::Io, "EIO", libc::EIO),
    (XsErrno::NotEmpty, "ENOTEMPTY", libc::ENOTEMPTY),
    (XsErrno::NoSys, "ENOSYS", libc::ENOSYS),
    (XsErrno::RoFs, "EROFS", libc::EROFS),
    (XsErrno::Busy, "EBUSY", libc::EBUSY),
    (XsErrno::Again, "EAGAIN", libc::EAGAIN),
    (XsErrno::IsConn, "EISCONN", libc::EISCONN),
    (XsErrno::TooBig, "E2BIG", libc::E2BIG),
    (XsErrno::Perm, "EPERM", libc::EPERM),
];

impl XsErrno {
    /// The name used on the wire, e.g. `"ENOENT"`.
    pub fn name(self) -> &'static str {
        ERRNO_TABLE
            .iter()
            .find(|(e, _, _)| *e == self)
            .map(|(_, n, _)| *n)
            .unwrap_or("EINVAL")
    }

    /// The Linux errno value.
    pub fn errno(self) -> i32 {
        ERRNO_TABLE
            .iter()
            .find(|(e, _, _)| *e == self)
            .map(|(_, _, v)| *v)
            .unwrap_or(libc::EINVAL)
    }

    /// Parses a wire name (with or without its trailing NUL).
    pub fn from_name(name: &[u8]) -> Option<XsErrno> {
        let name = name.strip_suffix(b"\0").unwrap_or(name);
        ERRNO_TABLE
            .iter()
            .find(|(_, n, _)| n.as_bytes() == name)
            .map(|(e, _, _)| *e)
    }

    /// Maps an errno value; unknown values map to `EINVAL`, as xenstored does.
    pub fn from_errno(errno: i32) -> XsErrno {
        ERRNO_TABLE
            .iter()
            .find(|(_, _, v)| *v == errno)
            .map(|(e, _, _)| *e)
            .unwrap_or(XsErrno::Inval)
    }
}

impl fmt::Display for XsErrno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a permission entry allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PermAccess {
    /// `n`: nothing.
    None,
    /// `r`: read.
    Read,
    /// `w`: write.
    Write,
    /// `b`: read and write.
    Both,
}

impl PermAccess {
    /// Whether this entry grants read access.
    pub fn can_read(self) -> bool {
        matches!(self, PermAccess::Read | PermAccess::Both)
    }
    /// Whether this entry grants write access.
    pub fn can_write(self) -> bool {
        matches!(self, PermAccess::Write | PermAccess::Both)
    }
    fn letter(self) -> char {
        match self {
            PermAccess::None => 'n',
            PermAccess::Read => 'r',
            PermAccess::Write => 'w',
            PermAccess::Both => 'b',
        }
    }
}

/// One permission entry, as `xenstore-chmod` writes them: a letter and a
/// domid, e.g. `r5`. In a node's list the first entry names the owner (who
/// always has full access) and the access of every domain not listed; later
/// entries give specific domains specific access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Perm {
    /// The domain the entry is about (the owner, for the first entry).
    pub domid: u32,
    /// What the entry allows.
    pub access: PermAccess,
}

impl Perm {
    /// Builds an entry.
    pub fn new(access: PermAccess, domid: u32) -> Perm {
        Perm { domid, access }
    }

    /// Parses `n0`, `r5`, `w12`, `b3`. Returns `None` on anything else.
    pub fn parse(s: &[u8]) -> Option<Perm> {
        let (&letter, digits) = s.split_first()?;
        let access = match letter {
            b'n' => PermAccess::None,
            b'r' => PermAccess::Read,
            b'w' => PermAccess::Write,
            b'b' => PermAccess::Both,
            _ => return None,
        };
        if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let domid: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
        Some(Perm {
            domid: u32::try_from(domid).ok()?,
            access,
        })
    }
}

impl fmt::Display for Perm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.access.letter(), self.domid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trip_and_layout() {
        let h = Header::new(MsgType::Write, 0x01020304, 9, 5);
        let b = h.encode();
        assert_eq!(&b[0..4], &11u32.to_ne_bytes());
        assert_eq!(&b[4..8], &0x01020304u32.to_ne_bytes());
        assert_eq!(&b[8..12], &9u32.to_ne_bytes());
        assert_eq!(&b[12..16], &5u32.to_ne_bytes());
        assert_eq!(Header::decode(&b), h);
    }

    #[test]
    fn message_types_match_xs_wire_numbering() {
        assert_eq!(MsgType::Control as u32, 0);
        assert_eq!(MsgType::WatchEvent as u32, 15);
        assert_eq!(MsgType::Error as u32, 16);
        assert_eq!(MsgType::SetTarget as u32, 19);
        assert_eq!(MsgType::ResetWatches as u32, 21);
        assert_eq!(MsgType::DirectoryPart as u32, 22);
        assert_eq!(MsgType::from_u32(20), None, "XS_RESTRICT was removed");
        assert_eq!(MsgType::from_u32(23), None);
        for t in MsgType::ALL {
            assert_eq!(MsgType::from_u32(t.as_u32()), Some(t));
        }
    }

    #[test]
    fn errno_names() {
        assert_eq!(XsErrno::from_name(b"ENOENT\0"), Some(XsErrno::NoEnt));
        assert_eq!(XsErrno::from_name(b"EACCES"), Some(XsErrno::Acces));
        assert_eq!(XsErrno::from_name(b"EWHAT"), None);
        assert_eq!(XsErrno::Again.errno(), libc::EAGAIN);
        assert_eq!(XsErrno::from_errno(libc::E2BIG), XsErrno::TooBig);
        assert_eq!(XsErrno::from_errno(12345), XsErrno::Inval);
        assert_eq!(XsErrno::Perm.to_string(), "EPERM");
    }

    #[test]
    fn perms_parse_and_print() {
        assert_eq!(Perm::parse(b"r5"), Some(Perm::new(PermAccess::Read, 5)));
        assert_eq!(Perm::parse(b"b0").unwrap().to_string(), "b0");
        for bad in [&b""[..], b"r", b"x1", b"r-1", b"r1a", b"r99999999999"] {
            assert_eq!(Perm::parse(bad), None, "{:?}", bad);
        }
    }

    #[test]
    fn too_long_payload_is_refused() {
        assert_eq!(
            encode_message(MsgType::Write, 1, 0, &[b'x'; PAYLOAD_MAX + 1]),
            Err(WireError::TooLong(PAYLOAD_MAX + 1))
        );
        assert!(encode_message(MsgType::Write, 1, 0, &[b'x'; PAYLOAD_MAX]).is_ok());
        assert_eq!(nul_strings(&["a\0b"]), Err(WireError::EmbeddedNul));
    }

    proptest! {
        #[test]
        fn split_inverts_nul_strings(parts in proptest::collection::vec("[a-z/@_-]{0,12}", 0..6)) {
            let payload = nul_strings(&parts).unwrap();
            let (split, tail) = split_strings(&payload);
            prop_assert!(tail.is_empty());
            let split: Vec<String> = split.iter().map(|s| String::from_utf8(s.to_vec()).unwrap()).collect();
            prop_assert_eq!(split, parts);
        }
    }
}
