// SPDX-License-Identifier: MIT OR Apache-2.0
//! The guest's view of co-residency: the peers table the agent publishes
//! for it, lookups by IP address or UUID, and change events.
//!
//! Layout (see `docs/discovery.md`), relative to a guest's home
//! `/local/domain/<id>`, owned by dom0, readable by that guest only:
//!
//! ```text
//! xensock/peers/<domid>/uuid      peer's UUID
//! xensock/peers/<domid>/addrs     peer's IP addresses, space-separated
//! xensock/peers/<domid>/version   peer's xensock version
//! xensock/moved/<uuid>            destination host of a peer that left
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use xensock_xenif::xs_wire::XsErrno;
use xensock_xenif::DomId;

use crate::layout;
use crate::xs::{Transaction, Watch, XsClient, XsError};

/// A co-resident peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// Its current domid.
    pub domid: DomId,
    /// Its UUID (stable across migration).
    pub uuid: String,
    /// Its IP addresses.
    pub addrs: Vec<IpAddr>,
    /// Its xensock version.
    pub version: String,
}

/// A snapshot of the table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerTable {
    /// Peers by domid.
    pub peers: BTreeMap<DomId, Peer>,
    /// Peers that left for another host: UUID -> destination.
    pub moved: BTreeMap<String, String>,
}

impl PeerTable {
    /// The peer owning `ip`.
    pub fn by_ip(&self, ip: IpAddr) -> Option<&Peer> {
        self.peers.values().find(|p| p.addrs.contains(&ip))
    }
    /// The peer with this UUID (case-insensitive).
    pub fn by_uuid(&self, uuid: &str) -> Option<&Peer> {
        self.peers
            .values()
            .find(|p| p.uuid.eq_ignore_ascii_case(uuid))
    }
    /// The peer with this domid.
    pub fn by_domid(&self, domid: DomId) -> Option<&Peer> {
        self.peers.get(&domid)
    }
}

/// A change in the table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum PeerEvent {
    /// A new co-resident peer.
    Arrived(Peer),
    /// A peer is gone (destroyed, or left without a forwarding note).
    Gone(Peer),
    /// A peer migrated on this host: same UUID, new domid.
    Moved {
        /// The peer under its new domid.
        peer: Peer,
        /// Its previous domid.
        from_domid: DomId,
    },
    /// A peer left for another host.
    Left {
        /// The peer as it was.
        peer: Peer,
        /// The destination the toolstack recorded.
        destination: String,
    },
    /// A peer changed its addresses or version.
    Updated(Peer),
}

/// `dom5 <uuid> 10.0.0.5,fd00::5 v1`, as `xensock-discover peers` prints it.
impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let addrs: Vec<String> = self.addrs.iter().map(|a| a.to_string()).collect();
        let addrs = if addrs.is_empty() {
            "-".to_string()
        } else {
            addrs.join(",")
        };
        write!(
            f,
            "dom{} {} {} v{}",
            self.domid, self.uuid, addrs, self.version
        )
    }
}

/// One line a person reads: what happened, then the peer.
impl std::fmt::Display for PeerEvent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PeerEvent::Arrived(p) => write!(f, "arrived {p}"),
            PeerEvent::Gone(p) => write!(f, "gone    {p}"),
            PeerEvent::Moved { peer, from_domid } => {
                write!(f, "moved   {peer} (was dom{from_domid})")
            }
            PeerEvent::Left { peer, destination } => {
                write!(f, "left    {peer} for {destination}")
            }
            PeerEvent::Updated(p) => write!(f, "updated {p}"),
        }
    }
}

/// Events turning `old` into `new`, matched by UUID.
pub fn diff(old: &PeerTable, new: &PeerTable) -> Vec<PeerEvent> {
    let by_uuid = |t: &PeerTable| -> BTreeMap<String, Peer> {
        t.peers
            .values()
            .map(|p| (p.uuid.to_ascii_lowercase(), p.clone()))
            .collect()
    };
    let (o, n) = (by_uuid(old), by_uuid(new));
    let mut ev = Vec::new();
    for (u, p) in &o {
        if !n.contains_key(u) {
            match new.moved.get(u) {
                Some(dest) => ev.push(PeerEvent::Left {
                    peer: p.clone(),
                    destination: dest.clone(),
                }),
                None => ev.push(PeerEvent::Gone(p.clone())),
            }
        }
    }
    for (u, p) in &n {
        match o.get(u) {
            None => ev.push(PeerEvent::Arrived(p.clone())),
            Some(q) if q.domid != p.domid => ev.push(PeerEvent::Moved {
                peer: p.clone(),
                from_domid: q.domid,
            }),
            Some(q) if q != p => ev.push(PeerEvent::Updated(p.clone())),
            Some(_) => {}
        }
    }
    ev
}

/// Parses an address list, skipping what is not an address.
pub fn parse_addrs(s: &str) -> Vec<IpAddr> {
    s.split_whitespace()
        .filter_map(|a| a.parse().ok())
        .collect()
}

fn read_table(tx: &Transaction, base: &str) -> Result<PeerTable, XsError> {
    let mut t = PeerTable::default();
    let peers_dir = format!("{base}/{}", layout::PEERS);
    let ids = match tx.directory(&peers_dir) {
        Ok(v) => v,
        Err(e) if e.is(XsErrno::NoEnt) => Vec::new(),
        Err(e) => return Err(e),
    };
    for id in ids {
        let Ok(domid) = id.parse::<DomId>() else {
            continue;
        };
        let entry = format!("{peers_dir}/{id}");
        let (Some(uuid), Some(addrs)) = (
            tx.try_read(&format!("{entry}/{}", layout::peer_node::UUID))?,
            tx.try_read(&format!("{entry}/{}", layout::peer_node::ADDRS))?,
        ) else {
            continue;
        };
        let version = tx
            .try_read(&format!("{entry}/{}", layout::peer_node::VERSION))?
            .unwrap_or_default();
        t.peers.insert(
            domid,
            Peer {
                domid,
                uuid: String::from_utf8_lossy(&uuid).into_owned(),
                addrs: parse_addrs(&String::from_utf8_lossy(&addrs)),
                version: String::from_utf8_lossy(&version).into_owned(),
            },
        );
    }
    let moved_dir = format!("{base}/{}", layout::MOVED);
    let uuids = match tx.directory(&moved_dir) {
        Ok(v) => v,
        Err(e) if e.is(XsErrno::NoEnt) => Vec::new(),
        Err(e) => return Err(e),
    };
    for u in uuids {
        if let Some(dest) = tx.try_read(&format!("{moved_dir}/{u}"))? {
            t.moved.insert(
                u.to_ascii_lowercase(),
                String::from_utf8_lossy(&dest).into_owned(),
            );
        }
    }
    Ok(t)
}

/// A guest's co-residency view, backed by the agent's table in XenStore.
///
/// ```no_run
/// use xensock_discovery::peers::CoResidency;
/// use xensock_discovery::xs::XsClient;
/// let co = CoResidency::new(XsClient::open()?);
/// if let Some(p) = co.lookup_ip("10.0.0.7".parse().unwrap())? {
///     println!("10.0.0.7 is co-resident: domain {} ({})", p.domid, p.uuid);
/// }
/// # Ok::<(), xensock_discovery::xs::XsError>(())
/// ```
#[derive(Debug, Clone)]
pub struct CoResidency {
    xs: XsClient,
    base: String,
}

impl CoResidency {
    /// The calling domain's own table (relative paths).
    pub fn new(xs: XsClient) -> CoResidency {
        CoResidency {
            xs,
            base: layout::XENSOCK.to_string(),
        }
    }

    /// Another domain's table (dom0 and tests).
    pub fn of_domain(xs: XsClient, domid: DomId) -> CoResidency {
        CoResidency {
            xs,
            base: format!("{}/{}", layout::home(domid), layout::XENSOCK),
        }
    }

    /// Reads the whole table, consistently (one transaction).
    pub fn table(&self) -> Result<PeerTable, XsError> {
        self.xs.transaction(|tx| read_table(tx, &self.base))
    }

    /// Is `ip` co-resident, and who is it?
    pub fn lookup_ip(&self, ip: IpAddr) -> Result<Option<Peer>, XsError> {
        Ok(self.table()?.by_ip(ip).cloned())
    }

    /// The co-resident peer with this UUID.
    pub fn lookup_uuid(&self, uuid: &str) -> Result<Option<Peer>, XsError> {
        Ok(self.table()?.by_uuid(uuid).cloned())
    }

    /// The co-resident peer named by an IP address or, failing that
    /// parse, a UUID: how a program finds a peer's *current* domid after
    /// it moved, since a domid it remembered may be stale.
    pub fn resolve(&self, ip_or_uuid: &str) -> Result<Option<Peer>, XsError> {
        match ip_or_uuid.parse::<IpAddr>() {
            Ok(ip) => self.lookup_ip(ip),
            Err(_) => self.lookup_uuid(ip_or_uuid),
        }
    }

    /// The same events as a `futures_core::Stream`, for async code. A
    /// thread follows the table and forwards its events; it ends within
    /// 100 ms of the stream being dropped.
    pub fn watch_stream(&self) -> Result<PeerEventStream, XsError> {
        let mut w = self.watch()?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        std::thread::Builder::new()
            .name("xensock-peer-events".into())
            .spawn(move || {
                while !tx.is_closed() {
                    match w.next_event(Some(Duration::from_millis(100))) {
                        Ok(Some(e)) => {
                            if tx.send(Ok(e)).is_err() {
                                break;
                            }
                        }
                        Ok(None) => {}
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            break;
                        }
                    }
                }
            })
            .map_err(XsError::Io)?;
        Ok(PeerEventStream { rx })
    }

    /// Watches the table; events describe each change.
    pub fn watch(&self) -> Result<PeerWatcher, XsError> {
        let watch = self.xs.watch(&self.base)?;
        let table = self.table()?;
        Ok(PeerWatcher {
            co: self.clone(),
            watch,
            table,
            queue: VecDeque::new(),
        })
    }
}

/// Change events of a [`CoResidency`] table.
pub struct PeerWatcher {
    co: CoResidency,
    watch: Watch,
    table: PeerTable,
    queue: VecDeque<PeerEvent>,
}

impl PeerWatcher {
    /// The table as of the last event.
    pub fn table(&self) -> &PeerTable {
        &self.table
    }

    /// The next change, waiting at most `timeout` (forever if `None`).
    /// `Ok(None)` on timeout.
    pub fn next_event(&mut self, timeout: Option<Duration>) -> Result<Option<PeerEvent>, XsError> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(e) = self.queue.pop_front() {
                return Ok(Some(e));
            }
            let got = match deadline {
                None => Some(self.watch.recv()?),
                Some(d) => {
                    let left = d.saturating_duration_since(Instant::now());
                    self.watch.recv_timeout(left)?
                }
            };
            if got.is_none() {
                return Ok(None);
            }
            // Coalesce a burst (one table update fires several events).
            while self.watch.try_recv()?.is_some() {}
            let new = self.co.table()?;
            self.queue.extend(diff(&self.table, &new));
            self.table = new;
        }
    }
}

impl Iterator for PeerWatcher {
    type Item = Result<PeerEvent, XsError>;
    fn next(&mut self) -> Option<Self::Item> {
        match self.next_event(None) {
            Ok(Some(e)) => Some(Ok(e)),
            Ok(None) => None,
            Err(XsError::Closed) => None,
            Err(e) => Some(Err(e)),
        }
    }
}

/// Peer events as a `Stream`; ends with an error item if the XenStore
/// connection fails.
pub struct PeerEventStream {
    rx: tokio::sync::mpsc::UnboundedReceiver<Result<PeerEvent, XsError>>,
}

impl futures_core::Stream for PeerEventStream {
    type Item = Result<PeerEvent, XsError>;
    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.rx.poll_recv(cx)
    }
}

/// A peer configured by hand (no agent): by domid, by UUID, or both, with
/// the addresses that reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticPeer {
    /// Its domid, if known.
    pub domid: Option<DomId>,
    /// Its UUID, if known (the domid is then learned when connecting).
    pub uuid: Option<String>,
    /// Its addresses.
    pub addrs: Vec<IpAddr>,
}

/// A malformed static peer list.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A line could not be parsed.
    #[error("line {line}: {msg}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        msg: String,
    },
    /// The file could not be read.
    #[error("reading peer list: {0}")]
    Io(#[from] std::io::Error),
}

/// Peers configured explicitly, for hosts without an agent.
///
/// One peer per line, `key=value` words, `#` comments:
///
/// ```
/// use xensock_discovery::peers::StaticPeers;
/// let p = StaticPeers::parse("
///     peer domid=7 addrs=10.0.0.7,fd00::7   # the database VM
///     peer uuid=6f1c0b8e-9d3a-4b2e-8f00-0123456789ab addrs=10.0.0.8
/// ").unwrap();
/// assert_eq!(p.lookup_ip("fd00::7".parse().unwrap()).unwrap().domid, Some(7));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaticPeers {
    /// The peers.
    pub peers: Vec<StaticPeer>,
}

impl StaticPeers {
    /// Parses a peer list.
    pub fn parse(text: &str) -> Result<StaticPeers, ConfigError> {
        let mut peers = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let err = |msg: String| ConfigError::Syntax { line: i + 1, msg };
            let mut words = line.split_whitespace();
            if words.next() != Some("peer") {
                return Err(err("expected `peer key=value...`".into()));
            }
            let mut p = StaticPeer {
                domid: None,
                uuid: None,
                addrs: Vec::new(),
            };
            for w in words {
                let (k, v) = w
                    .split_once('=')
                    .ok_or_else(|| err(format!("expected key=value, got {w:?}")))?;
                match k {
                    "domid" => {
                        p.domid = Some(v.parse().map_err(|_| err(format!("bad domid {v:?}")))?)
                    }
                    "uuid" => {
                        if !layout::is_uuid(v) {
                            return Err(err(format!("bad uuid {v:?}")));
                        }
                        p.uuid = Some(v.to_ascii_lowercase());
                    }
                    "addrs" => {
                        for a in v.split(',').filter(|a| !a.is_empty()) {
                            p.addrs
                                .push(a.parse().map_err(|_| err(format!("bad address {a:?}")))?);
                        }
                    }
                    _ => return Err(err(format!("unknown key {k:?}"))),
                }
            }
            if p.domid.is_none() && p.uuid.is_none() {
                return Err(err("a peer needs domid= or uuid=".into()));
            }
            if p.addrs.is_empty() {
                return Err(err("a peer needs addrs=".into()));
            }
            peers.push(p);
        }
        Ok(StaticPeers { peers })
    }

    /// Reads and parses a peer list file.
    pub fn load(path: impl AsRef<std::path::Path>) -> Result<StaticPeers, ConfigError> {
        StaticPeers::parse(&std::fs::read_to_string(path)?)
    }

    /// The peer owning `ip`.
    pub fn lookup_ip(&self, ip: IpAddr) -> Option<&StaticPeer> {
        self.peers.iter().find(|p| p.addrs.contains(&ip))
    }

    /// The peer with this UUID.
    pub fn lookup_uuid(&self, uuid: &str) -> Option<&StaticPeer> {
        self.peers.iter().find(|p| {
            p.uuid
                .as_deref()
                .is_some_and(|u| u.eq_ignore_ascii_case(uuid))
        })
    }
}

/// Where co-residency answers come from.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Discovery {
    /// The dom0 agent's table in XenStore.
    Agent(CoResidency),
    /// An explicit peer list.
    Static(StaticPeers),
}

/// Environment variable naming a static peer list file.
pub const ENV_PEERS_FILE: &str = "XENSOCK_PEERS";

/// The answer to "is this address co-resident?".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Located {
    /// The peer's domid, when known.
    pub domid: Option<DomId>,
    /// The peer's UUID, when known.
    pub uuid: Option<String>,
}

impl Discovery {
    /// A static list when `XENSOCK_PEERS` names one, else the agent's table
    /// over [`XsClient::open`].
    pub fn from_env() -> Result<Discovery, Box<dyn std::error::Error + Send + Sync>> {
        if let Some(f) = std::env::var_os(ENV_PEERS_FILE) {
            return Ok(Discovery::Static(StaticPeers::load(f)?));
        }
        Ok(Discovery::Agent(CoResidency::new(XsClient::open()?)))
    }

    /// Is `ip` co-resident, and which domid/UUID is it?
    pub fn lookup_ip(&self, ip: IpAddr) -> Result<Option<Located>, XsError> {
        Ok(match self {
            Discovery::Agent(c) => c.lookup_ip(ip)?.map(Located::from),
            Discovery::Static(s) => s.lookup_ip(ip).map(Located::from),
        })
    }

    /// Is the domain with this UUID co-resident, and what is its domid
    /// now? A static entry named by UUID alone answers with no domid.
    pub fn lookup_uuid(&self, uuid: &str) -> Result<Option<Located>, XsError> {
        Ok(match self {
            Discovery::Agent(c) => c.lookup_uuid(uuid)?.map(Located::from),
            Discovery::Static(s) => s.lookup_uuid(uuid).map(Located::from),
        })
    }
}

impl From<Peer> for Located {
    fn from(p: Peer) -> Located {
        Located {
            domid: Some(p.domid),
            uuid: Some(p.uuid),
        }
    }
}

impl From<&StaticPeer> for Located {
    fn from(p: &StaticPeer) -> Located {
        Located {
            domid: p.domid,
            uuid: p.uuid.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(domid: DomId, uuid: &str, addr: &str) -> Peer {
        Peer {
            domid,
            uuid: uuid.into(),
            addrs: vec![addr.parse().unwrap()],
            version: "1".into(),
        }
    }

    fn table(peers: &[Peer]) -> PeerTable {
        PeerTable {
            peers: peers.iter().map(|p| (p.domid, p.clone())).collect(),
            moved: BTreeMap::new(),
        }
    }

    #[test]
    fn diff_classifies_changes() {
        let a = peer(3, "aaaa", "10.0.0.3");
        let b = peer(4, "bbbb", "10.0.0.4");
        let c = peer(5, "cccc", "10.0.0.5");
        let old = table(&[a.clone(), b.clone(), c.clone()]);
        let a2 = peer(9, "aaaa", "10.0.0.3");
        let mut b2 = b.clone();
        b2.addrs.push("10.0.1.4".parse().unwrap());
        let d = peer(6, "dddd", "10.0.0.6");
        let mut new = table(&[a2.clone(), b2.clone(), d.clone()]);
        assert_eq!(
            diff(&old, &new),
            vec![
                PeerEvent::Gone(c.clone()),
                PeerEvent::Moved {
                    peer: a2,
                    from_domid: 3
                },
                PeerEvent::Updated(b2),
                PeerEvent::Arrived(d),
            ]
        );
        new.moved.insert("cccc".into(), "hostB".into());
        assert!(diff(&old, &new).contains(&PeerEvent::Left {
            peer: c,
            destination: "hostB".into()
        }));
        assert!(diff(&new, &new).is_empty());
    }

    #[test]
    fn static_list_errors_name_the_line() {
        let e =
            StaticPeers::parse("peer domid=1 addrs=10.0.0.1\npeer addrs=10.0.0.2\n").unwrap_err();
        assert!(e.to_string().starts_with("line 2:"), "{e}");
        for bad in [
            "peer domid=x addrs=1.2.3.4",
            "peer domid=1 addrs=1.2.3",
            "peer domid=1",
            "peer uuid=nope addrs=1.2.3.4",
            "host domid=1 addrs=1.2.3.4",
            "peer domid=1 color=red addrs=1.2.3.4",
        ] {
            assert!(StaticPeers::parse(bad).is_err(), "{bad}");
        }
        let ok = StaticPeers::parse(
            "peer uuid=6F1C0B8E-9D3A-4B2E-8F00-0123456789AB addrs=10.0.0.8 # vm\n",
        )
        .unwrap();
        assert!(ok
            .lookup_uuid("6f1c0b8e-9d3a-4b2e-8f00-0123456789ab")
            .is_some());
        assert!(ok.lookup_ip("10.0.0.9".parse().unwrap()).is_none());
        let both = Discovery::Static(
            StaticPeers::parse(
                "peer domid=7 uuid=6f1c0b8e-9d3a-4b2e-8f00-0123456789ab addrs=10.0.0.7\n",
            )
            .unwrap(),
        );
        let found = both
            .lookup_uuid("6F1C0B8E-9D3A-4B2E-8F00-0123456789AB")
            .unwrap()
            .unwrap();
        assert_eq!(found.domid, Some(7));
        assert!(both
            .lookup_uuid("00000000-0000-0000-0000-000000000001")
            .unwrap()
            .is_none());
    }

    #[test]
    fn address_lists_skip_garbage() {
        assert_eq!(
            parse_addrs("10.0.0.1  fd00::1 nonsense"),
            vec![
                "10.0.0.1".parse::<IpAddr>().unwrap(),
                "fd00::1".parse().unwrap()
            ]
        );
    }
}

#[cfg(test)]
mod display_tests {
    use super::*;

    #[test]
    fn events_read_as_sentences() {
        let p = Peer {
            domid: 5,
            uuid: "0b0e2e5c-0000-4000-8000-000000000005".into(),
            addrs: vec!["10.0.0.5".parse().unwrap()],
            version: "1".into(),
        };
        assert_eq!(
            PeerEvent::Moved {
                peer: p.clone(),
                from_domid: 3
            }
            .to_string(),
            "moved   dom5 0b0e2e5c-0000-4000-8000-000000000005 10.0.0.5 v1 (was dom3)"
        );
        assert_eq!(
            PeerEvent::Arrived(Peer { addrs: vec![], ..p }).to_string(),
            "arrived dom5 0b0e2e5c-0000-4000-8000-000000000005 - v1"
        );
    }
}
