// SPDX-License-Identifier: MIT OR Apache-2.0
//! Link lifecycle against XenStore: which paths the transport watches,
//! what an orderly shutdown leaves behind (nothing), and how a process
//! copes with the nodes a killed predecessor left.

mod common;
mod pattern;

use std::io::{self, BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use libxensock::{Config, Transport, XenStream};
use xensock_sim::{DomainConfig, SimHost};

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(-1)
}

fn link_node(owner: u16, peer: u16) -> String {
    format!("/local/domain/{owner}/data/xensock/link/{peer}")
}

fn peer_node_of(t: &Transport, peer: u16) -> String {
    link_node(peer, t.domid())
}

#[test]
fn with_the_agent_only_candidate_peers_are_watched() {
    let w = agent_world(config());
    let (a, db) = (&w.pair.a, &w.pair.db);
    let watched = a.status().watched;
    // No broad watch on /local/domain: the table names the candidates.
    assert!(!watched.iter().any(|p| p == "/local/domain"), "{watched:?}");
    assert!(
        watched.contains(&peer_node_of(a, db.domid)),
        "the peer's offer node is not watched: {watched:?}"
    );
    assert!(
        watched.contains(&format!("/local/domain/{}/xensock/peers", a.domid())),
        "{watched:?}"
    );
    // A guest of another tenant arrives: not a candidate, not reachable.
    let dc = w
        .pair
        .host
        .create_domain(DomainConfig::new("c").label("red"))
        .unwrap();
    advertise(&w.pair.host, &dc, "10.0.0.3");
    let t0 = Instant::now();
    let e = a.connect((u32::from(dc.domid), 80)).unwrap_err();
    assert_eq!(errno(&e), libc::EHOSTUNREACH);
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
    assert!(!a.status().watched.contains(&peer_node_of(a, dc.domid)));
    // Echo across the narrow watches.
    let l = w.pair.b.bind("xen:self:7").unwrap();
    let mut c = a.connect((u32::from(db.domid), 7)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    c.write_all(b"ping").unwrap();
    let mut buf = [0u8; 4];
    s.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ping");
}

#[test]
fn the_agent_makes_the_link_directories_of_each_pair() {
    let w = agent_world(config());
    let (da, db) = (w.pair.da.domid, w.pair.db.domid);
    for (owner, peer) in [(da, db), (db, da)] {
        let node = link_node(owner, peer);
        let perms = w.dom0.get_perms(&node).unwrap();
        assert_eq!(
            perms
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(","),
            format!("n{owner},r{peer}"),
            "{node}"
        );
    }
    // The transports use them as they are (owner and permissions kept).
    let l = w.pair.b.bind("xen:self:9").unwrap();
    let _c = w.pair.a.connect((u32::from(db), 9)).unwrap();
    let _s = l.accept().unwrap();
    let perms = w.dom0.get_perms(&link_node(da, db)).unwrap();
    assert_eq!(perms[0].to_string(), format!("n{da}"));
    // A guest cannot read the other's directory made for a third domain.
    let dc = w.pair.host.create_domain(DomainConfig::new("c")).unwrap();
    advertise(&w.pair.host, &dc, "10.0.0.3");
    wait_for_table(&w.dom0, &dc, &[da, db]);
    assert!(eventually(Duration::from_secs(10), || w
        .dom0
        .get_perms(&link_node(dc.domid, da))
        .is_ok()));
    let b_xs = xensock_discovery::xs::XsClient::open_path(w.pair.db.xenstored_path()).unwrap();
    assert!(b_xs.read(&link_node(dc.domid, da)).is_err());
}

#[test]
fn a_static_peer_list_narrows_the_watches_and_fails_fast() {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let cfg = |peer: u16| Config {
        link_timeout: Duration::from_secs(60),
        static_peers: Some(vec![peer]),
        ..config()
    };
    let a = Transport::sim_with(host.dir(), da.domid, cfg(db.domid)).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, cfg(da.domid)).unwrap();
    assert!(!a.status().watched.iter().any(|p| p == "/local/domain"));
    let t0 = Instant::now();
    assert_eq!(
        errno(&a.connect((4000u32, 1)).unwrap_err()),
        libc::EHOSTUNREACH
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    let l = b.bind("xen:self:1").unwrap();
    let _c = a.connect((u32::from(db.domid), 1)).unwrap();
    let _s = l.accept().unwrap();
}

#[test]
fn orderly_shutdown_withdraws_nodes_and_watches() {
    let p = pair();
    let dom0 = xensock_discovery::xs::XsClient::open_path(p.host.dom0().xenstored_path()).unwrap();
    let l = p.b.bind("xen:self:5").unwrap();
    let c = p.a.connect((u32::from(p.db.domid), 5)).unwrap();
    let (s, _) = l.accept().unwrap();
    let a_node = link_node(p.da.domid, p.db.domid);
    assert!(dom0.try_read(&a_node).unwrap().is_some());
    assert!(p
        .a
        .status()
        .watched
        .contains(&peer_node_of(&p.a, p.db.domid)));
    drop(c);
    let Pair { a, b, host, db, .. } = p;
    drop(a);
    // a's half is gone from XenStore, and so are a's watches: the only
    // ones left are b's.
    assert_eq!(dom0.try_read(&a_node).unwrap(), None);
    assert!(
        eventually(Duration::from_secs(5), || host.stats().xenstored.watches
            == b.status().watched.len()),
        "{:?} {:?}",
        host.stats().xenstored,
        b.status().watched
    );
    // b saw the link go and withdrew its half too.
    assert!(eventually(Duration::from_secs(5), || b
        .status()
        .links
        .is_empty()));
    drop((s, l));
    assert!(eventually(Duration::from_secs(5), || dom0
        .directory(&format!("/local/domain/{}/data/xensock/link", db.domid))
        .unwrap_or_default()
        .is_empty()));
}

/// Run as a child process by `a_killed_predecessor_is_superseded`: links
/// to `XENSOCK_TEST_CONNECT`, says `connected`, then waits to be killed.
#[test]
#[ignore = "helper: run as a child process by a_killed_predecessor_is_superseded"]
fn child_linker() {
    let Ok(addr) = std::env::var("XENSOCK_TEST_CONNECT") else {
        return;
    };
    let _s = XenStream::connect(addr.as_str()).unwrap();
    println!("connected");
    io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `child_linker` as a process of domain `d`, linking to `to`'s port 6;
/// its stdout.
fn spawn_child_linker(
    d: &xensock_sim::SimDomain,
    to: u16,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_linker",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(d.env())
        .env("XENSOCK_TEST_CONNECT", format!("xen:{to}:6"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    (child, out)
}

#[test]
fn a_killed_predecessor_is_superseded() {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let dom0 = xensock_discovery::xs::XsClient::open_path(host.dom0().xenstored_path()).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, config()).unwrap();
    let l = a.bind("xen:self:6").unwrap();
    let (mut child, mut out) = spawn_child_linker(&db, da.domid);
    let (s1, _) = l.accept().unwrap();
    let mut line = String::new();
    while !line.contains("connected") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited");
    }
    let old_gen = a.status().links[0].peer_generation;
    // Killed: it withdraws nothing. Its node stays in b's home.
    child.kill().unwrap();
    child.wait().unwrap();
    let b_node = link_node(db.domid, da.domid);
    assert!(dom0.try_read(&b_node).unwrap().is_some());
    // a notices the death and tears its half down.
    assert!(eventually(Duration::from_secs(5), || a
        .status()
        .links
        .is_empty()));
    assert_eq!(a.status().links_lost, 1);
    let mut buf = [0u8; 1];
    assert!(matches!((&s1).read(&mut buf), Ok(0) | Err(_)));
    // A new process of b (here a transport in this process) starts over:
    // the stale node is withdrawn, a new link with a new generation comes
    // up, and data flows.
    let b = Transport::sim_with(host.dir(), db.domid, config()).unwrap();
    let mut c = b.connect((u32::from(da.domid), 6)).unwrap();
    let (mut s2, _) = l.accept().unwrap();
    let st = a.status();
    assert_eq!(st.links.len(), 1);
    assert!(st.links[0].up);
    assert_ne!(st.links[0].peer_generation, old_gen);
    c.write_all(b"again").unwrap();
    let mut got = [0u8; 5];
    s2.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"again");
}

/// One process per domain runs the user-space transport: a second one is
/// refused, naming the first, and the first one's links and connections
/// are untouched (a second transport used to take over the domain's link
/// nodes and break them). Once the first is gone the domain is free.
#[test]
fn a_second_process_is_refused_and_the_first_keeps_its_connections() {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, config()).unwrap();
    let l = a.bind("xen:self:6").unwrap();
    let (mut child, mut out) = spawn_child_linker(&db, da.domid);
    let (mut s1, _) = l.accept().unwrap();
    let mut line = String::new();
    while !line.contains("connected") {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child exited");
    }
    let gen = a.status().links[0].peer_generation;
    // b's second process (here a transport in this process) is refused.
    let e = Transport::sim_with(host.dir(), db.domid, config()).unwrap_err();
    assert!(
        e.to_string()
            .contains(&format!("in use by process {}", child.id())),
        "{e}"
    );
    // The child's link and connection live on.
    std::thread::sleep(Duration::from_millis(500));
    let st = a.status();
    assert_eq!(st.links.len(), 1, "{st:?}");
    assert!(st.links[0].up);
    assert_eq!(st.links[0].peer_generation, gen);
    assert_eq!(st.links_lost, 0);
    s1.write_all(b"still here").unwrap();
    // Gone, the child frees the domain for the next process.
    child.kill().unwrap();
    child.wait().unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, config()).unwrap();
    let mut c = b.connect((u32::from(da.domid), 6)).unwrap();
    let (mut s2, _) = l.accept().unwrap();
    c.write_all(b"next").unwrap();
    let mut got = [0u8; 4];
    s2.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"next");
}

/// Run as a child process by `what_an_exiting_process_wrote_is_delivered`:
/// connects to `XENSOCK_TEST_CONNECT`, writes `XENSOCK_TEST_BYTES` bytes of
/// pattern 7, says `written` and returns, leaving the stream open for the
/// process's exit to deal with.
#[test]
#[ignore = "helper: run as a child process by what_an_exiting_process_wrote_is_delivered"]
fn child_writer() {
    let (Ok(addr), Ok(n)) = (
        std::env::var("XENSOCK_TEST_CONNECT"),
        std::env::var("XENSOCK_TEST_BYTES"),
    ) else {
        return;
    };
    let mut data = vec![0u8; n.parse().unwrap()];
    pattern::Pattern::new(7).fill(&mut data);
    if std::env::var_os("XENSOCK_TEST_OWN_TRANSPORT").is_some() {
        // a transport of its own, and `exit`: no destructor runs
        let t = Transport::from_env().unwrap();
        let mut s = t.connect(addr.as_str()).unwrap();
        s.write_all(&data).unwrap();
        println!("written");
        io::stdout().flush().unwrap();
        std::process::exit(0);
    }
    let mut s = XenStream::connect(addr.as_str()).unwrap();
    s.write_all(&data).unwrap();
    println!("written");
    io::stdout().flush().unwrap();
    std::mem::forget(s);
}

/// A process that exits with a stream open ends it as TCP does: what it
/// wrote is delivered, then end of stream, not a reset that loses what
/// the peer has not read yet. Through the process-wide transport
/// (`XenStream::connect`) ...
#[test]
fn what_an_exiting_process_wrote_is_delivered() {
    an_exiting_writer_delivers(false);
}

/// ... and through a transport of its own that the process never drops
/// (it calls `exit`).
#[test]
fn what_a_process_wrote_is_delivered_when_it_exits_without_dropping_its_transport() {
    an_exiting_writer_delivers(true);
}

fn an_exiting_writer_delivers(own_transport: bool) {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, config()).unwrap();
    let l = a.bind("xen:self:6").unwrap();
    let n = 40_000;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_writer", "--ignored", "--nocapture"])
        .envs(db.env())
        .env("XENSOCK_TEST_CONNECT", format!("xen:{}:6", da.domid))
        .env("XENSOCK_TEST_BYTES", n.to_string())
        .envs(own_transport.then_some(("XENSOCK_TEST_OWN_TRANSPORT", "1")))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (mut s, _) = l.accept().unwrap();
    // Nothing is read until the child has gone.
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    assert!(out.contains("written"), "{out}");
    // The peer's link is withdrawn; the stream still holds every byte.
    assert!(eventually(Duration::from_secs(5), || a
        .status()
        .links
        .is_empty()));
    let mut got = Vec::new();
    s.read_to_end(&mut got).unwrap();
    let mut want = vec![0u8; n];
    pattern::Pattern::new(7).fill(&mut want);
    assert_eq!(got.len(), n);
    assert!(got == want, "the bytes differ");
    // The peer is gone: writing fails as on a closed TCP connection.
    let e = s.write_all(b"x").unwrap_err();
    assert_eq!(errno(&e), libc::EPIPE, "{e}");
}

#[test]
fn dom0_learns_from_xenstored_that_a_domain_does_not_exist() {
    // No agent and no static list, but dom0 may ask IS_DOMAIN_INTRODUCED.
    let host = SimHost::start().unwrap();
    let cfg = Config {
        link_timeout: Duration::from_secs(60),
        ..config()
    };
    let t = Transport::sim_with(host.dir(), 0, cfg).unwrap();
    let t0 = Instant::now();
    assert_eq!(
        errno(&t.connect((4000u32, 1)).unwrap_err()),
        libc::EHOSTUNREACH
    );
    assert!(t0.elapsed() < Duration::from_secs(5), "{:?}", t0.elapsed());
}
