// SPDX-License-Identifier: MIT OR Apache-2.0
//! tokio-xensock across two simulated domains in one process. The bodies
//! are the backend-independent cases of `cases/`, which
//! `tokio_kernel_family.rs` runs over `af_xen.ko` in the lab.

mod cases;

use std::future::Future;
use std::io;
use std::time::Duration;

use cases::World;
use libxensock::{Config, SocketOptions, Transport};
use tokio_xensock::{XenListener, XenStream};
use xensock_sim::{DomainConfig, SimHost};

/// Two simulated domains: listeners in b, connects from a.
struct SimWorld {
    a: Transport,
    b: Transport,
    bid: u32,
    _host: SimHost,
}

fn sim() -> SimWorld {
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, Config::default()).unwrap();
    let b = Transport::sim_with(host.dir(), db.domid, Config::default()).unwrap();
    SimWorld {
        a,
        b,
        bid: db.domid.into(),
        _host: host,
    }
}

impl World for SimWorld {
    fn bind_with(&self, port: u32, opts: SocketOptions) -> io::Result<XenListener> {
        XenListener::bind_with(&self.b, (libxensock::DOMID_SELF, port), opts)
    }
    fn connect(&self, port: u32) -> impl Future<Output = io::Result<XenStream>> + Send + 'static {
        let (t, addr) = (self.a.clone(), (self.bid, port));
        async move { XenStream::connect_on(&t, addr).await }
    }
    fn prepare(&self) {
        // The first connect to a domain sets the link up through XenStore
        // (on the blocking pool); do it before counting.
        self.a
            .prepare_link(self.bid, Duration::from_secs(5))
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo() {
    cases::echo(&sim(), 100).await;
}

#[tokio::test(flavor = "current_thread")]
async fn readiness_and_try_calls() {
    cases::readiness_and_try_calls(&sim(), 43).await;
}

#[tokio::test(flavor = "current_thread")]
async fn refused() {
    cases::refused(&sim(), 9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn split_halves_stream_both_ways_at_once() {
    cases::split_halves_stream_both_ways_at_once(&sim(), 101).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_codecs_and_incoming_stream() {
    cases::framed_codecs_and_incoming_stream(&sim(), 102).await;
}

#[test]
fn concurrent_connects_on_a_current_thread_runtime() {
    cases::concurrent_connects_on_a_current_thread_runtime(sim(), 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_http1_serves_requests() {
    cases::hyper_http1_serves_requests(&sim(), 104).await;
}

#[tokio::test(flavor = "current_thread")]
async fn writes_that_never_block_leave_room_for_other_tasks() {
    let w = sim();
    w.prepare();
    cases::writes_that_never_block_leave_room_for_other_tasks(&w, 105).await;
}
