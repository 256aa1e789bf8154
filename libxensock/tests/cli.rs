// SPDX-License-Identifier: MIT OR Apache-2.0
//! The `xensock` binary: `demo` (the README's main job), `bench`, `status`.

use std::process::Command;

fn xensock(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(args)
        .env_remove("XENSOCK_SIM")
        .env_remove("XENSOCK_SIM_DOMID")
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

#[test]
fn demo_streams_through_the_echo_server_and_releases_everything() {
    let (ok, out) = xensock(&["demo", "--mib", "4", "--quiet"]);
    assert!(ok, "{out}");
    assert!(out.contains("set up through XenStore"), "{out}");
    assert!(out.contains("4194304 bytes echoed"), "{out}");
    assert_eq!(out.matches("matches").count(), 2, "{out}");
    assert!(out.contains("xensock / TCP loopback throughput"), "{out}");
    assert!(
        out.contains("every grant, mapping and event channel released: yes"),
        "{out}"
    );
}

#[test]
fn bench_prints_every_table_and_writes_a_png() {
    let dir = std::env::temp_dir().join(format!("xensock-bench-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let png = dir.join("bench.png");
    let (ok, out) = xensock(&["bench", "--scale", "0.01", "--plot", png.to_str().unwrap()]);
    assert!(ok, "{out}");
    for needle in [
        "stream throughput",
        "64 KiB",
        "ping-pong",
        "connect+accept+close",
        "memory per idle connection",
    ] {
        assert!(out.contains(needle), "{needle} missing: {out}");
    }
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn status_without_a_backend_says_so() {
    let (ok, out) = xensock(&["status"]);
    assert!(ok, "{out}");
    assert!(out.contains("kernel family: not loaded"), "{out}");
}

#[test]
fn xensock_says_its_version() {
    let (ok, out) = xensock(&["--version"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), format!("xensock {}", env!("CARGO_PKG_VERSION")));
}
