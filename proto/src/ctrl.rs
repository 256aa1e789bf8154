// SPDX-License-Identifier: MIT OR Apache-2.0
//! Control messages: the link's control ring and the TCP leg.
//!
//! Every message is a frame: an 8-byte header then a body, little endian.
//!
//! ```text
//! 0        1        2                 4                                  8
//! +--------+--------+-----------------+----------------------------------+
//! | version|  kind  |  body length    |  connection id                   |
//! +--------+--------+-----------------+----------------------------------+
//! | body (fixed size per kind; Data: 8-byte offset then payload)  ...
//! ```
//!
//! Decoding is strict: wrong version, unknown kind, a body length that is not
//! exactly the kind's, a kind sent on the wrong channel, non-zero reserved
//! bytes or out-of-range enum values are all errors, and decoding never reads
//! past the input. The peer that sent such a frame is in breach and its link
//! (or TCP leg) is reset.

use super::layout::{MAX_RING_ORDER, MIN_RING_ORDER};

/// Version byte of every frame.
pub const CTRL_VERSION: u8 = 1;
/// Bytes in a frame header.
pub const HEADER_LEN: usize = 8;
/// Bytes of a `Data` frame before its payload (header + offset).
pub const DATA_PREFIX_LEN: usize = HEADER_LEN + 8;
/// Largest payload of one `Data` frame.
pub const MAX_DATA_PAYLOAD: usize = u16::MAX as usize - 8;
/// Largest non-`Data` frame.
pub const MAX_CONTROL_FRAME: usize = HEADER_LEN + 56;

/// Where a frame travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Channel {
    /// The link's control ring between two co-resident domains.
    Link,
    /// A connection's TCP leg.
    Tcp,
}

/// Frame kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Open a connection (link).
    ConnectRequest = 1,
    /// Accept it (link).
    ConnectAccept = 2,
    /// Refuse it (link).
    ConnectReject = 3,
    /// Orderly release of a connection's rings (link).
    Close = 4,
    /// Abort a connection (link or TCP).
    Reset = 5,
    /// The receiver offers a new receive ring: resize or return from TCP (link).
    RingOffer = 6,
    /// The sender is about to suspend; its rings are frozen (link).
    Suspend = 7,
    /// The sender resumed under a new domid (link).
    Resume = 8,
    /// The sender ends its grant of a ring it kept for reuse; the recipient
    /// unmaps it if it kept it mapped (link; only on links where both sides
    /// advertise ring reuse).
    RingRetire = 9,
    /// First frame on a TCP leg: authenticates it (TCP).
    TcpHello = 16,
    /// Stream bytes at an offset (TCP).
    Data = 17,
    /// "Bytes from offset M on travel in ring epoch E" (TCP).
    RingFrom = 18,
    /// The sender froze its ring of epoch E at offset M (TCP).
    TxFreeze = 19,
    /// The receiver holds everything below offset M; ring epoch E is dead (TCP).
    Consumed = 20,
    /// End of stream at offset M (TCP).
    Fin = 21,
    /// "The bytes that follow on this leg are the stream from offset M on",
    /// until a `RingFrom` or `Fin` on the other leg ends the run (TCP; the
    /// raw leg, see [`Message::RawFrom`]).
    RawFrom = 22,
}

impl Kind {
    fn from_u8(v: u8) -> Option<Kind> {
        Some(match v {
            1 => Kind::ConnectRequest,
            2 => Kind::ConnectAccept,
            3 => Kind::ConnectReject,
            4 => Kind::Close,
            5 => Kind::Reset,
            6 => Kind::RingOffer,
            7 => Kind::Suspend,
            8 => Kind::Resume,
            9 => Kind::RingRetire,
            16 => Kind::TcpHello,
            17 => Kind::Data,
            18 => Kind::RingFrom,
            19 => Kind::TxFreeze,
            20 => Kind::Consumed,
            21 => Kind::Fin,
            22 => Kind::RawFrom,
            _ => return None,
        })
    }

    /// Body length of a fixed-size kind; `None` for `Data`.
    pub const fn body_len(self) -> Option<usize> {
        Some(match self {
            Kind::ConnectRequest => 56,
            Kind::ConnectAccept => 48,
            Kind::ConnectReject => 4,
            Kind::Close => 0,
            Kind::Reset => 4,
            Kind::RingOffer => RING_GRANT_LEN,
            Kind::Suspend => 0,
            Kind::Resume => 4,
            Kind::RingRetire => RING_GRANT_LEN,
            Kind::TcpHello => 8,
            Kind::Data => return None,
            Kind::RingFrom | Kind::TxFreeze | Kind::Consumed => 16,
            Kind::Fin | Kind::RawFrom => 8,
        })
    }

    /// Whether the kind may travel on `channel`.
    pub const fn allowed_on(self, channel: Channel) -> bool {
        match self {
            Kind::Reset => true,
            Kind::ConnectRequest
            | Kind::ConnectAccept
            | Kind::ConnectReject
            | Kind::Close
            | Kind::RingOffer
            | Kind::Suspend
            | Kind::Resume
            | Kind::RingRetire => matches!(channel, Channel::Link),
            Kind::TcpHello
            | Kind::Data
            | Kind::RingFrom
            | Kind::TxFreeze
            | Kind::Consumed
            | Kind::Fin
            | Kind::RawFrom => matches!(channel, Channel::Tcp),
        }
    }
}

/// Why a frame was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// More bytes are needed; the frame is `needed` bytes long in all
    /// (header only, if the header itself is incomplete).
    Incomplete {
        /// Bytes needed for the whole frame (or the header).
        needed: usize,
    },
    /// The version byte is not [`CTRL_VERSION`].
    BadVersion(u8),
    /// The kind byte is unknown.
    UnknownKind(u8),
    /// The kind is not allowed on this channel.
    WrongChannel(Kind),
    /// The body length does not fit the kind.
    BadLength {
        /// Kind of the frame.
        kind: Kind,
        /// Declared body length.
        len: u16,
    },
    /// A reserved byte was not zero.
    ReservedNonZero,
    /// A field has a value outside its range.
    BadField(&'static str),
}

/// Why a frame could not be encoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is shorter than the frame.
    BufferTooSmall {
        /// Bytes the frame needs.
        needed: usize,
    },
    /// A `Data` payload above [`MAX_DATA_PAYLOAD`].
    PayloadTooLarge,
}

impl core::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            DecodeError::Incomplete { needed } => {
                write!(f, "incomplete frame, {needed} bytes needed")
            }
            DecodeError::BadVersion(v) => write!(f, "unsupported control version {v}"),
            DecodeError::UnknownKind(k) => write!(f, "unknown frame kind {k}"),
            DecodeError::WrongChannel(k) => write!(f, "{k:?} frame on the wrong channel"),
            DecodeError::BadLength { kind, len } => {
                write!(f, "{kind:?} frame with body length {len}")
            }
            DecodeError::ReservedNonZero => f.write_str("reserved bytes not zero"),
            DecodeError::BadField(name) => write!(f, "field {name} out of range"),
        }
    }
}

impl core::fmt::Display for EncodeError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            EncodeError::BufferTooSmall { needed } => {
                write!(f, "buffer too small, {needed} bytes needed")
            }
            EncodeError::PayloadTooLarge => f.write_str("data payload too large for one frame"),
        }
    }
}

const RING_GRANT_LEN: usize = 16;
const TCP_ENDPOINT_LEN: usize = 20;

const _: () = {
    // ConnectRequest: ports, type + reserved, cookie, grant, endpoint.
    assert!(
        matches!(Kind::ConnectRequest.body_len(), Some(n) if n == 4 + 4 + 4 + 8 + RING_GRANT_LEN + TCP_ENDPOINT_LEN)
    );
    // ConnectAccept: acceptor id, cookie, grant, endpoint.
    assert!(
        matches!(Kind::ConnectAccept.body_len(), Some(n) if n == 4 + 8 + RING_GRANT_LEN + TCP_ENDPOINT_LEN)
    );
    assert!(MAX_CONTROL_FRAME == HEADER_LEN + 56);
};

/// A receive ring offered by its owner: what the sender needs to map it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct RingGrant {
    /// log2 of the data size.
    pub order: u8,
    /// Ring epoch for this direction (0 at connect, then +1 per new ring).
    pub epoch: u32,
    /// Grant reference of the header page.
    pub header_ref: u32,
    /// Grant reference of the directory page (0 for compact rings).
    pub dir_ref: u32,
}

/// How to reach the peer over TCP if the ring goes away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub struct TcpEndpoint {
    /// IPv6 address, or IPv4-mapped (`::ffff:a.b.c.d`); all zero when the
    /// peer has no TCP fallback.
    pub addr: [u8; 16],
    /// TCP port; 0 when the peer has no TCP fallback.
    pub port: u16,
}

impl TcpEndpoint {
    /// No TCP fallback.
    pub const NONE: TcpEndpoint = TcpEndpoint {
        addr: [0; 16],
        port: 0,
    };

    /// The IPv4 address, if the endpoint has one (IPv4-mapped).
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        let a = &self.addr;
        if a[..10].iter().any(|b| *b != 0) || a[10..12] != [0xff, 0xff] {
            return None;
        }
        Some([a[12], a[13], a[14], a[15]])
    }
}

/// Socket type requested at connect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[repr(u8)]
pub enum SockType {
    /// Byte stream.
    Stream = 1,
    /// Reliable messages with boundaries.
    SeqPacket = 2,
}

/// Why a connect was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[repr(u8)]
pub enum RejectReason {
    /// Nobody listens on the port (`ECONNREFUSED`).
    NoListener = 1,
    /// The listener's backlog is full (`ECONNREFUSED`, retryable).
    BacklogFull = 2,
    /// The acceptor is out of memory or grants (`ENOBUFS`).
    NoResources = 3,
    /// The request was malformed or its ring unusable (`EPROTO`).
    BadRequest = 4,
    /// Policy forbids this peer (`EACCES`).
    Forbidden = 5,
    /// The socket types differ (`EPROTOTYPE`).
    WrongType = 6,
}

/// Why a connection was reset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
#[repr(u8)]
pub enum ResetReason {
    /// The application aborted (close with unread data, SO_LINGER 0).
    Abort = 1,
    /// The peer broke the protocol (corrupt ring, bad frame).
    ProtocolError = 2,
    /// The endpoint is going away (module unload, process exit).
    Shutdown = 3,
    /// The TCP leg failed authentication.
    BadCookie = 4,
    /// The peer could not be reached within the bound after a move.
    PeerLost = 5,
}

/// A decoded frame. `Data` borrows its payload from the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "arbitrary", derive(arbitrary::Arbitrary))]
pub enum Message<'a> {
    /// Open a connection from `src_port` to the listener on `dst_port`.
    ConnectRequest {
        /// The requester's connection id.
        conn_id: u32,
        /// Requester's port.
        src_port: u32,
        /// Listener's port.
        dst_port: u32,
        /// Socket type.
        sock_type: SockType,
        /// Random per-connection secret for the TCP leg.
        cookie: u64,
        /// The requester's receive ring.
        rx: RingGrant,
        /// The requester's TCP fallback endpoint.
        tcp: TcpEndpoint,
    },
    /// Accept a connection.
    ConnectAccept {
        /// The requester's connection id (echoed).
        conn_id: u32,
        /// The acceptor's connection id.
        acceptor_id: u32,
        /// The cookie from the request (echoed).
        cookie: u64,
        /// The acceptor's receive ring.
        rx: RingGrant,
        /// The acceptor's TCP fallback endpoint.
        tcp: TcpEndpoint,
    },
    /// Refuse a connection.
    ConnectReject {
        /// The requester's connection id.
        conn_id: u32,
        /// Why.
        reason: RejectReason,
    },
    /// Both directions finished; release the rings.
    Close {
        /// The recipient's connection id.
        conn_id: u32,
    },
    /// Abort the connection.
    Reset {
        /// The recipient's connection id.
        conn_id: u32,
        /// Why.
        reason: ResetReason,
    },
    /// A new receive ring for the recipient to send into.
    RingOffer {
        /// The recipient's connection id.
        conn_id: u32,
        /// The ring.
        rx: RingGrant,
    },
    /// The sender is suspending: every ring it produces into is frozen.
    Suspend,
    /// The sender is back under `new_domid`.
    Resume {
        /// Its domain id after the move.
        new_domid: u32,
    },
    /// The sender ends its grant of `ring`, a receive ring it had kept for
    /// reuse after its connection closed; the recipient unmaps it if it
    /// kept its mapping. Link-wide (connection id 0).
    RingRetire {
        /// The ring as it was last offered.
        ring: RingGrant,
    },
    /// Authenticates a TCP leg.
    TcpHello {
        /// The recipient's connection id.
        conn_id: u32,
        /// The connection's cookie.
        cookie: u64,
    },
    /// Stream bytes.
    Data {
        /// The recipient's connection id.
        conn_id: u32,
        /// Stream offset of the first payload byte.
        offset: u64,
        /// The bytes.
        payload: &'a [u8],
    },
    /// In-band marker: bytes from `offset` on travel in ring `epoch`.
    RingFrom {
        /// The recipient's connection id.
        conn_id: u32,
        /// Ring epoch now in use.
        epoch: u32,
        /// First stream offset carried by that ring.
        offset: u64,
    },
    /// The sender froze ring `epoch`; it had sent up to `offset`.
    TxFreeze {
        /// The recipient's connection id.
        conn_id: u32,
        /// The ring epoch frozen (the last one used).
        epoch: u32,
        /// Bytes the sender had sent in all.
        offset: u64,
    },
    /// The receiver holds all bytes below `offset`; ring `epoch` is dead.
    Consumed {
        /// The recipient's connection id.
        conn_id: u32,
        /// The ring epoch abandoned.
        epoch: u32,
        /// Resend from here.
        offset: u64,
    },
    /// End of stream at `offset`.
    Fin {
        /// The recipient's connection id.
        conn_id: u32,
        /// Total bytes in the stream.
        offset: u64,
    },
    /// Opens a run on a raw leg: the bytes after this frame, on the same
    /// leg, are the stream from `offset` on, without framing, until the
    /// sender's `RingFrom` or `Fin` (which travel on the other leg, see
    /// `docs/protocol.md`) says where the run ends; the next run starts
    /// with another `RawFrom`.
    RawFrom {
        /// The recipient's connection id.
        conn_id: u32,
        /// Stream offset of the run's first byte.
        offset: u64,
    },
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    // Every caller has checked the body length first, so reads stay in
    // bounds; `get` still refuses rather than panics.
    fn take<const N: usize>(&mut self) -> Result<[u8; N], DecodeError> {
        let end = self
            .pos
            .checked_add(N)
            .ok_or(DecodeError::BadField("length"))?;
        let bytes = self
            .buf
            .get(self.pos..end)
            .ok_or(DecodeError::BadField("length"))?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        self.pos = end;
        Ok(out)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn reserved(&mut self, n: usize) -> Result<(), DecodeError> {
        for _ in 0..n {
            if self.u8()? != 0 {
                return Err(DecodeError::ReservedNonZero);
            }
        }
        Ok(())
    }
    fn grant(&mut self) -> Result<RingGrant, DecodeError> {
        let order = self.u8()?;
        self.reserved(3)?;
        let epoch = self.u32()?;
        let header_ref = self.u32()?;
        let dir_ref = self.u32()?;
        if !(MIN_RING_ORDER..=MAX_RING_ORDER).contains(&(order as u32)) {
            return Err(DecodeError::BadField("ring order"));
        }
        let compact = order as u32 <= super::layout::COMPACT_MAX_ORDER;
        if compact && dir_ref != 0 {
            return Err(DecodeError::BadField("directory ref of a compact ring"));
        }
        Ok(RingGrant {
            order,
            epoch,
            header_ref,
            dir_ref,
        })
    }
    fn endpoint(&mut self) -> Result<TcpEndpoint, DecodeError> {
        let addr = self.take::<16>()?;
        let port = self.u16()?;
        self.reserved(2)?;
        Ok(TcpEndpoint { addr, port })
    }
}

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    // encode() sized the buffer first; these never run past it.
    fn put(&mut self, bytes: &[u8]) {
        if let Some(dst) = self.buf.get_mut(self.pos..self.pos + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        self.pos += bytes.len();
    }
    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
    fn zeros(&mut self, n: usize) {
        for _ in 0..n {
            self.u8(0);
        }
    }
    fn grant(&mut self, g: &RingGrant) {
        self.u8(g.order);
        self.zeros(3);
        self.u32(g.epoch);
        self.u32(g.header_ref);
        self.u32(g.dir_ref);
    }
    fn endpoint(&mut self, e: &TcpEndpoint) {
        self.put(&e.addr);
        self.u16(e.port);
        self.zeros(2);
    }
}

/// A validated frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Kind of the frame.
    pub kind: Kind,
    /// Body length (for `Data`: 8 + payload length).
    pub body_len: u16,
    /// Connection id (0 for link-wide messages).
    pub conn_id: u32,
}

impl FrameHeader {
    /// Total frame length, header included.
    pub fn frame_len(&self) -> usize {
        HEADER_LEN + self.body_len as usize
    }
}

/// Decodes and validates a frame header (the first [`HEADER_LEN`] bytes).
pub fn decode_header(buf: &[u8], channel: Channel) -> Result<FrameHeader, DecodeError> {
    if buf.len() < HEADER_LEN {
        return Err(DecodeError::Incomplete { needed: HEADER_LEN });
    }
    let mut r = Reader { buf, pos: 0 };
    let version = r.u8()?;
    let kind_byte = r.u8()?;
    let body_len = r.u16()?;
    let conn_id = r.u32()?;
    if version != CTRL_VERSION {
        return Err(DecodeError::BadVersion(version));
    }
    let kind = Kind::from_u8(kind_byte).ok_or(DecodeError::UnknownKind(kind_byte))?;
    if !kind.allowed_on(channel) {
        return Err(DecodeError::WrongChannel(kind));
    }
    let len_ok = match kind.body_len() {
        Some(n) => body_len as usize == n,
        None => body_len as usize >= 8,
    };
    if !len_ok {
        return Err(DecodeError::BadLength {
            kind,
            len: body_len,
        });
    }
    let link_wide = matches!(kind, Kind::Suspend | Kind::Resume | Kind::RingRetire);
    if link_wide && conn_id != 0 {
        return Err(DecodeError::BadField(
            "connection id of a link-wide message",
        ));
    }
    Ok(FrameHeader {
        kind,
        body_len,
        conn_id,
    })
}

/// Decodes one frame from the start of `buf`. Returns the message and the
/// number of bytes it occupied.
pub fn decode(buf: &[u8], channel: Channel) -> Result<(Message<'_>, usize), DecodeError> {
    let hdr = decode_header(buf, channel)?;
    let total = hdr.frame_len();
    if buf.len() < total {
        return Err(DecodeError::Incomplete { needed: total });
    }
    let body = &buf[HEADER_LEN..total];
    let mut r = Reader { buf: body, pos: 0 };
    let conn_id = hdr.conn_id;
    let msg = match hdr.kind {
        Kind::ConnectRequest => {
            let src_port = r.u32()?;
            let dst_port = r.u32()?;
            let sock_type = match r.u8()? {
                1 => SockType::Stream,
                2 => SockType::SeqPacket,
                _ => return Err(DecodeError::BadField("socket type")),
            };
            r.reserved(3)?;
            let cookie = r.u64()?;
            let rx = r.grant()?;
            let tcp = r.endpoint()?;
            Message::ConnectRequest {
                conn_id,
                src_port,
                dst_port,
                sock_type,
                cookie,
                rx,
                tcp,
            }
        }
        Kind::ConnectAccept => {
            let acceptor_id = r.u32()?;
            let cookie = r.u64()?;
            let rx = r.grant()?;
            let tcp = r.endpoint()?;
            Message::ConnectAccept {
                conn_id,
                acceptor_id,
                cookie,
                rx,
                tcp,
            }
        }
        Kind::ConnectReject => {
            let reason = match r.u8()? {
                1 => RejectReason::NoListener,
                2 => RejectReason::BacklogFull,
                3 => RejectReason::NoResources,
                4 => RejectReason::BadRequest,
                5 => RejectReason::Forbidden,
                6 => RejectReason::WrongType,
                _ => return Err(DecodeError::BadField("reject reason")),
            };
            r.reserved(3)?;
            Message::ConnectReject { conn_id, reason }
        }
        Kind::Close => Message::Close { conn_id },
        Kind::Reset => {
            let reason = match r.u8()? {
                1 => ResetReason::Abort,
                2 => ResetReason::ProtocolError,
                3 => ResetReason::Shutdown,
                4 => ResetReason::BadCookie,
                5 => ResetReason::PeerLost,
                _ => return Err(DecodeError::BadField("reset reason")),
            };
            r.reserved(3)?;
            Message::Reset { conn_id, reason }
        }
        Kind::RingOffer => Message::RingOffer {
            conn_id,
            rx: r.grant()?,
        },
        Kind::Suspend => Message::Suspend,
        Kind::Resume => Message::Resume {
            new_domid: r.u32()?,
        },
        Kind::RingRetire => Message::RingRetire { ring: r.grant()? },
        Kind::TcpHello => Message::TcpHello {
            conn_id,
            cookie: r.u64()?,
        },
        Kind::Data => {
            let offset = r.u64()?;
            Message::Data {
                conn_id,
                offset,
                payload: &body[8..],
            }
        }
        Kind::RingFrom | Kind::TxFreeze | Kind::Consumed => {
            let epoch = r.u32()?;
            r.reserved(4)?;
            let offset = r.u64()?;
            match hdr.kind {
                Kind::RingFrom => Message::RingFrom {
                    conn_id,
                    epoch,
                    offset,
                },
                Kind::TxFreeze => Message::TxFreeze {
                    conn_id,
                    epoch,
                    offset,
                },
                _ => Message::Consumed {
                    conn_id,
                    epoch,
                    offset,
                },
            }
        }
        Kind::Fin => Message::Fin {
            conn_id,
            offset: r.u64()?,
        },
        Kind::RawFrom => Message::RawFrom {
            conn_id,
            offset: r.u64()?,
        },
    };
    Ok((msg, total))
}

impl Message<'_> {
    /// The frame's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Message::ConnectRequest { .. } => Kind::ConnectRequest,
            Message::ConnectAccept { .. } => Kind::ConnectAccept,
            Message::ConnectReject { .. } => Kind::ConnectReject,
            Message::Close { .. } => Kind::Close,
            Message::Reset { .. } => Kind::Reset,
            Message::RingOffer { .. } => Kind::RingOffer,
            Message::Suspend => Kind::Suspend,
            Message::Resume { .. } => Kind::Resume,
            Message::RingRetire { .. } => Kind::RingRetire,
            Message::TcpHello { .. } => Kind::TcpHello,
            Message::Data { .. } => Kind::Data,
            Message::RingFrom { .. } => Kind::RingFrom,
            Message::TxFreeze { .. } => Kind::TxFreeze,
            Message::Consumed { .. } => Kind::Consumed,
            Message::Fin { .. } => Kind::Fin,
            Message::RawFrom { .. } => Kind::RawFrom,
        }
    }

    fn conn_id(&self) -> u32 {
        match *self {
            Message::ConnectRequest { conn_id, .. }
            | Message::ConnectAccept { conn_id, .. }
            | Message::ConnectReject { conn_id, .. }
            | Message::Close { conn_id }
            | Message::Reset { conn_id, .. }
            | Message::RingOffer { conn_id, .. }
            | Message::TcpHello { conn_id, .. }
            | Message::Data { conn_id, .. }
            | Message::RingFrom { conn_id, .. }
            | Message::TxFreeze { conn_id, .. }
            | Message::Consumed { conn_id, .. }
            | Message::Fin { conn_id, .. }
            | Message::RawFrom { conn_id, .. } => conn_id,
            Message::Suspend | Message::Resume { .. } | Message::RingRetire { .. } => 0,
        }
    }

    /// Bytes the encoded frame takes.
    pub fn encoded_len(&self) -> usize {
        match self {
            Message::Data { payload, .. } => DATA_PREFIX_LEN + payload.len(),
            other => HEADER_LEN + other.kind().body_len().unwrap_or(0),
        }
    }

    /// Encodes the frame into `out`; returns its length.
    pub fn encode(&self, out: &mut [u8]) -> Result<usize, EncodeError> {
        if let Message::Data { payload, .. } = self {
            if payload.len() > MAX_DATA_PAYLOAD {
                return Err(EncodeError::PayloadTooLarge);
            }
        }
        let len = self.encoded_len();
        if out.len() < len {
            return Err(EncodeError::BufferTooSmall { needed: len });
        }
        let mut w = Writer { buf: out, pos: 0 };
        w.u8(CTRL_VERSION);
        w.u8(self.kind() as u8);
        w.u16((len - HEADER_LEN) as u16);
        w.u32(self.conn_id());
        match self {
            Message::ConnectRequest {
                src_port,
                dst_port,
                sock_type,
                cookie,
                rx,
                tcp,
                ..
            } => {
                w.u32(*src_port);
                w.u32(*dst_port);
                w.u8(*sock_type as u8);
                w.zeros(3);
                w.u64(*cookie);
                w.grant(rx);
                w.endpoint(tcp);
            }
            Message::ConnectAccept {
                acceptor_id,
                cookie,
                rx,
                tcp,
                ..
            } => {
                w.u32(*acceptor_id);
                w.u64(*cookie);
                w.grant(rx);
                w.endpoint(tcp);
            }
            Message::ConnectReject { reason, .. } => {
                w.u8(*reason as u8);
                w.zeros(3);
            }
            Message::Reset { reason, .. } => {
                w.u8(*reason as u8);
                w.zeros(3);
            }
            Message::RingOffer { rx, .. } => w.grant(rx),
            Message::Close { .. } | Message::Suspend => {}
            Message::Resume { new_domid } => w.u32(*new_domid),
            Message::RingRetire { ring } => w.grant(ring),
            Message::TcpHello { cookie, .. } => w.u64(*cookie),
            Message::Data {
                offset, payload, ..
            } => {
                w.u64(*offset);
                w.put(payload);
            }
            Message::RingFrom { epoch, offset, .. }
            | Message::TxFreeze { epoch, offset, .. }
            | Message::Consumed { epoch, offset, .. } => {
                w.u32(*epoch);
                w.zeros(4);
                w.u64(*offset);
            }
            Message::Fin { offset, .. } | Message::RawFrom { offset, .. } => w.u64(*offset),
        }
        Ok(len)
    }
}

/// Encodes the 16-byte prefix of a `Data` frame carrying `payload_len`
/// bytes, so a host can send header and payload with one vectored write
/// instead of copying the payload.
pub fn encode_data_prefix(
    conn_id: u32,
    offset: u64,
    payload_len: usize,
) -> Result<[u8; DATA_PREFIX_LEN], EncodeError> {
    if payload_len > MAX_DATA_PAYLOAD {
        return Err(EncodeError::PayloadTooLarge);
    }
    let mut out = [0u8; DATA_PREFIX_LEN];
    let mut w = Writer {
        buf: &mut out,
        pos: 0,
    };
    w.u8(CTRL_VERSION);
    w.u8(Kind::Data as u8);
    w.u16((8 + payload_len) as u16);
    w.u32(conn_id);
    w.u64(offset);
    Ok(out)
}

/// Decodes the [`DATA_PREFIX_LEN`]-byte prefix of a `Data` frame (what
/// [`encode_data_prefix`] makes): its header and stream offset. The
/// payload, `frame_len() - DATA_PREFIX_LEN` bytes, follows; a host can
/// receive it straight into its destination instead of buffering the
/// whole frame for [`decode`]. Any other kind is an error.
pub fn decode_data_prefix(buf: &[u8], channel: Channel) -> Result<(FrameHeader, u64), DecodeError> {
    let hdr = decode_header(buf, channel)?;
    if hdr.kind != Kind::Data {
        return Err(DecodeError::BadField("kind of a Data prefix"));
    }
    if buf.len() < DATA_PREFIX_LEN {
        return Err(DecodeError::Incomplete {
            needed: DATA_PREFIX_LEN,
        });
    }
    let mut r = Reader {
        buf: &buf[HEADER_LEN..DATA_PREFIX_LEN],
        pos: 0,
    };
    Ok((hdr, r.u64()?))
}

/// A listening socket as a `ConnectRequest` for its port sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ListenerView {
    /// The listener's socket type.
    pub sock_type: SockType,
    /// Connections waiting to be accepted.
    pub queued: usize,
    /// How many may wait.
    pub backlog: usize,
}

/// The acceptor's first answer to a `ConnectRequest` of `wanted` type for
/// a port where `listener` listens (None: nobody): Ok to go on (map the
/// requester's ring, grant ours), or the `ConnectReject` reason. A ring
/// that cannot be granted is `NoResources`; one that cannot be mapped,
/// `BadRequest`.
pub fn admit(listener: Option<ListenerView>, wanted: SockType) -> Result<(), RejectReason> {
    let l = listener.ok_or(RejectReason::NoListener)?;
    if l.sock_type != wanted {
        return Err(RejectReason::WrongType);
    }
    if l.queued >= l.backlog {
        return Err(RejectReason::BacklogFull);
    }
    Ok(())
}

/// Bytes of the `TcpHello` frame that opens every TCP leg.
pub const HELLO_LEN: usize = HEADER_LEN + 8;

/// The `TcpHello` a leg opens with: (connection id, cookie), if `buf` is
/// exactly one well-formed hello and nothing else.
pub fn decode_hello(buf: &[u8]) -> Option<(u32, u64)> {
    match decode(buf, Channel::Tcp) {
        Ok((Message::TcpHello { conn_id, cookie }, HELLO_LEN)) if buf.len() == HELLO_LEN => {
            Some((conn_id, cookie))
        }
        _ => None,
    }
}

/// Whether a hello's cookie is the connection's own: compared without an
/// early exit (one xor, one compare), so timing does not tell how many
/// leading bits were right; and never the zero cookie, which no
/// connection has.
pub fn cookie_matches(want: u64, got: u64) -> bool {
    core::hint::black_box(want ^ got) == 0 && want != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_endpoint_has_an_ipv4_address_only_when_ipv4_mapped() {
        let mut e = TcpEndpoint::NONE;
        assert_eq!(e.ipv4(), None, "all zero: no TCP fallback");
        e.addr[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 12]);
        assert_eq!(e.ipv4(), Some([10, 0, 0, 12]));
        e.addr[0] = 0xfd;
        assert_eq!(e.ipv4(), None, "an IPv6 address");
    }

    #[test]
    fn a_connect_request_is_admitted_only_by_a_listener_of_its_type_with_room() {
        let l = |sock_type, queued| ListenerView {
            sock_type,
            queued,
            backlog: 2,
        };
        assert_eq!(admit(None, SockType::Stream), Err(RejectReason::NoListener));
        assert_eq!(
            admit(Some(l(SockType::SeqPacket, 0)), SockType::Stream),
            Err(RejectReason::WrongType)
        );
        assert_eq!(
            admit(Some(l(SockType::Stream, 2)), SockType::Stream),
            Err(RejectReason::BacklogFull)
        );
        assert_eq!(
            admit(Some(l(SockType::Stream, 1)), SockType::Stream),
            Ok(())
        );
    }

    #[test]
    fn a_hello_is_one_exact_frame_and_its_cookie_must_match() {
        let mut buf = [0u8; HELLO_LEN];
        let m = Message::TcpHello {
            conn_id: 7,
            cookie: 0xfeed,
        };
        assert_eq!(m.encode(&mut buf), Ok(HELLO_LEN));
        assert_eq!(decode_hello(&buf), Some((7, 0xfeed)));
        assert_eq!(decode_hello(&buf[..HELLO_LEN - 1]), None);
        let mut longer = [0u8; HELLO_LEN + 1];
        longer[..HELLO_LEN].copy_from_slice(&buf);
        assert_eq!(decode_hello(&longer), None);
        let other = Message::Close { conn_id: 7 };
        let mut b = [0u8; 64];
        let n = other.encode(&mut b).unwrap();
        assert_eq!(decode_hello(&b[..n]), None);
        assert!(cookie_matches(0xfeed, 0xfeed));
        assert!(!cookie_matches(0xfeed, 0xfeec));
        assert!(!cookie_matches(0, 0));
    }

    fn grant() -> RingGrant {
        RingGrant {
            order: 16,
            epoch: 3,
            header_ref: 42,
            dir_ref: 43,
        }
    }

    #[test]
    fn connect_request_round_trips() {
        let msg = Message::ConnectRequest {
            conn_id: 9,
            src_port: 1025,
            dst_port: 80,
            sock_type: SockType::Stream,
            cookie: 0xdead_beef_f00d,
            rx: grant(),
            tcp: TcpEndpoint {
                addr: [1; 16],
                port: 5000,
            },
        };
        let mut buf = [0u8; 128];
        let n = msg.encode(&mut buf).unwrap();
        assert_eq!(n, msg.encoded_len());
        assert_eq!(decode(&buf[..n], Channel::Link), Ok((msg, n)));
        // Every truncation is incomplete, never a panic or a wrong message.
        for cut in 0..n {
            assert!(matches!(
                decode(&buf[..cut], Channel::Link),
                Err(DecodeError::Incomplete { .. })
            ));
        }
    }

    #[test]
    fn raw_from_is_a_tcp_frame_of_one_offset() {
        let msg = Message::RawFrom {
            conn_id: 9,
            offset: (1 << 40) + 5,
        };
        let mut buf = [0u8; 64];
        let n = msg.encode(&mut buf).unwrap();
        assert_eq!(n, HEADER_LEN + 8);
        assert_eq!(buf[1], 22);
        assert_eq!(decode(&buf[..n], Channel::Tcp), Ok((msg, n)));
        assert_eq!(
            decode(&buf[..n], Channel::Link),
            Err(DecodeError::WrongChannel(Kind::RawFrom))
        );
        // a body that is not exactly the offset is refused
        let mut long = buf;
        long[2] = 9;
        assert!(decode(&long[..n + 1], Channel::Tcp).is_err());
    }

    #[test]
    fn strictness() {
        let msg = Message::RingFrom {
            conn_id: 1,
            epoch: 2,
            offset: 3,
        };
        let mut buf = [0u8; 64];
        let n = msg.encode(&mut buf).unwrap();
        assert_eq!(
            decode(&buf[..n], Channel::Link),
            Err(DecodeError::WrongChannel(Kind::RingFrom))
        );
        let mut bad = buf;
        bad[0] = 2;
        assert_eq!(
            decode(&bad[..n], Channel::Tcp),
            Err(DecodeError::BadVersion(2))
        );
        let mut bad = buf;
        bad[1] = 99;
        assert_eq!(
            decode(&bad[..n], Channel::Tcp),
            Err(DecodeError::UnknownKind(99))
        );
        let mut bad = buf;
        bad[2] = 17;
        assert!(matches!(
            decode(&bad[..n], Channel::Tcp),
            Err(DecodeError::BadLength { .. })
        ));
        let mut bad = buf;
        bad[HEADER_LEN + 5] = 1; // reserved
        assert_eq!(
            decode(&bad[..n], Channel::Tcp),
            Err(DecodeError::ReservedNonZero)
        );
    }

    #[test]
    fn compact_ring_grant_must_not_name_a_directory() {
        let msg = Message::RingOffer {
            conn_id: 1,
            rx: RingGrant {
                order: 11,
                epoch: 0,
                header_ref: 5,
                dir_ref: 6,
            },
        };
        let mut buf = [0u8; 64];
        let n = msg.encode(&mut buf).unwrap();
        assert!(matches!(
            decode(&buf[..n], Channel::Link),
            Err(DecodeError::BadField(_))
        ));
    }

    #[test]
    fn ring_retire_round_trips_and_is_link_wide() {
        let msg = Message::RingRetire { ring: grant() };
        let mut buf = [0u8; 64];
        let n = msg.encode(&mut buf).unwrap();
        assert_eq!(n, HEADER_LEN + 16);
        assert_eq!(buf[1], 9);
        assert_eq!(&buf[4..8], &[0; 4], "link-wide: connection id 0");
        assert_eq!(decode(&buf[..n], Channel::Link), Ok((msg, n)));
        for cut in 0..n {
            assert!(matches!(
                decode(&buf[..cut], Channel::Link),
                Err(DecodeError::Incomplete { .. })
            ));
        }
        assert_eq!(
            decode(&buf[..n], Channel::Tcp),
            Err(DecodeError::WrongChannel(Kind::RingRetire))
        );
        let mut bad = buf;
        bad[4] = 1;
        assert!(matches!(
            decode(&bad[..n], Channel::Link),
            Err(DecodeError::BadField(_))
        ));
        let mut bad = buf;
        bad[HEADER_LEN + 1] = 1; // reserved byte of the grant
        assert_eq!(
            decode(&bad[..n], Channel::Link),
            Err(DecodeError::ReservedNonZero)
        );
    }

    #[test]
    fn data_prefix_matches_full_encoding() {
        let payload = [7u8; 100];
        let msg = Message::Data {
            conn_id: 4,
            offset: 1 << 40,
            payload: &payload,
        };
        let mut buf = [0u8; 200];
        let n = msg.encode(&mut buf).unwrap();
        assert_eq!(
            &buf[..DATA_PREFIX_LEN],
            &encode_data_prefix(4, 1 << 40, 100).unwrap()
        );
        assert_eq!(decode(&buf[..n], Channel::Tcp), Ok((msg, n)));
        assert_eq!(
            encode_data_prefix(4, 0, MAX_DATA_PAYLOAD + 1),
            Err(EncodeError::PayloadTooLarge)
        );
    }

    #[test]
    fn data_prefix_decodes_what_the_full_encoding_says() {
        let payload = [9u8; 300];
        let msg = Message::Data {
            conn_id: 11,
            offset: (1 << 33) + 5,
            payload: &payload,
        };
        let mut buf = [0u8; 400];
        let n = msg.encode(&mut buf).unwrap();
        let (hdr, offset) = decode_data_prefix(&buf[..DATA_PREFIX_LEN], Channel::Tcp).unwrap();
        assert_eq!(hdr.kind, Kind::Data);
        assert_eq!(hdr.conn_id, 11);
        assert_eq!(offset, (1 << 33) + 5);
        assert_eq!(hdr.frame_len(), n);
        assert_eq!(hdr.frame_len() - DATA_PREFIX_LEN, payload.len());
    }

    #[test]
    fn data_prefix_refuses_other_kinds_short_input_and_the_link_channel() {
        let mut buf = [0u8; 64];
        let n = Message::Fin {
            conn_id: 3,
            offset: 77,
        }
        .encode(&mut buf)
        .unwrap();
        assert_eq!(
            decode_data_prefix(&buf[..n], Channel::Tcp),
            Err(DecodeError::BadField("kind of a Data prefix"))
        );
        let prefix = encode_data_prefix(3, 0, 10).unwrap();
        assert_eq!(
            decode_data_prefix(&prefix[..DATA_PREFIX_LEN - 1], Channel::Tcp),
            Err(DecodeError::Incomplete {
                needed: DATA_PREFIX_LEN
            })
        );
        assert!(matches!(
            decode_data_prefix(&prefix, Channel::Link),
            Err(DecodeError::WrongChannel(Kind::Data))
        ));
    }
}
