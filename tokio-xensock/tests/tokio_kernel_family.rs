// SPDX-License-Identifier: MIT OR Apache-2.0
//! The tokio-xensock cases of `cases/` (the bodies `tokio.rs` runs on the
//! simulated host) over the kernel family: with `af_xen.ko` loaded every
//! socket is an AF_XEN socket, both ends in this domain (the module's
//! loopback connections), and `XenStream::connect` is a non-blocking
//! `connect` awaited on the socket's write readiness.
//!
//! Every test is `#[ignore]`d: it needs the module, which only the lab has.
//! `tests/lab/kmod-rust` runs this binary in domu2 with `--ignored
//! --test-threads=1` and reports each test as `@@RESULT tfam-<name>`. By
//! hand, where `af_xen.ko` is loaded:
//! `cargo test -p tokio-xensock --test tokio_kernel_family -- --ignored --test-threads=1`.

mod cases;

use std::future::Future;
use std::io;

use cases::World;
use libxensock::{BackendKind, SockAddrXen, SocketOptions};
use tokio_xensock::{XenListener, XenStream};

/// Both sides in this domain, over the kernel family.
struct KernelWorld {
    me: u32,
}

fn kernel() -> KernelWorld {
    let report = libxensock::backend();
    assert_eq!(
        report.kind,
        BackendKind::Kernel,
        "af_xen.ko is not loaded: {report}"
    );
    // our domid, as the module reports it for a bound socket
    let probe =
        libxensock::XenListener::bind((libxensock::DOMID_SELF, libxensock::PORT_ANY)).unwrap();
    KernelWorld {
        me: probe.local_addr().unwrap().domid,
    }
}

impl World for KernelWorld {
    fn bind_with(&self, port: u32, opts: SocketOptions) -> io::Result<XenListener> {
        XenListener::from_std(libxensock::XenListener::bind_with(
            (libxensock::DOMID_SELF, port),
            opts,
        )?)
    }
    fn connect(&self, port: u32) -> impl Future<Output = io::Result<XenStream>> + Send + 'static {
        XenStream::connect(SockAddrXen::new(self.me, port))
    }
    fn prepare(&self) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
async fn echo() {
    cases::echo(&kernel(), 100).await;
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
async fn readiness_and_try_calls() {
    cases::readiness_and_try_calls(&kernel(), 43).await;
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
async fn refused() {
    cases::refused(&kernel(), 9).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
async fn split_halves_stream_both_ways_at_once() {
    cases::split_halves_stream_both_ways_at_once(&kernel(), 101).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
async fn framed_codecs_and_incoming_stream() {
    cases::framed_codecs_and_incoming_stream(&kernel(), 102).await;
}

#[test]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
fn concurrent_connects_on_a_current_thread_runtime() {
    cases::concurrent_connects_on_a_current_thread_runtime(kernel(), 120);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs af_xen.ko (the lab: tests/lab/kmod-rust)"]
async fn hyper_http1_serves_requests() {
    cases::hyper_http1_serves_requests(&kernel(), 104).await;
}
