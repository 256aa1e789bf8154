// SPDX-License-Identifier: MIT OR Apache-2.0
//! The XenStore tree of the simulated xenstored: nodes, Xen's permission
//! model, quotas and transaction snapshots. Pure data, no I/O; the server in
//! `xenstored.rs` drives it.
//!
//! Semantics follow the C xenstored (read to learn, not copied):
//! - the first permission entry names the owner and the access of every
//!   domain not listed; later entries give listed domains their access; the
//!   owner and privileged domains (dom0) have full access;
//! - a failure is reported as `EACCES` rather than `ENOENT` when the nearest
//!   existing ancestor does not grant the access asked for, so a domain
//!   learns nothing about nodes it may not see;
//! - new nodes inherit their parent's permissions, except that nodes created
//!   by an unprivileged domain are owned by it;
//! - transactions work on a snapshot; at commit every node the transaction
//!   looked at must be unchanged, otherwise the commit fails with `EAGAIN`.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use xensock_xenif::xs_wire::{Perm, PermAccess, XsErrno};

/// Read permission bit.
pub(crate) const PERM_READ: u8 = 1;
/// Write permission bit.
pub(crate) const PERM_WRITE: u8 = 2;
/// Owner bit (may change permissions).
pub(crate) const PERM_OWNER: u8 = 4;

/// Per-domain limits, with the C xenstored's defaults. They apply to
/// unprivileged domains only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quotas {
    /// Nodes a domain may own (`-E`, 1000). Exceeding it: `ENOSPC`.
    pub nodes_per_domain: usize,
    /// Maximum stored size of one node: header, permissions, value and
    /// children names (`-S`, 2048). Exceeding it: `ENOSPC`.
    pub max_entry_size: usize,
    /// Open transactions per connection (`-t`, 10). Exceeding it: `ENOSPC`.
    pub transactions_per_connection: usize,
    /// Watches per domain (`-W`, 128). Exceeding it: `E2BIG`.
    pub watches_per_domain: usize,
    /// Permission entries per node (`-A`, 5). Exceeding it: `ENOSPC`.
    pub perms_per_node: usize,
    /// Path length below `/local/domain/<id>/` (`-M`, 2048). Longer: `EINVAL`.
    pub max_path_len: usize,
}

impl Default for Quotas {
    fn default() -> Quotas {
        Quotas {
            nodes_per_domain: 1000,
            max_entry_size: 2048,
            transactions_per_connection: 10,
            watches_per_domain: 128,
            perms_per_node: 5,
            max_path_len: xensock_xenif::xs_wire::REL_PATH_MAX,
        }
    }
}

/// Who is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Caller {
    pub domid: u32,
    pub privileged: bool,
}

impl Caller {
    pub(crate) fn dom0() -> Caller {
        Caller {
            domid: 0,
            privileged: true,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Node {
    pub value: Vec<u8>,
    pub perms: Vec<Perm>,
    pub children: Vec<String>,
    pub generation: u64,
}

impl Node {
    /// Approximation of the node's size in the C xenstored's database, for
    /// the entry-size quota: record header, permissions, value, children.
    fn stored_size(&self) -> usize {
        24 + 8 * self.perms.len()
            + self.value.len()
            + self.children.iter().map(|c| c.len() + 1).sum::<usize>()
    }
}

/// A change that may fire watches.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fire {
    pub path: String,
    /// Only watches on exactly this path fire (deleted descendants).
    pub exact: bool,
    /// Permissions of the node (before deletion, for removals).
    pub perms: Vec<Perm>,
    /// Permissions of its parent.
    pub parent_perms: Option<Vec<Perm>>,
    /// Permissions before a SET_PERMS.
    pub old_perms: Option<Vec<Perm>>,
}

#[derive(Debug, Clone, Default)]
struct TxLog {
    /// Generation of each node the transaction looked at, when it first
    /// looked (None: it did not exist).
    accessed: HashMap<String, Option<u64>>,
    /// Nodes the transaction created, changed or removed.
    modified: HashSet<String>,
}

#[derive(Debug, Clone)]
pub(crate) struct Store {
    nodes: HashMap<String, Node>,
    generation: u64,
    owned: HashMap<u32, usize>,
    log: Option<RefCell<TxLog>>,
}

/// Access bits `caller` has on a node with `perms`.
pub(crate) fn perm_bits(c: Caller, perms: &[Perm]) -> u8 {
    let Some(owner) = perms.first() else {
        return 0;
    };
    if c.privileged || owner.domid == c.domid {
        return PERM_READ | PERM_WRITE | PERM_OWNER;
    }
    let access = perms[1..]
        .iter()
        .find(|p| p.domid == c.domid)
        .map(|p| p.access)
        .unwrap_or(owner.access);
    let mut bits = 0;
    if access.can_read() {
        bits |= PERM_READ;
    }
    if access.can_write() {
        bits |= PERM_WRITE;
    }
    bits
}

/// `/local/domain/<id>` for a domain.
pub(crate) fn domain_home(domid: u32) -> String {
    format!("/local/domain/{domid}")
}

/// Makes a path absolute: relative paths are below the caller's home;
/// absolute and special (`@...`) paths are unchanged.
pub(crate) fn canonicalize(domid: u32, path: &str) -> String {
    if path.starts_with('/') || path.starts_with('@') {
        path.to_string()
    } else {
        format!("{}/{}", domain_home(domid), path)
    }
}

/// The xenstored node-name rules.
pub(crate) fn is_valid_path(path: &str, max_rel_len: usize) -> bool {
    if !path.starts_with('/') {
        return false;
    }
    if path.len() > 1 && path.ends_with('/') {
        return false;
    }
    if path.contains("//") {
        return false;
    }
    if !path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-/_@".contains(&b))
    {
        return false;
    }
    // Paths below a domain's home may be max_rel_len long after the prefix.
    let mut prefix = 0;
    if let Some(rest) = path.strip_prefix("/local/domain/") {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if (1..=5).contains(&digits) && rest.as_bytes().get(digits) == Some(&b'/') {
            prefix = "/local/domain/".len() + digits + 1;
        }
    }
    path.len() <= prefix + max_rel_len
}

/// Parent of an absolute path; None for the root.
pub(crate) fn parent(path: &str) -> Option<&str> {
    if path == "/" {
        return None;
    }
    match path.rfind('/') {
        Some(0) => Some("/"),
        Some(i) => Some(&path[..i]),
        None => None,
    }
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn join(parent: &str, child: &str) -> String {
    if parent == "/" {
        format!("/{child}")
    } else {
        format!("{parent}/{child}")
    }
}

/// Is `child` equal to `parent` or below it?
pub(crate) fn is_child(child: &str, parent: &str) -> bool {
    if parent == "/" {
        return true;
    }
    match child.strip_prefix(parent) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

impl Store {
    /// The initial tree of a freshly started xenstored: `/`, `/tool`,
    /// `/tool/xenstored`, `/local`, `/local/domain`, all owned by dom0 with
    /// no access for anyone else.
    pub(crate) fn new() -> Store {
        let mut s = Store {
            nodes: HashMap::new(),
            generation: 0,
            owned: HashMap::new(),
            log: None,
        };
        let tree: [(&str, &[&str]); 5] = [
            ("/", &["tool", "local"]),
            ("/tool", &["xenstored"]),
            ("/tool/xenstored", &[]),
            ("/local", &["domain"]),
            ("/local/domain", &[]),
        ];
        for (path, children) in tree {
            s.nodes.insert(
                path.to_string(),
                Node {
                    value: Vec::new(),
                    perms: vec![Perm::new(PermAccess::None, 0)],
                    children: children.iter().map(|c| c.to_string()).collect(),
                    generation: 0,
                },
            );
        }
        s.owned.insert(0, s.nodes.len());
        s
    }

    fn node(&self, path: &str) -> Option<&Node> {
        let n = self.nodes.get(path);
        if let Some(log) = &self.log {
            log.borrow_mut()
                .accessed
                .entry(path.to_string())
                .or_insert(n.map(|n| n.generation));
        }
        n
    }

    fn touch(&mut self, path: &str) {
        if let Some(log) = &self.log {
            // A node changed before the transaction looked at it counts as
            // looked at, with its generation from before the change.
            let before = self.nodes.get(path).map(|n| n.generation);
            log.borrow_mut()
                .accessed
                .entry(path.to_string())
                .or_insert(before);
        }
        self.generation += 1;
        let g = self.generation;
        if let Some(n) = self.nodes.get_mut(path) {
            n.generation = g;
        }
        if let Some(log) = &self.log {
            log.borrow_mut().modified.insert(path.to_string());
        }
    }

    fn count_owned(&mut self, owner: u32, delta: isize) {
        let e = self.owned.entry(owner).or_insert(0);
        *e = e.saturating_add_signed(delta);
    }

    /// Nodes owned by `domid`.
    pub(crate) fn owned_by(&self, domid: u32) -> usize {
        self.owned.get(&domid).copied().unwrap_or(0)
    }

    /// Number of nodes.
    pub(crate) fn len(&self) -> usize {
        self.nodes.len()
    }

    fn errno_from_parents(&self, c: Caller, path: &str, err: XsErrno, need: u8) -> XsErrno {
        let mut p = parent(path);
        while let Some(pp) = p {
            if let Some(n) = self.node(pp) {
                return if perm_bits(c, &n.perms) & need != 0 {
                    err
                } else {
                    XsErrno::Acces
                };
            }
            p = parent(pp);
        }
        XsErrno::Acces
    }

    fn get_node(&self, c: Caller, q: &Quotas, path: &str, need: u8) -> Result<&Node, XsErrno> {
        if !is_valid_path(path, q.max_path_len) {
            return Err(XsErrno::Inval);
        }
        match self.node(path) {
            Some(n) if perm_bits(c, &n.perms) & need == need => Ok(n),
            Some(_) => Err(self.errno_from_parents(c, path, XsErrno::Acces, need)),
            None => Err(self.errno_from_parents(c, path, XsErrno::NoEnt, need)),
        }
    }

    fn parent_perms(&self, path: &str) -> Option<Vec<Perm>> {
        parent(path)
            .and_then(|p| self.nodes.get(p))
            .map(|n| n.perms.clone())
    }

    fn fire(&self, path: &str, exact: bool, old_perms: Option<Vec<Perm>>) -> Fire {
        Fire {
            path: path.to_string(),
            exact,
            perms: self
                .nodes
                .get(path)
                .map(|n| n.perms.clone())
                .unwrap_or_default(),
            parent_perms: self.parent_perms(path),
            old_perms,
        }
    }

    /// Creates `path` and any missing ancestors. All or nothing.
    fn create_node(
        &mut self,
        c: Caller,
        q: &Quotas,
        path: &str,
        value: Vec<u8>,
    ) -> Result<(), XsErrno> {
        // Missing nodes, deepest first, and the nearest existing ancestor.
        let mut missing = vec![path.to_string()];
        let mut cur = path;
        let existing = loop {
            let Some(p) = parent(cur) else {
                return Err(XsErrno::Inval);
            };
            if self.node(p).is_some() {
                break p.to_string();
            }
            missing.push(p.to_string());
            cur = p;
        };
        missing.reverse();
        let Some(top) = self.nodes.get(&existing) else {
            return Err(XsErrno::Inval);
        };
        let mut perms = top.perms.clone();
        if !c.privileged {
            perms[0].domid = c.domid;
            // Quota checks before changing anything.
            if self.owned_by(c.domid) + missing.len() > q.nodes_per_domain {
                return Err(XsErrno::NoSpc);
            }
            let mut grown = top.clone();
            grown.children.push(basename(&missing[0]).to_string());
            if grown.stored_size() >= q.max_entry_size {
                return Err(XsErrno::NoSpc);
            }
            let probe = Node {
                value: value.clone(),
                perms: perms.clone(),
                children: Vec::new(),
                generation: 0,
            };
            if probe.stored_size() >= q.max_entry_size {
                return Err(XsErrno::NoSpc);
            }
        }
        let owner = perms[0].domid;
        let mut parent_path = existing;
        let last = missing.len() - 1;
        for (i, p) in missing.iter().enumerate() {
            if let Some(par) = self.nodes.get_mut(&parent_path) {
                par.children.push(basename(p).to_string());
            }
            self.touch(&parent_path);
            self.nodes.insert(
                p.clone(),
                Node {
                    value: if i == last { value.clone() } else { Vec::new() },
                    perms: perms.clone(),
                    children: Vec::new(),
                    generation: 0,
                },
            );
            self.count_owned(owner, 1);
            self.touch(p);
            parent_path = p.clone();
        }
        Ok(())
    }

    pub(crate) fn read(&self, c: Caller, q: &Quotas, path: &str) -> Result<Vec<u8>, XsErrno> {
        self.get_node(c, q, path, PERM_READ)
            .map(|n| n.value.clone())
    }

    pub(crate) fn directory(
        &self,
        c: Caller,
        q: &Quotas,
        path: &str,
    ) -> Result<(Vec<String>, u64), XsErrno> {
        self.get_node(c, q, path, PERM_READ)
            .map(|n| (n.children.clone(), n.generation))
    }

    pub(crate) fn get_perms(
        &self,
        c: Caller,
        q: &Quotas,
        path: &str,
    ) -> Result<Vec<Perm>, XsErrno> {
        self.get_node(c, q, path, PERM_READ)
            .map(|n| n.perms.clone())
    }

    /// Raw existence check, no permissions.
    #[cfg(test)]
    pub(crate) fn exists(&self, path: &str) -> bool {
        self.node(path).is_some()
    }

    pub(crate) fn write(
        &mut self,
        c: Caller,
        q: &Quotas,
        path: &str,
        value: &[u8],
    ) -> Result<Vec<Fire>, XsErrno> {
        match self.get_node(c, q, path, PERM_WRITE) {
            Ok(n) => {
                if !c.privileged {
                    let mut probe = n.clone();
                    probe.value = value.to_vec();
                    if probe.stored_size() >= q.max_entry_size {
                        return Err(XsErrno::NoSpc);
                    }
                }
                if let Some(n) = self.nodes.get_mut(path) {
                    n.value = value.to_vec();
                }
                self.touch(path);
            }
            Err(XsErrno::NoEnt) => self.create_node(c, q, path, value.to_vec())?,
            Err(e) => return Err(e),
        }
        Ok(vec![self.fire(path, false, None)])
    }

    pub(crate) fn mkdir(
        &mut self,
        c: Caller,
        q: &Quotas,
        path: &str,
    ) -> Result<Vec<Fire>, XsErrno> {
        match self.get_node(c, q, path, PERM_WRITE) {
            Ok(_) => Ok(Vec::new()),
            Err(XsErrno::NoEnt) => {
                self.create_node(c, q, path, Vec::new())?;
                Ok(vec![self.fire(path, false, None)])
            }
            Err(e) => Err(e),
        }
    }

    pub(crate) fn rm(&mut self, c: Caller, q: &Quotas, path: &str) -> Result<Vec<Fire>, XsErrno> {
        match self.get_node(c, q, path, PERM_WRITE) {
            Ok(_) => {}
            Err(XsErrno::NoEnt) => {
                // Removing something absent is fine if its parent exists.
                return match parent(path) {
                    Some(p) if self.node(p).is_some() => Ok(Vec::new()),
                    _ => Err(XsErrno::NoEnt),
                };
            }
            Err(e) => return Err(e),
        }
        if path == "/" {
            return Err(XsErrno::Inval);
        }
        let mut fires = vec![self.fire(path, false, None)];
        self.delete_subtree(path, &mut fires);
        if let Some(p) = parent(path) {
            let base = basename(path);
            if let Some(par) = self.nodes.get_mut(p) {
                par.children.retain(|ch| ch != base);
            }
            self.touch(p);
        }
        Ok(fires)
    }

    fn delete_subtree(&mut self, path: &str, fires: &mut Vec<Fire>) {
        let children = self
            .node(path)
            .map(|n| n.children.clone())
            .unwrap_or_default();
        for ch in children {
            self.delete_subtree(&join(path, &ch), fires);
        }
        fires.push(self.fire(path, true, None));
        if let Some(n) = self.nodes.remove(path) {
            self.count_owned(n.perms[0].domid, -1);
        }
        if let Some(log) = &self.log {
            log.borrow_mut().modified.insert(path.to_string());
        }
    }

    pub(crate) fn set_perms(
        &mut self,
        c: Caller,
        q: &Quotas,
        path: &str,
        perms: Vec<Perm>,
    ) -> Result<Vec<Fire>, XsErrno> {
        if perms.is_empty() {
            return Err(XsErrno::Inval);
        }
        if !c.privileged && perms.len() > q.perms_per_node {
            return Err(XsErrno::NoSpc);
        }
        let n = self.get_node(c, q, path, PERM_WRITE | PERM_OWNER)?;
        if !c.privileged && perms[0].domid != n.perms[0].domid {
            return Err(XsErrno::Perm);
        }
        let old = n.perms.clone();
        self.count_owned(old[0].domid, -1);
        self.count_owned(perms[0].domid, 1);
        if let Some(n) = self.nodes.get_mut(path) {
            n.perms = perms;
        }
        self.touch(path);
        Ok(vec![self.fire(path, false, Some(old))])
    }

    /// Privileged (host/toolstack) write that also sets permissions.
    pub(crate) fn tool_write(
        &mut self,
        path: &str,
        value: &[u8],
        perms: &[Perm],
    ) -> Result<Vec<Fire>, XsErrno> {
        let q = Quotas::default();
        let mut fires = self.write(Caller::dom0(), &q, path, value)?;
        fires.extend(self.set_perms(Caller::dom0(), &q, path, perms.to_vec())?);
        Ok(fires)
    }

    /// After a domain died: nodes it owned pass to dom0 and ACL entries
    /// naming it are dropped, so a later domain with the same id inherits
    /// nothing (as xenstored does since XSA-322).
    pub(crate) fn forget_domain(&mut self, domid: u32) {
        let mut moved = 0;
        for n in self.nodes.values_mut() {
            if n.perms[0].domid == domid {
                n.perms[0].domid = 0;
                moved += 1;
            }
            let owner = n.perms[0];
            let mut rest: Vec<Perm> = n.perms[1..]
                .iter()
                .copied()
                .filter(|p| p.domid != domid)
                .collect();
            rest.insert(0, owner);
            n.perms = rest;
        }
        self.owned.remove(&domid);
        self.count_owned(0, moved);
    }

    /// A snapshot for a transaction.
    pub(crate) fn begin_transaction(&self) -> Store {
        let mut s = self.clone();
        s.log = Some(RefCell::new(TxLog::default()));
        s
    }

    /// Applies a transaction snapshot if nothing it looked at changed
    /// meanwhile; otherwise `EAGAIN`.
    pub(crate) fn commit(&mut self, tx: Store) -> Result<(), XsErrno> {
        let Some(log) = tx.log else {
            return Err(XsErrno::Inval);
        };
        let log = log.into_inner();
        for (path, gen) in &log.accessed {
            if self.nodes.get(path).map(|n| n.generation) != *gen {
                return Err(XsErrno::Again);
            }
        }
        let mut modified: Vec<&String> = log.modified.iter().collect();
        modified.sort();
        for path in modified {
            if let Some(old) = self.nodes.remove(path.as_str()) {
                self.count_owned(old.perms[0].domid, -1);
            }
            if let Some(n) = tx.nodes.get(path.as_str()) {
                self.count_owned(n.perms[0].domid, 1);
                self.nodes.insert(path.clone(), n.clone());
                self.touch(path);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dom(id: u32) -> Caller {
        Caller {
            domid: id,
            privileged: false,
        }
    }
    const D0: Caller = Caller {
        domid: 0,
        privileged: true,
    };

    fn q() -> Quotas {
        Quotas::default()
    }

    fn home(s: &mut Store, id: u32) {
        s.tool_write(
            &domain_home(id),
            b"",
            &[
                Perm::new(PermAccess::None, 0),
                Perm::new(PermAccess::Read, id),
            ],
        )
        .unwrap();
        s.tool_write(
            &format!("{}/data", domain_home(id)),
            b"",
            &[Perm::new(PermAccess::None, id)],
        )
        .unwrap();
    }

    #[test]
    fn write_creates_parents_and_reads_back() {
        let mut s = Store::new();
        s.write(D0, &q(), "/a/b/c", b"v").unwrap();
        assert_eq!(s.read(D0, &q(), "/a/b/c").unwrap(), b"v");
        assert_eq!(s.read(D0, &q(), "/a/b").unwrap(), b"");
        assert_eq!(s.directory(D0, &q(), "/a").unwrap().0, vec!["b"]);
        assert_eq!(s.read(D0, &q(), "/a/x"), Err(XsErrno::NoEnt));
        assert_eq!(s.read(D0, &q(), "a"), Err(XsErrno::Inval));
        assert_eq!(s.read(D0, &q(), "/a/"), Err(XsErrno::Inval));
        assert_eq!(s.read(D0, &q(), "/a//b"), Err(XsErrno::Inval));
        assert_eq!(s.read(D0, &q(), "/a/b c"), Err(XsErrno::Inval));
    }

    #[test]
    fn domu_sees_only_what_permissions_allow() {
        let mut s = Store::new();
        home(&mut s, 1);
        home(&mut s, 2);
        // Own data subtree: read/write, new nodes owned by the domain.
        s.write(dom(1), &q(), "/local/domain/1/data/x", b"1")
            .unwrap();
        assert_eq!(
            s.get_perms(dom(1), &q(), "/local/domain/1/data/x").unwrap()[0],
            Perm::new(PermAccess::None, 1)
        );
        // Another domain's private node: EACCES for existing and missing ones.
        assert_eq!(
            s.read(dom(2), &q(), "/local/domain/1/data/x"),
            Err(XsErrno::Acces)
        );
        assert_eq!(
            s.read(dom(2), &q(), "/local/domain/1/data/nope"),
            Err(XsErrno::Acces)
        );
        assert_eq!(
            s.write(dom(2), &q(), "/local/domain/1/data/x", b"evil"),
            Err(XsErrno::Acces)
        );
        // Own missing node: ENOENT.
        assert_eq!(
            s.read(dom(1), &q(), "/local/domain/1/data/nope"),
            Err(XsErrno::NoEnt)
        );
        // Home is readable but not writable by the guest.
        assert_eq!(s.read(dom(1), &q(), "/local/domain/1").unwrap(), b"");
        assert_eq!(
            s.write(dom(1), &q(), "/local/domain/1/label", b"x"),
            Err(XsErrno::Acces)
        );
        // Cannot list /local/domain.
        assert_eq!(
            s.directory(dom(1), &q(), "/local/domain"),
            Err(XsErrno::Acces)
        );
    }

    #[test]
    fn acl_entries_and_owner_changes() {
        let mut s = Store::new();
        home(&mut s, 1);
        home(&mut s, 2);
        let p = "/local/domain/1/data/shared";
        s.write(dom(1), &q(), p, b"hi").unwrap();
        s.set_perms(
            dom(1),
            &q(),
            p,
            vec![
                Perm::new(PermAccess::None, 1),
                Perm::new(PermAccess::Read, 2),
            ],
        )
        .unwrap();
        assert_eq!(s.read(dom(2), &q(), p).unwrap(), b"hi");
        assert_eq!(s.write(dom(2), &q(), p, b"no"), Err(XsErrno::Acces));
        assert_eq!(s.read(dom(3), &q(), p), Err(XsErrno::Acces));
        // Unprivileged owner may not give the node away.
        assert_eq!(
            s.set_perms(dom(1), &q(), p, vec![Perm::new(PermAccess::Both, 2)]),
            Err(XsErrno::Perm)
        );
        // A reader may not change permissions.
        assert_eq!(
            s.set_perms(dom(2), &q(), p, vec![Perm::new(PermAccess::Both, 1)]),
            Err(XsErrno::Acces)
        );
        // Too many entries.
        let many = (0..6).map(|i| Perm::new(PermAccess::Read, i)).collect();
        assert_eq!(s.set_perms(dom(1), &q(), p, many), Err(XsErrno::NoSpc));
    }

    #[test]
    fn rm_semantics() {
        let mut s = Store::new();
        s.write(D0, &q(), "/a/b/c", b"").unwrap();
        let fires = s.rm(D0, &q(), "/a").unwrap();
        let paths: Vec<(&str, bool)> = fires.iter().map(|f| (f.path.as_str(), f.exact)).collect();
        assert_eq!(
            paths,
            vec![
                ("/a", false),
                ("/a/b/c", true),
                ("/a/b", true),
                ("/a", true)
            ]
        );
        assert!(!s.exists("/a/b"));
        assert_eq!(
            s.rm(D0, &q(), "/a"),
            Ok(vec![]),
            "absent child of existing parent"
        );
        assert_eq!(s.rm(D0, &q(), "/a/b"), Err(XsErrno::NoEnt));
        assert_eq!(s.rm(D0, &q(), "/"), Err(XsErrno::Inval));
    }

    #[test]
    fn node_quota() {
        let mut s = Store::new();
        home(&mut s, 1);
        // The guest already owns data/ itself.
        assert_eq!(s.owned_by(1), 1);
        let small = Quotas {
            nodes_per_domain: 4,
            ..Quotas::default()
        };
        for i in 0..3 {
            s.write(dom(1), &small, &format!("/local/domain/1/data/n{i}"), b"")
                .unwrap();
        }
        assert_eq!(
            s.write(dom(1), &small, "/local/domain/1/data/n3", b""),
            Err(XsErrno::NoSpc)
        );
        s.rm(dom(1), &small, "/local/domain/1/data/n0").unwrap();
        s.write(dom(1), &small, "/local/domain/1/data/n3", b"")
            .unwrap();
        // Entry size.
        assert_eq!(
            s.write(dom(1), &q(), "/local/domain/1/data/n1", &[b'x'; 2048]),
            Err(XsErrno::NoSpc)
        );
        // dom0 is not limited.
        s.write(D0, &small, "/local/domain/1/data/big", &[b'x'; 4000])
            .unwrap();
    }

    #[test]
    fn transactions_detect_conflicts() {
        let mut live = Store::new();
        live.write(D0, &q(), "/t/a", b"1").unwrap();
        let mut tx = live.begin_transaction();
        assert_eq!(tx.read(D0, &q(), "/t/a").unwrap(), b"1");
        tx.write(D0, &q(), "/t/b", b"2").unwrap();
        // Not visible outside before commit.
        assert_eq!(live.read(D0, &q(), "/t/b"), Err(XsErrno::NoEnt));
        live.commit(tx).unwrap();
        assert_eq!(live.read(D0, &q(), "/t/b").unwrap(), b"2");

        let mut tx = live.begin_transaction();
        tx.read(D0, &q(), "/t/a").unwrap();
        tx.write(D0, &q(), "/t/c", b"3").unwrap();
        live.write(D0, &q(), "/t/a", b"changed").unwrap();
        assert_eq!(live.commit(tx), Err(XsErrno::Again));
        assert!(!live.exists("/t/c"));

        // Reading a missing node that someone else creates conflicts too.
        let tx = live.begin_transaction();
        assert_eq!(tx.read(D0, &q(), "/t/new"), Err(XsErrno::NoEnt));
        live.write(D0, &q(), "/t/new", b"").unwrap();
        assert_eq!(live.commit(tx), Err(XsErrno::Again));

        // Removing one child and adding another (the parent is changed
        // before it is read) commits.
        live.write(D0, &q(), "/p/old", b"").unwrap();
        let mut tx = live.begin_transaction();
        tx.rm(D0, &q(), "/p/old").unwrap();
        tx.write(D0, &q(), "/p/new", b"").unwrap();
        live.commit(tx).unwrap();
        assert_eq!(live.directory(D0, &q(), "/p").unwrap().0, vec!["new"]);
        // ... and still conflicts when someone else changed the parent.
        let mut tx = live.begin_transaction();
        tx.rm(D0, &q(), "/p/new").unwrap();
        live.write(D0, &q(), "/p", b"changed").unwrap();
        assert_eq!(live.commit(tx), Err(XsErrno::Again));
        live.rm(D0, &q(), "/p").unwrap();

        // Removal inside a transaction applies at commit.
        let mut tx = live.begin_transaction();
        tx.rm(D0, &q(), "/t").unwrap();
        live.commit(tx).unwrap();
        assert!(!live.exists("/t/a"));
        assert_eq!(
            live.directory(D0, &q(), "/").unwrap().0,
            vec!["tool", "local"]
        );
    }

    #[test]
    fn forget_domain_hands_nodes_to_dom0() {
        let mut s = Store::new();
        home(&mut s, 1);
        s.write(dom(1), &q(), "/local/domain/1/data/x", b"")
            .unwrap();
        assert!(s.owned_by(1) > 0);
        s.forget_domain(1);
        assert_eq!(s.owned_by(1), 0);
        assert_eq!(
            s.get_perms(D0, &q(), "/local/domain/1").unwrap(),
            vec![Perm::new(PermAccess::None, 0)]
        );
        assert_eq!(
            s.read(dom(1), &q(), "/local/domain/1/data/x"),
            Err(XsErrno::Acces)
        );
    }

    #[test]
    fn path_rules() {
        assert!(is_valid_path("/", 2048));
        assert!(is_valid_path("/local/domain/3/data/x-y_z@w", 2048));
        assert!(!is_valid_path("", 2048));
        assert!(!is_valid_path("@introduceDomain", 2048));
        let long = format!("/local/domain/7/{}", "a".repeat(2048));
        assert!(is_valid_path(&long, 2048));
        assert!(!is_valid_path(&format!("{long}b"), 2048));
        assert_eq!(canonicalize(4, "data/x"), "/local/domain/4/data/x");
        assert_eq!(canonicalize(4, "/abs"), "/abs");
        assert!(is_child("/a/b", "/a"));
        assert!(is_child("/a", "/a"));
        assert!(!is_child("/ab", "/a"));
        assert!(is_child("/x", "/"));
        assert_eq!(parent("/a"), Some("/"));
        assert_eq!(parent("/a/b"), Some("/a"));
        assert_eq!(parent("/"), None);
    }
}
