// SPDX-License-Identifier: MIT OR Apache-2.0
//! Helpers shared by the integration tests: a sim host with two domains
//! and a transport per domain, all in this process.

#![allow(dead_code)]

use std::time::Duration;

use libxensock::{Config, Transport};
use xensock_sim::{DomainConfig, SimDomain, SimHost};

pub struct Pair {
    pub a: Transport,
    pub b: Transport,
    pub da: SimDomain,
    pub db: SimDomain,
    pub host: SimHost,
}

pub fn config() -> Config {
    Config {
        link_timeout: Duration::from_millis(1500),
        ..Config::default()
    }
}

pub fn pair() -> Pair {
    pair_with(config())
}

pub fn pair_with(cfg: Config) -> Pair {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, cfg.clone()).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, cfg).unwrap();
    Pair { a, b, da, db, host }
}

/// `XENSOCK_TEST_SLACK` (default 3): multiplier for the required latency bounds.
pub fn slack() -> u32 {
    std::env::var("XENSOCK_TEST_SLACK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// Polls `f` until it is true or `limit` passes.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if std::time::Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

// not every test binary that includes this module uses them
#[allow(unused_imports)]
pub use crate::pattern::{fnv, Pattern, FNV_INIT};

/// Two guests that advertised themselves, the dom0 agent publishing their
/// co-residency tables, and a transport per guest. Returns once both
/// tables name the other guest (and the pair's link directories exist).
pub struct AgentWorld {
    pub pair: Pair,
    pub dom0: xensock_discovery::xs::XsClient,
    pub agent: xensock_discovery::agent::AgentHandle,
}

pub fn advertise(host: &SimHost, d: &SimDomain, ip: &str) {
    let xs = xensock_discovery::xs::XsClient::open_path(d.xenstored_path()).unwrap();
    xensock_discovery::advert::advertise(
        &xs,
        &xensock_discovery::advert::Advert::new(vec![ip.parse().unwrap()]),
    )
    .unwrap();
    let _ = host;
}

/// Waits until `d`'s table (read by dom0) lists every domid in `peers`.
pub fn wait_for_table(dom0: &xensock_discovery::xs::XsClient, d: &SimDomain, peers: &[u16]) {
    let dir = format!("/local/domain/{}/xensock/peers", d.domid);
    assert!(
        eventually(Duration::from_secs(10), || {
            let have = dom0.directory(&dir).unwrap_or_default();
            peers.iter().all(|p| have.contains(&p.to_string()))
        }),
        "the agent never listed {peers:?} for dom{}",
        d.domid
    );
}

pub fn agent_world(cfg: Config) -> AgentWorld {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let dom0 = xensock_discovery::xs::XsClient::open_path(host.dom0().xenstored_path()).unwrap();
    let agent = xensock_discovery::agent::Agent::spawn(
        dom0.clone(),
        xensock_discovery::agent::AgentConfig::default(),
    )
    .unwrap();
    advertise(&host, &da, "10.0.0.1");
    advertise(&host, &db, "10.0.0.2");
    wait_for_table(&dom0, &da, &[db.domid]);
    wait_for_table(&dom0, &db, &[da.domid]);
    let a = Transport::sim_with(host.dir(), da.domid, cfg.clone()).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, cfg).unwrap();
    AgentWorld {
        pair: Pair { a, b, da, db, host },
        dom0,
        agent,
    }
}
