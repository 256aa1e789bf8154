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

/// Two domains, a and b, of a new simulated host.
fn two_domains() -> (
    xensock_sim::SimHost,
    xensock_sim::SimDomain,
    xensock_sim::SimDomain,
) {
    let host = xensock_sim::SimHost::start().unwrap();
    let a = host
        .create_domain(xensock_sim::DomainConfig::new("a"))
        .unwrap();
    let b = host
        .create_domain(xensock_sim::DomainConfig::new("b"))
        .unwrap();
    (host, a, b)
}

/// `xensock listen PORT` in `dom`, its stdin and stdout piped, once it has
/// said where it listens: the process, that line, and its stderr (kept
/// open: the listener says more there, and fails if it cannot).
fn listening(
    dom: &xensock_sim::SimDomain,
    port: &str,
) -> (
    std::process::Child,
    String,
    std::io::BufReader<std::process::ChildStderr>,
) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let mut listener = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["listen", port])
        .envs(dom.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    let mut err = BufReader::new(listener.stderr.take().unwrap());
    err.read_line(&mut line).unwrap();
    (listener, line, err)
}

#[test]
fn demo_streams_through_the_echo_server_and_releases_everything() {
    let (ok, out) = xensock(&["demo", "--mib", "4", "--quiet"]);
    assert!(ok, "{out}");
    // the first line says what this is, not what is missing
    assert!(
        out.starts_with("xensock demo: two domains of a simulated Xen host"),
        "{out}"
    );
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

/// With nothing that can carry a connection, `status` says why each
/// candidate is missing and fails (scripts and monitoring see it).
#[test]
fn status_without_a_backend_says_so_and_fails() {
    let (ok, out) = xensock(&["status"]);
    assert!(!ok, "{out}");
    assert!(out.contains("kernel family: not loaded"), "{out}");
    assert!(out.contains("no backend here"), "{out}");
}

/// `status --json`: one object with what the text says; a process that
/// runs a transport in the domain answers in `processes`.
#[test]
fn status_json_lists_backend_and_the_domain_s_transports() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let out = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["status", "--json"])
        .env_remove("XENSOCK_SIM")
        .env_remove("XENSOCK_SIM_DOMID")
        .output()
        .unwrap();
    assert!(!out.status.success(), "no backend: status fails");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["backend"]["kind"], "none");
    assert!(v["backend"]["reasons"][0]
        .as_str()
        .is_some_and(|r| r.contains("kernel family: not loaded")));
    assert!(v["kernel"].is_null());

    let host = xensock_sim::SimHost::start().unwrap();
    let d = host
        .create_domain(xensock_sim::DomainConfig::new("a"))
        .unwrap();
    let mut listener = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["listen", "5"])
        .envs(d.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(listener.stderr.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening on"), "{line}");
    let out = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["status", "--json"])
        .envs(d.env())
        .output()
        .unwrap();
    let _ = listener.kill();
    let _ = listener.wait();
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(v["backend"]["kind"], "sim");
    assert_eq!(v["backend"]["user_space"], "sim");
    assert_eq!(v["domid"], u64::from(d.domid));
    let procs = v["processes"].as_array().unwrap();
    let me = procs
        .iter()
        .find(|p| p["pid"] == listener.id())
        .unwrap_or_else(|| panic!("{v:#}"));
    assert_eq!(me["transport"]["domid"], u64::from(d.domid), "{v:#}");
    assert_eq!(me["transport"]["listeners"], 1, "{v:#}");
    assert!(me["connections"].is_array(), "{v:#}");
}

/// A user's mistakes get errors that say what is wrong: a malformed
/// address names itself and the form expected; no backend lists why each
/// candidate is missing.
#[test]
fn connect_errors_say_what_is_wrong() {
    let (ok, out) = xensock(&["connect", "xen:abc:5"]);
    assert!(!ok);
    assert!(
        out.contains("\"xen:abc:5\" (expected xen:<domid>:<port>)"),
        "{out}"
    );
    let (ok, out) = xensock(&["connect", "xen:1:5"]);
    assert!(!ok);
    for why in [
        "no xensock backend here",
        "kernel family: not loaded",
        "XENSOCK_SIM not set",
    ] {
        assert!(out.contains(why), "{why} missing: {out}");
    }
    // a port nobody listens on: the address, and what to do about it
    let (_host, d, e) = two_domains();
    let (mut listener, _, _stderr) = listening(&e, "5");
    let addr = format!("xen:{}:9", e.domid);
    let out = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["connect", &addr])
        .envs(d.env())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(text.contains(&format!("connect {addr}")), "{text}");
    let _ = listener.kill();
    let _ = listener.wait();
    assert!(text.contains("nothing listens on that port"), "{text}");
}

#[test]
fn xensock_says_its_version() {
    let (ok, out) = xensock(&["--version"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), format!("xensock {}", env!("CARGO_PKG_VERSION")));
}

/// `xensock listen` and `xensock connect`: a shell user's pair, as `nc`.
#[test]
fn listen_and_connect_pipe_both_ways() {
    use std::io::{BufRead, BufReader, Read, Write};
    use std::process::Stdio;
    let (_host, da, db) = two_domains();
    let (mut listener, line, _stderr) = listening(&da, "5");
    assert!(
        line.contains(&format!("listening on xen:{}:5", da.domid)),
        "{line}"
    );
    let mut connector = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["connect", &format!("xen:{}:5", da.domid)])
        .envs(db.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    connector
        .stdin
        .take()
        .unwrap()
        .write_all(b"hello from b\n")
        .unwrap();
    // The listener has b's line before it ends its own side: the
    // connector exits at that end, and a user-space transport that exits
    // resets what its peer has not read yet (docs/moves.md, limits).
    let mut from_b = BufReader::new(listener.stdout.take().unwrap());
    let mut got_a = String::new();
    from_b.read_line(&mut got_a).unwrap();
    listener
        .stdin
        .take()
        .unwrap()
        .write_all(b"hi from a\n")
        .unwrap();
    from_b.read_to_string(&mut got_a).unwrap();
    let mut got_b = String::new();
    connector
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut got_b)
        .unwrap();
    assert_eq!(got_a, "hello from b\n");
    assert_eq!(got_b, "hi from a\n");
    assert!(listener.wait().unwrap().success());
    assert!(connector.wait().unwrap().success());
}

/// The peer's end of stream ends `xensock listen`'s stdout while its stdin
/// is still open, so an echo through a program (`socat EXEC:'xensock
/// listen 5' EXEC:cat`) can end: `cat` needs its end to finish.
#[test]
fn the_peers_end_ends_stdout_while_stdin_stays_open() {
    use std::io::{Read, Write};
    use std::process::Stdio;
    use std::thread;
    use std::time::Duration;
    let (_host, da, db) = two_domains();
    let (mut listener, _, _stderr) = listening(&da, "5");
    let mut connector = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["connect", &format!("xen:{}:5", da.domid)])
        .envs(db.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    // b sends a line and ends its side; a's stdin stays open
    let mut to_b = connector.stdin.take().unwrap();
    to_b.write_all(b"one line\n").unwrap();
    drop(to_b);
    let mut out = listener.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let mut got = String::new();
        let r = out.read_to_string(&mut got).map(|_| got);
        let _ = tx.send(r);
    });
    let got = rx.recv_timeout(Duration::from_secs(30));
    // a's side ends (its stdin closes), then both exit
    drop(listener.stdin.take());
    assert_eq!(
        got.expect("stdout still open after the peer's end")
            .unwrap(),
        "one line\n"
    );
    assert!(listener.wait().unwrap().success());
    assert!(connector.wait().unwrap().success());
}

#[test]
fn bench_and_demo_refuse_what_cannot_work_before_running() {
    let (ok, out) = xensock(&["bench", "--scale", "0"]);
    assert!(
        !ok && out.contains("--scale must be a positive number"),
        "{out}"
    );
    let (ok, out) = xensock(&["bench", "--scale=-1"]);
    assert!(
        !ok && out.contains("--scale must be a positive number"),
        "{out}"
    );
    let (ok, out) = xensock(&["bench", "--plot", "/nonexistent-dir/chart.png"]);
    assert!(
        !ok && out.contains("--plot /nonexistent-dir/chart.png"),
        "{out}"
    );
    let (ok, out) = xensock(&["demo", "--write-size", "0"]);
    assert!(
        !ok && out.contains("--write-size must be at least 1"),
        "{out}"
    );
}

/// `xensock daemon --socket PATH` never removes a file that is not a
/// socket (a mistyped path must not cost a file).
#[test]
fn the_daemon_refuses_a_socket_path_that_is_a_file() {
    let host = xensock_sim::SimHost::start().unwrap();
    let d = host
        .create_domain(xensock_sim::DomainConfig::new("a"))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("precious");
    std::fs::write(&file, "keep me").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["daemon", "--socket"])
        .arg(&file)
        .envs(d.env())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exists and is not a socket"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// `xensock run`: the program runs with the library first in LD_PRELOAD;
/// a missing library or program is a clear error, not a silent run.
#[test]
fn run_preloads_the_library_and_names_what_is_missing() {
    let run = |lib: &str, prog: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_xensock"))
            .arg("run")
            .arg("--")
            .args(prog)
            .env("XENSOCK_PRELOAD_LIB", lib)
            .env("LD_PRELOAD", "")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    };
    // any existing file stands for the library here (the loader refuses an
    // empty one and runs the program anyway): the program sees it in
    // LD_PRELOAD, and its exit status is the command's
    let lib = std::env::temp_dir().join("xensock-run-test-lib.so");
    std::fs::write(&lib, b"").unwrap();
    let lib = lib.to_str().unwrap();
    let (ok, out) = run(
        lib,
        &["/bin/sh", "-c", "printf %s \"$LD_PRELOAD\" >&2; false"],
    );
    assert!(!ok && out.contains(lib), "{out}");
    let (ok, out) = run("/nonexistent/libxensock_preload.so", &["true"]);
    assert!(
        !ok && out.contains("XENSOCK_PRELOAD_LIB=/nonexistent"),
        "{out}"
    );
    // a program that cannot run exits as a shell's would: 127 not found,
    // 126 found but not executable
    let code = |prog: &str| {
        Command::new(env!("CARGO_BIN_EXE_xensock"))
            .args(["run", "--", prog])
            .env("XENSOCK_PRELOAD_LIB", lib)
            .output()
            .unwrap()
    };
    let out = code("/nonexistent-program");
    assert_eq!(out.status.code(), Some(127));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent-program"));
    assert_eq!(
        code(lib).status.code(),
        Some(126),
        "a file that is not executable"
    );
}

/// The manual page and the shell completions the packages install come
/// from the command's own definition.
#[test]
fn the_manual_page_and_completions_describe_every_command() {
    let (ok, man) = xensock(&["manpage"]);
    assert!(ok, "{man}");
    assert!(man.contains(".TH xensock 1"), "{man}");
    // (roff writes a hyphen as `\-`)
    let man = man.replace("\\-", "-");
    for cmd in [
        "status",
        "suspend",
        "resume",
        "daemon",
        "run",
        "--log-level",
    ] {
        assert!(man.contains(cmd), "{cmd} missing from the manual page");
    }
    for shell in ["bash", "zsh", "fish"] {
        let (ok, text) = xensock(&["completions", shell]);
        assert!(ok, "{shell}: {text}");
        assert!(
            text.contains("suspend") && text.contains("daemon"),
            "{shell}: {text}"
        );
    }
    let (ok, _) = xensock(&["completions", "tcsh"]);
    assert!(!ok, "an unknown shell is refused");
}
