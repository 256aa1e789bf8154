// SPDX-License-Identifier: MIT OR Apache-2.0
//! The business card a rank publishes through Open MPI's modex, and the
//! reachability decision a peer makes from it.

use std::fmt;
use std::net::IpAddr;

use crate::error::Error;

const PREFIX: &str = "xensock-btl/1";
/// A card never needs more (a UUID, two numbers, a few addresses);
/// anything longer is not one of ours.
pub const MAX_CARD_LEN: usize = 1024;

/// Where a rank listens and which guest it runs in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Card {
    /// The guest's domid when the card was published (it changes when the
    /// guest is restored or migrated; the UUID does not).
    pub domid: u32,
    /// The rank's AF_XEN listening port.
    pub port: u32,
    /// The guest's UUID, lowercase; empty where XenStore could not say.
    pub uuid: String,
    /// The guest's IP addresses (for static peer lists that name guests
    /// by address).
    pub addrs: Vec<IpAddr>,
}

impl fmt::Display for Card {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{PREFIX} domid={} port={} uuid={}",
            self.domid,
            self.port,
            self.uuid_or("-")
        )?;
        let addrs: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        write!(
            f,
            " addrs={}",
            if addrs.is_empty() {
                "-".into()
            } else {
                addrs.join(",")
            }
        )
    }
}

impl Card {
    /// The UUID, or `none` where XenStore could not say.
    pub fn uuid_or<'a>(&'a self, none: &'a str) -> &'a str {
        if self.uuid.is_empty() {
            none
        } else {
            &self.uuid
        }
    }

    /// The modex bytes.
    pub fn encode(&self) -> Vec<u8> {
        self.to_string().into_bytes()
    }

    /// Reads a card another rank published.
    pub fn decode(b: &[u8]) -> Result<Card, Error> {
        let bad = |why: String| Error::Card(why);
        if b.len() > MAX_CARD_LEN {
            return Err(bad(format!("{} bytes, at most {MAX_CARD_LEN}", b.len())));
        }
        let text = std::str::from_utf8(b).map_err(|_| bad("not UTF-8".into()))?;
        let text = text.trim_end_matches('\0');
        let mut words = text.split(' ');
        if words.next() != Some(PREFIX) {
            return Err(bad(format!("does not start with {PREFIX}: {text:?}")));
        }
        let (mut domid, mut port, mut uuid, mut addrs) = (None, None, None, None);
        for w in words {
            let (k, v) = w
                .split_once('=')
                .ok_or_else(|| bad(format!("{w:?} is not key=value")))?;
            match k {
                "domid" => domid = Some(v.parse().map_err(|_| bad(format!("domid {v:?}")))?),
                "port" => port = Some(v.parse().map_err(|_| bad(format!("port {v:?}")))?),
                "uuid" if v == "-" => uuid = Some(String::new()),
                "uuid" if xensock_discovery::layout::is_uuid(v) => {
                    uuid = Some(v.to_ascii_lowercase())
                }
                "uuid" => return Err(bad(format!("uuid {v:?}"))),
                "addrs" if v == "-" => addrs = Some(Vec::new()),
                "addrs" => {
                    addrs = Some(
                        v.split(',')
                            .map(|a| a.parse().map_err(|_| bad(format!("address {a:?}"))))
                            .collect::<Result<Vec<IpAddr>, Error>>()?,
                    )
                }
                _ => return Err(bad(format!("unknown key {k:?}"))),
            }
        }
        match (domid, port, uuid, addrs) {
            (Some(domid), Some(port), Some(uuid), Some(addrs)) => Ok(Card {
                domid,
                port,
                uuid,
                addrs,
            }),
            _ => Err(bad(format!("missing a key: {text:?}"))),
        }
    }

    /// Whether two cards come from the same guest (ranks there are left
    /// to Open MPI's shared-memory BTL).
    pub fn same_guest(&self, other: &Card) -> bool {
        if !self.uuid.is_empty() && !other.uuid.is_empty() {
            self.uuid == other.uuid
        } else {
            self.domid == other.domid
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn card() -> Card {
        Card {
            domid: 7,
            port: 4096,
            uuid: "6f1c0b8e-9d3a-4b2e-8f00-0123456789ab".into(),
            addrs: vec!["10.0.0.7".parse().unwrap(), "fd00::7".parse().unwrap()],
        }
    }

    #[test]
    fn cards_round_trip() {
        let c = card();
        assert_eq!(Card::decode(&c.encode()).unwrap(), c);
        let bare = Card {
            uuid: String::new(),
            addrs: vec![],
            ..card()
        };
        assert_eq!(Card::decode(&bare.encode()).unwrap(), bare);
    }

    #[test]
    fn bad_cards_say_what_is_wrong() {
        for (text, says) in [
            ("xensock-btl/2 domid=1", "does not start"),
            ("xensock-btl/1 domid=x port=1 uuid=- addrs=-", "domid"),
            ("xensock-btl/1 domid=1 port=1 uuid=nope addrs=-", "uuid"),
            ("xensock-btl/1 domid=1 port=1 uuid=- addrs=1.2.3", "address"),
            ("xensock-btl/1 domid=1 port=1 uuid=-", "missing"),
            (
                "xensock-btl/1 domid=1 port=1 uuid=- addrs=- color=red",
                "unknown key",
            ),
        ] {
            let e = Card::decode(text.as_bytes()).unwrap_err().to_string();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert!(Card::decode(&[b'x'; MAX_CARD_LEN + 1]).is_err());
    }

    #[test]
    fn same_guest_by_uuid_else_domid() {
        let a = card();
        let b = Card { domid: 9, ..card() }; // restored: new domid, same guest
        assert!(a.same_guest(&b));
        let c = Card {
            uuid: "00000000-0000-0000-0000-000000000001".into(),
            ..card()
        };
        assert!(!a.same_guest(&c));
        let d = Card {
            uuid: String::new(),
            ..card()
        };
        assert!(a.same_guest(&d));
    }

    proptest! {
        #[test]
        fn any_bytes_decode_or_fail_cleanly(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Card::decode(&b);
        }
    }
}
