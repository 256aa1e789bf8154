// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock-agent`: the dom0 daemon that tells each guest which peers are
//! co-resident and may be seen.
//!
//! It watches `@introduceDomain`, `@releaseDomain` and `/local/domain`,
//! reads every guest's UUID (`vm`), tenant label (`xensock/label`, written
//! by dom0) and advert (`data/xensock/`), and writes each guest's table
//! (`xensock/peers/<domid>/...`, owned by dom0, readable by that guest
//! only) listing the advertised guests with the same label. A guest cannot
//! change its label (the node is dom0's) and cannot read another guest's
//! table.
//!
//! During a same-host migration the old and the new instance briefly share
//! a UUID; the table lists the newer domid only, and carries the old
//! instance's advert over until the new one advertises, so peers see one
//! `Moved` change. When a guest leaves for another host the toolstack
//! writes `/tool/xensock/moved/<uuid>`; the agent then records
//! `xensock/moved/<uuid>` in its peers' tables.
//!
//! Dom0 can also mark a guest as moved while it stays on this host
//! (`/tool/xensock/away/<uuid>` = destination label, [`mark_away`]): the
//! agent then treats it exactly like a guest that left (gone from its
//! peers' tables, `moved` noted, link directories withdrawn, and its own
//! table loses them the same way) until the marking is removed
//! ([`mark_back`]). This drills the migration switch without a second host.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use xensock_xenif::xs_wire::{Perm, PermAccess, XsErrno};
use xensock_xenif::DomId;

use crate::layout::{self, peer_node};
use crate::xs::{Transaction, XsClient, XsError};

/// Agent settings.
#[derive(Debug, Clone, Default)]
pub struct AgentConfig {
    /// Guests without a label see no peers and are seen by none. Without
    /// this, unlabelled guests form one default tenant.
    pub require_label: bool,
    /// This host's name, written as the destination in an away-marked
    /// guest's own table for the peers it is separated from (they stay
    /// "here" while it is elsewhere). Default: the machine's hostname.
    pub host_name: Option<String>,
}

/// The machine's hostname, or `"localhost"` if it has none.
fn local_host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .ok()
        .filter(|s| !s.is_empty() && s != "(none)")
        .unwrap_or_else(|| "localhost".into())
}

/// One consistent view of the host: the guests and the away markings
/// (UUID -> destination label).
struct Scan {
    doms: Vec<Dom>,
    away: HashMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct AdvertRaw {
    addrs: String,
    version: String,
}

#[derive(Debug, Clone)]
struct Dom {
    domid: DomId,
    uuid: String,
    label: Option<String>,
    advert: Option<AdvertRaw>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Table {
    entries: BTreeMap<DomId, (String, AdvertRaw)>,
    moved: BTreeMap<String, String>,
    /// Peers released from this host with no move marker: domid -> UUID.
    gone: BTreeMap<DomId, String>,
}

/// The agent's state. [`Agent::sync`] does one full pass; [`Agent::run`]
/// follows XenStore events.
pub struct Agent {
    xs: XsClient,
    cfg: AgentConfig,
    published: HashMap<DomId, Table>,
    /// Last advert seen per UUID.
    adverts: HashMap<String, AdvertRaw>,
    /// Domid per UUID at the previous pass.
    seen: HashMap<String, DomId>,
    /// Adverts carried to a migrated instance until it advertises itself.
    carried: HashMap<DomId, AdvertRaw>,
    /// Co-resident pairs (lower domid first) whose link directories this
    /// agent made.
    links: BTreeSet<(DomId, DomId)>,
}

fn lossy(v: Vec<u8>) -> String {
    String::from_utf8_lossy(&v).into_owned()
}

/// `/local/domain/<owner>/data/xensock/link/<peer>`: where `owner`
/// publishes its half of the link with `peer` (`docs/protocol.md` 6.1).
pub fn link_dir(owner: DomId, peer: DomId) -> String {
    format!("{}/{}/{peer}", layout::home(owner), layout::LINK_DIR)
}

/// Whether a watch event can change any table.
fn relevant(path: &str) -> bool {
    if path.starts_with('@') || path == layout::DOMAINS {
        return true;
    }
    if path
        .strip_prefix(layout::TOOL_AWAY)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    {
        return true;
    }
    let Some(rest) = path
        .strip_prefix(layout::DOMAINS)
        .and_then(|r| r.strip_prefix('/'))
    else {
        return false;
    };
    let (_, sub) = rest.split_once('/').unwrap_or((rest, ""));
    // Link nodes (`data/xensock/link/...`) change with every link a guest
    // sets up or tears down; they are not part of any table.
    sub.is_empty()
        || sub == "vm"
        || sub == layout::LABEL
        || sub == layout::ADVERT
        || sub == layout::ADVERT_ADDRS
        || sub == layout::ADVERT_VERSION
        || sub == "data"
        || sub == layout::XENSOCK
}

impl Agent {
    /// An agent on a dom0 connection.
    pub fn new(xs: XsClient, cfg: AgentConfig) -> Agent {
        Agent {
            xs,
            cfg,
            published: HashMap::new(),
            adverts: HashMap::new(),
            seen: HashMap::new(),
            carried: HashMap::new(),
            links: BTreeSet::new(),
        }
    }

    /// Every guest, and the away markings, as of one consistent snapshot
    /// (a transaction: a scan racing with a migration must not see half of
    /// it).
    fn scan(&self) -> Result<Scan, XsError> {
        self.xs.transaction(Self::scan_in)
    }

    fn scan_in(tx: &Transaction) -> Result<Scan, XsError> {
        let ids = match tx.directory(layout::DOMAINS) {
            Ok(v) => v,
            Err(e) if e.is(XsErrno::NoEnt) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut doms = Vec::new();
        for id in ids {
            let Ok(domid) = id.parse::<DomId>() else {
                continue;
            };
            if domid == 0 {
                continue;
            }
            let home = layout::home(domid);
            let Some(vm) = tx.try_read(&format!("{home}/vm"))? else {
                continue;
            };
            let vm = lossy(vm);
            let uuid = vm.rsplit('/').next().unwrap_or("").to_ascii_lowercase();
            if !layout::is_uuid(&uuid) {
                continue;
            }
            let label = tx
                .try_read(&format!("{home}/{}", layout::LABEL))?
                .map(lossy)
                .filter(|l| !l.is_empty());
            let addrs = tx.try_read(&format!("{home}/{}", layout::ADVERT_ADDRS))?;
            let version = tx.try_read(&format!("{home}/{}", layout::ADVERT_VERSION))?;
            let advert = addrs.map(|a| AdvertRaw {
                addrs: lossy(a),
                version: version.map(lossy).unwrap_or_default(),
            });
            doms.push(Dom {
                domid,
                uuid,
                label,
                advert,
            });
        }
        let marked = match tx.directory(layout::TOOL_AWAY) {
            Ok(v) => v,
            Err(e) if e.is(XsErrno::NoEnt) => Vec::new(),
            Err(e) => return Err(e),
        };
        let mut away = HashMap::new();
        for uuid in marked {
            if let Some(dest) = tx.try_read(&format!("{}/{uuid}", layout::TOOL_AWAY))? {
                let dest = lossy(dest);
                // An empty label would make the guest "away" to nowhere;
                // treat it as this host.
                if !dest.is_empty() {
                    away.insert(uuid.to_ascii_lowercase(), dest);
                }
            }
        }
        Ok(Scan { doms, away })
    }

    fn same_tenant(&self, a: &Dom, b: &Dom) -> bool {
        match (&a.label, &b.label) {
            (Some(x), Some(y)) => x == y,
            (None, None) => !self.cfg.require_label,
            _ => false,
        }
    }

    fn host_name(&self) -> String {
        self.cfg.host_name.clone().unwrap_or_else(local_host_name)
    }

    /// One full pass: scan every guest, write the tables that changed and
    /// the link directories of pairs that began or ended, all in one
    /// transaction, so that guests see a departure (entry gone, `moved`
    /// noted, link directories withdrawn) or a return (entries and link
    /// directories back) as one change. Returns how many tables were
    /// written.
    pub fn sync(&mut self) -> Result<usize, XsError> {
        let Scan { mut doms, away } = self.scan()?;
        // Adverts across same-host migration (see the module docs).
        for d in &mut doms {
            match &d.advert {
                Some(a) => {
                    self.adverts.insert(d.uuid.clone(), a.clone());
                    self.carried.remove(&d.domid);
                }
                None => {
                    let migrated = self.seen.get(&d.uuid).is_some_and(|&old| old != d.domid);
                    if migrated {
                        if let Some(a) = self.adverts.get(&d.uuid) {
                            self.carried.insert(d.domid, a.clone());
                        }
                    }
                    d.advert = self.carried.get(&d.domid).cloned();
                }
            }
        }
        let live: HashMap<DomId, &Dom> = doms.iter().map(|d| (d.domid, d)).collect();
        self.carried.retain(|domid, _| live.contains_key(domid));
        self.adverts
            .retain(|uuid, _| doms.iter().any(|d| &d.uuid == uuid));
        // The newest instance of each UUID.
        let mut newest: HashMap<&str, &Dom> = HashMap::new();
        for d in &doms {
            let e = newest.entry(d.uuid.as_str()).or_insert(d);
            if d.domid > e.domid {
                *e = d;
            }
        }
        let here = self.host_name();
        let mut plans: Vec<(DomId, Option<Table>, Table)> = Vec::new();
        let mut tables: HashMap<DomId, BTreeSet<DomId>> = HashMap::new();
        for g in &doms {
            // Where the guest is as far as its peers are concerned: here
            // (None) or the host an away marking names. Only guests in the
            // same place are co-resident.
            let g_at = away.get(&g.uuid);
            let mut t = Table::default();
            for p in newest.values() {
                if p.uuid == g.uuid || !self.same_tenant(g, p) || away.get(&p.uuid) != g_at {
                    continue;
                }
                if let Some(a) = &p.advert {
                    t.entries.insert(p.domid, (p.uuid.clone(), a.clone()));
                }
            }
            if g.advert.is_some() {
                tables.insert(g.domid, t.entries.keys().copied().collect());
            }
            let old = self.published.get(&g.domid).cloned();
            // Peers that left for another host, or for good.
            if let Some(old) = &old {
                t.moved = old.moved.clone();
                t.gone = old.gone.clone();
                t.gone.retain(|domid, _| !live.contains_key(domid));
                for (&old_domid, (uuid, _)) in &old.entries {
                    if t.entries.values().any(|(u, _)| u == uuid) {
                        continue;
                    }
                    let dest = match newest.get(uuid.as_str()) {
                        // Still on this host but separated by an away
                        // marking: the peer's destination, or, when the
                        // guest itself is the one marked away, this host.
                        Some(p) => away
                            .get(&p.uuid)
                            .cloned()
                            .or_else(|| g_at.map(|_| here.clone())),
                        None => {
                            let note = self
                                .xs
                                .try_read(&format!("{}/{uuid}", layout::TOOL_MOVED))?
                                .map(lossy);
                            // No instance of it is left and no move is
                            // noted: the domain was released (destroyed,
                            // crashed, or saved: dom0 cannot tell, the
                            // guest can, see layout::GONE).
                            if note.is_none() && !live.contains_key(&old_domid) {
                                t.gone.insert(old_domid, uuid.clone());
                            }
                            note
                        }
                    };
                    if let Some(dest) = dest {
                        t.moved.insert(uuid.clone(), dest);
                    }
                }
                t.moved
                    .retain(|uuid, _| !t.entries.values().any(|(u, _)| u == uuid));
            }
            if old.as_ref() == Some(&t) {
                continue;
            }
            plans.push((g.domid, old, t));
        }
        let mut pairs = BTreeSet::new();
        for (&a, peers) in &tables {
            for &b in peers {
                if a < b && tables.get(&b).is_some_and(|t| t.contains(&a)) {
                    pairs.insert((a, b));
                }
            }
        }
        let new_pairs: Vec<(DomId, DomId)> = pairs.difference(&self.links).copied().collect();
        let ended_pairs: Vec<(DomId, DomId)> = self.links.difference(&pairs).copied().collect();
        if plans.is_empty() && new_pairs.is_empty() && ended_pairs.is_empty() {
            self.published.retain(|d, _| live.contains_key(d));
            self.seen = doms.iter().map(|d| (d.uuid.clone(), d.domid)).collect();
            return Ok(0);
        }
        let (written, made) = self.xs.transaction(|tx| {
            let mut written = Vec::new();
            for (g, old, new) in &plans {
                if Self::publish_in(tx, *g, old.as_ref(), new)? {
                    written.push(*g);
                }
            }
            let mut made = Vec::new();
            for &(a, b) in &new_pairs {
                if Self::make_link_dirs_in(tx, a, b)? {
                    made.push((a, b));
                }
            }
            for &(a, b) in &ended_pairs {
                for (owner, peer) in [(a, b), (b, a)] {
                    match tx.rm(&link_dir(owner, peer)) {
                        Ok(()) => {}
                        Err(e) if e.is(XsErrno::NoEnt) => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            Ok((written, made))
        })?;
        for (g, _, new) in plans {
            if written.contains(&g) {
                self.published.insert(g, new);
            }
        }
        self.links.extend(made);
        for pair in &ended_pairs {
            self.links.remove(pair);
        }
        self.published.retain(|d, _| live.contains_key(d));
        self.seen = doms.iter().map(|d| (d.uuid.clone(), d.domid)).collect();
        Ok(written.len())
    }

    /// Link directories: for every pair of advertised guests that list
    /// each other, `/local/domain/<A>/data/xensock/link/<B>` owned by A and
    /// readable by B, and the same the other way, both made in the pass's
    /// transaction. A guest's kernel cannot set XenStore permissions (the
    /// AF_XEN module relies on these), and a guest acts as soon as the
    /// directory appears, so it must be born with its final permissions
    /// and its counterpart. Returns false, making nothing, when one of
    /// the two is no longer advertised (it went away meanwhile; never
    /// recreate a released home).
    fn make_link_dirs_in(tx: &Transaction, a: DomId, b: DomId) -> Result<bool, XsError> {
        for owner in [a, b] {
            let advert = format!("{}/{}", layout::home(owner), layout::ADVERT);
            if tx.try_read(&advert)?.is_none() {
                return Ok(false);
            }
        }
        for (owner, peer) in [(a, b), (b, a)] {
            let dir = link_dir(owner, peer);
            if tx.try_read(&dir)?.is_some() {
                // Made earlier (by us before a restart, or by the guest
                // itself, with the same permissions): keep it.
                continue;
            }
            tx.mkdir(&dir)?;
            tx.set_perms(
                &dir,
                &[
                    Perm::new(PermAccess::None, u32::from(owner)),
                    Perm::new(PermAccess::Read, u32::from(peer)),
                ],
            )?;
        }
        Ok(true)
    }

    /// Writes guest `g`'s table inside `tx`. Returns false, writing
    /// nothing, when the guest's home is gone (never recreate a released
    /// home).
    fn publish_in(
        tx: &Transaction,
        g: DomId,
        old: Option<&Table>,
        new: &Table,
    ) -> Result<bool, XsError> {
        let home = layout::home(g);
        let base = format!("{home}/{}", layout::XENSOCK);
        let peers = format!("{base}/{}", layout::PEERS);
        let moved = format!("{base}/{}", layout::MOVED);
        let gone = format!("{base}/{}", layout::GONE);
        let perms = [
            Perm::new(PermAccess::None, 0),
            Perm::new(PermAccess::Read, u32::from(g)),
        ];
        if tx.try_read(&home)?.is_none() {
            return Ok(false);
        }
        match old {
            None => {
                // First table since the agent started: start clean.
                tx.mkdir(&base)?;
                tx.rm(&peers)?;
                tx.rm(&moved)?;
                tx.rm(&gone)?;
                tx.set_perms(&base, &perms)?;
                tx.mkdir(&peers)?;
                tx.set_perms(&peers, &perms)?;
            }
            Some(old) => {
                for domid in old.entries.keys() {
                    if !new.entries.contains_key(domid) {
                        tx.rm(&format!("{peers}/{domid}"))?;
                    }
                }
                for uuid in old.moved.keys() {
                    if !new.moved.contains_key(uuid) {
                        tx.rm(&format!("{moved}/{uuid}"))?;
                    }
                }
                for domid in old.gone.keys() {
                    if !new.gone.contains_key(domid) {
                        tx.rm(&format!("{gone}/{domid}"))?;
                    }
                }
            }
        }
        for (domid, (uuid, a)) in &new.entries {
            let prev = old.and_then(|o| o.entries.get(domid));
            if prev == Some(&(uuid.clone(), a.clone())) {
                continue;
            }
            let entry = format!("{peers}/{domid}");
            let values = [
                (peer_node::UUID, uuid.as_str()),
                (peer_node::ADDRS, a.addrs.as_str()),
                (peer_node::VERSION, a.version.as_str()),
            ];
            for (node, value) in values {
                tx.write(&format!("{entry}/{node}"), value)?;
            }
            tx.set_perms(&entry, &perms)?;
            for (node, _) in values {
                tx.set_perms(&format!("{entry}/{node}"), &perms)?;
            }
        }
        for (uuid, dest) in &new.moved {
            if old.and_then(|o| o.moved.get(uuid)) != Some(dest) {
                let node = format!("{moved}/{uuid}");
                tx.write(&node, dest)?;
                tx.set_perms(&moved, &perms)?;
                tx.set_perms(&node, &perms)?;
            }
        }
        for (domid, uuid) in &new.gone {
            if old.and_then(|o| o.gone.get(domid)) != Some(uuid) {
                let node = format!("{gone}/{domid}");
                tx.write(&node, uuid)?;
                tx.set_perms(&gone, &perms)?;
                tx.set_perms(&node, &perms)?;
            }
        }
        Ok(true)
    }

    /// Follows XenStore until `stop` is set: a full pass at start, then one
    /// after every burst of relevant events.
    pub fn run(mut self, stop: &AtomicBool) -> Result<(), XsError> {
        let mut w = self.xs.watch_paths(&[
            "@introduceDomain",
            "@releaseDomain",
            layout::DOMAINS,
            layout::TOOL_AWAY,
        ])?;
        self.sync()?;
        while !stop.load(Ordering::Acquire) {
            let Some(ev) = w.recv_timeout(Duration::from_millis(100))? else {
                continue;
            };
            let mut dirty = relevant(&ev.path);
            while let Some(ev) = w.try_recv()? {
                dirty |= relevant(&ev.path);
            }
            if dirty {
                if let Err(e) = self.sync() {
                    tracing::warn!("agent pass failed: {e}");
                }
            }
        }
        Ok(())
    }

    /// Runs the agent on a thread until the handle is dropped.
    pub fn spawn(xs: XsClient, cfg: AgentConfig) -> Result<AgentHandle, XsError> {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let agent = Agent::new(xs, cfg);
        let thread = std::thread::Builder::new()
            .name("xensock-agent".into())
            .spawn(move || {
                if let Err(e) = agent.run(&s) {
                    tracing::error!("xensock-agent stopped: {e}");
                }
            })
            .map_err(XsError::Io)?;
        Ok(AgentHandle {
            stop,
            thread: Some(thread),
        })
    }
}

/// The UUID of a domain named by domid or UUID (as `xl` users name
/// them): a UUID is taken as it is (lowercased), a domid is looked up in
/// its `vm` node.
pub fn domain_uuid(xs: &XsClient, domain: &str) -> Result<String, XsError> {
    let lower = domain.to_ascii_lowercase();
    if layout::is_uuid(&lower) {
        return Ok(lower);
    }
    let invalid = |why: &str| {
        XsError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("{domain}: {why}"),
        ))
    };
    let domid: DomId = domain
        .parse()
        .map_err(|_| invalid("neither a domid nor a UUID"))?;
    let vm = lossy(xs.read(&format!("{}/vm", layout::home(domid)))?);
    let uuid = vm.rsplit('/').next().unwrap_or("").to_ascii_lowercase();
    if layout::is_uuid(&uuid) {
        Ok(uuid)
    } else {
        Err(invalid("its vm node names no UUID"))
    }
}

/// Marks the domain with this UUID as moved to `host` while it stays here
/// (`/tool/xensock/away/<uuid>`): a running agent separates it from its
/// peers as if it had left. Dom0 only.
pub fn mark_away(xs: &XsClient, uuid: &str, host: &str) -> Result<(), XsError> {
    if host.is_empty() || !layout::is_uuid(uuid) {
        return Err(XsError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "mark_away needs a UUID and a non-empty host label",
        )));
    }
    xs.write(&format!("{}/{uuid}", layout::TOOL_AWAY), host)
}

/// Removes the away marking of the domain with this UUID: a running
/// agent makes it co-resident with its peers again. Not marked: no-op.
pub fn mark_back(xs: &XsClient, uuid: &str) -> Result<(), XsError> {
    match xs.rm(&format!("{}/{uuid}", layout::TOOL_AWAY)) {
        Err(e) if e.is(XsErrno::NoEnt) => Ok(()),
        r => r,
    }
}

/// A running agent thread; dropping it stops the agent.
pub struct AgentHandle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for AgentHandle {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relevant_paths() {
        for p in [
            "@introduceDomain",
            "@releaseDomain",
            "/local/domain",
            "/local/domain/3",
            "/local/domain/3/vm",
            "/local/domain/3/xensock/label",
            "/local/domain/3/data/xensock",
            "/local/domain/3/data/xensock/addrs",
            "/tool/xensock/away",
            "/tool/xensock/away/6f1c0b8e-9d3a-4b2e-8f00-0123456789ab",
        ] {
            assert!(relevant(p), "{p}");
        }
        for p in [
            "/local/domain/3/xensock/peers/4/addrs",
            "/local/domain/3/xensock/moved/x",
            "/local/domain/3/data/other",
            "/local/domain/3/data/xensock/link",
            "/local/domain/3/data/xensock/link/4/state",
            "/tool/xensock",
            "/tool/xensock/moved/6f1c0b8e-9d3a-4b2e-8f00-0123456789ab",
            "/tool/xensock/awayx",
        ] {
            assert!(!relevant(p), "{p}");
        }
    }
}
