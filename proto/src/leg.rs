// SPDX-License-Identifier: MIT OR Apache-2.0
//! Leg admission (`docs/protocol.md` 5.4): what a host does with a TCP
//! connection to its leg listener once its hello is complete. Both hosts
//! call [`admit`] on every complete hello, again on each pass while it is
//! parked; they own the listener, the sockets and the registry of
//! connections the decision reads.

use super::ctrl::{cookie_matches, decode_hello};

/// How long a leg may take to send its hello, and how long one whose
/// hello names a connection not registered yet waits for it (the peer can
/// dial its leg before our side of the handshake registered the
/// connection).
pub const HELLO_TIMEOUT_MS: u64 = 5000;

/// Why a leg is closed without being handed over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Not a hello.
    Malformed,
    /// The connection is registered, with another cookie.
    BadCookie,
    /// No such connection here by the leg's deadline.
    UnknownConn,
}

/// What to do with a leg whose hello is complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Hand it to connection `conn_id`.
    Accept {
        /// The connection it names (ours).
        conn_id: u32,
    },
    /// Keep it: connection `conn_id` is not registered (yet). Decide again
    /// when connections are registered or at the deadline.
    Park {
        /// The connection it names.
        conn_id: u32,
    },
    /// Close it and count why.
    Refuse(Refusal),
}

/// Decides for a complete hello. `registered` looks a connection up and
/// returns its cookie; `now_ms` and `deadline_ms` are on the host's clock
/// (the deadline set when the leg was accepted).
pub fn admit(
    hello: &[u8],
    registered: impl FnOnce(u32) -> Option<u64>,
    now_ms: u64,
    deadline_ms: u64,
) -> Admission {
    let Some((conn_id, cookie)) = decode_hello(hello) else {
        return Admission::Refuse(Refusal::Malformed);
    };
    match registered(conn_id) {
        Some(want) if cookie_matches(want, cookie) => Admission::Accept { conn_id },
        Some(_) => Admission::Refuse(Refusal::BadCookie),
        None if now_ms >= deadline_ms => Admission::Refuse(Refusal::UnknownConn),
        None => Admission::Park { conn_id },
    }
}

#[cfg(test)]
mod tests {
    use super::super::ctrl::{Message, HELLO_LEN};
    use super::*;

    fn hello(conn_id: u32, cookie: u64) -> [u8; HELLO_LEN] {
        let mut b = [0u8; HELLO_LEN];
        let n = Message::TcpHello { conn_id, cookie }
            .encode(&mut b)
            .unwrap();
        assert_eq!(n, HELLO_LEN);
        b
    }

    #[test]
    fn a_registered_connection_with_its_cookie_takes_the_leg() {
        let h = hello(7, 0xfeed);
        let reg = |id| (id == 7).then_some(0xfeed);
        assert_eq!(admit(&h, reg, 0, 10), Admission::Accept { conn_id: 7 });
        // even past the deadline: the hello was complete in time
        assert_eq!(admit(&h, reg, 99, 10), Admission::Accept { conn_id: 7 });
        assert_eq!(
            admit(&h, |_| Some(0xbad), 0, 10),
            Admission::Refuse(Refusal::BadCookie)
        );
    }

    #[test]
    fn an_unknown_connection_is_parked_until_the_deadline() {
        let h = hello(9, 1);
        assert_eq!(admit(&h, |_| None, 9, 10), Admission::Park { conn_id: 9 });
        assert_eq!(
            admit(&h, |_| None, 10, 10),
            Admission::Refuse(Refusal::UnknownConn)
        );
        // registered meanwhile
        assert_eq!(
            admit(&h, |_| Some(1), 9, 10),
            Admission::Accept { conn_id: 9 }
        );
    }

    #[test]
    fn garbage_is_refused() {
        let mut h = hello(9, 1);
        h[0] ^= 0xff;
        assert_eq!(
            admit(&h, |_| Some(1), 0, 10),
            Admission::Refuse(Refusal::Malformed)
        );
        assert_eq!(
            admit(&h[..3], |_| Some(1), 0, 10),
            Admission::Refuse(Refusal::Malformed)
        );
    }
}
