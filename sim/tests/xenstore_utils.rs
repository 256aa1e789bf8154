// SPDX-License-Identifier: MIT OR Apache-2.0
//! Conformance with a real client: Debian's `xenstore-*` tools (package
//! `xenstore-utils`, libxenstore 4.17) pointed at the sim's xenstored with
//! `XENSTORED_PATH`. The expected outputs and exit codes are what the same
//! commands give against the C xenstored (error texts come from the tools
//! and from strerror of the errno xenstored returns).
//!
//! `scripts/test` installs `xenstore-utils`; without it these tests fail
//! with a message saying so.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use xensock_sim::{DomainConfig, SimHost};

fn tool(name: &str) -> Command {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).exists()))
        .unwrap_or(false);
    assert!(
        found,
        "{name} not found: install Debian's xenstore-utils (scripts/test does)"
    );
    Command::new(name)
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn run(sock: &Path, name: &str, args: &[&str]) -> Out {
    let o: Output = tool(name)
        .args(args)
        .env("XENSTORED_PATH", sock)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

fn ok(sock: &Path, name: &str, args: &[&str]) -> String {
    let o = run(sock, name, args);
    assert_eq!(o.code, 0, "{name} {args:?}: {}", o.stderr);
    o.stdout
}

#[test]
fn dom0_reads_writes_lists_and_removes() {
    let host = SimHost::start().unwrap();
    let s = host.dom0().xenstored_path();
    ok(&s, "xenstore-write", &["/t/a", "1", "/t/b/c", "two words"]);
    assert_eq!(
        ok(&s, "xenstore-read", &["/t/a", "/t/b/c"]),
        "1\ntwo words\n"
    );
    assert_eq!(ok(&s, "xenstore-read", &["-p", "/t/a"]), "/t/a: 1\n");
    assert_eq!(ok(&s, "xenstore-list", &["/t"]), "a\nb\n");
    assert_eq!(
        ok(&s, "xenstore-ls", &["-f", "/t"]),
        "/t/a = \"1\"\n/t/b = \"\"\n/t/b/c = \"two words\"\n"
    );
    assert_eq!(run(&s, "xenstore-exists", &["/t/b/c"]).code, 0);
    assert_eq!(run(&s, "xenstore-exists", &["/t/nope"]).code, 1);

    let r = run(&s, "xenstore-read", &["/t/nope"]);
    assert_eq!(r.code, 1);
    assert_eq!(r.stderr.trim(), "xenstore-read: couldn't read path /t/nope");

    // Removing an absent child of an existing node succeeds; with a
    // missing parent it fails.
    ok(&s, "xenstore-rm", &["/t/absent"]);
    let r = run(&s, "xenstore-rm", &["/t/x/y"]);
    assert_eq!(r.code, 1);
    assert_eq!(r.stderr.trim(), "xenstore-rm: could not remove path /t/x/y");
    ok(&s, "xenstore-rm", &["/t/b"]);
    assert_eq!(ok(&s, "xenstore-list", &["/t"]), "a\n");
    // -t removes empty parents up the tree.
    ok(&s, "xenstore-write", &["/q/r/s", "x"]);
    ok(&s, "xenstore-rm", &["-t", "/q/r/s"]);
    assert_eq!(run(&s, "xenstore-exists", &["/q"]).code, 1);

    // The tree a fresh host starts with, as dom0 sees it.
    let all = ok(&s, "xenstore-ls", &["-f"]);
    for line in [
        "/tool = \"\"",
        "/tool/xenstored = \"\"",
        "/local/domain/0/name = \"Domain-0\"",
        "/local/domain/0/domid = \"0\"",
    ] {
        assert!(all.lines().any(|l| l == line), "missing {line:?} in\n{all}");
    }
}

#[test]
fn chmod_and_permissions_as_seen_by_guests() {
    let host = SimHost::start().unwrap();
    let g1 = host
        .create_domain(DomainConfig::new("g1").label("blue"))
        .unwrap();
    let g2 = host.create_domain(DomainConfig::new("g2")).unwrap();
    let (s0, s1, s2) = (
        host.dom0().xenstored_path(),
        g1.xenstored_path(),
        g2.xenstored_path(),
    );
    let (d1, d2) = (g1.domid.to_string(), g2.domid.to_string());
    ok(&s0, "xenstore-write", &["/t/a", "1", "/t/b/c", "2"]);
    ok(
        &s0,
        "xenstore-chmod",
        &["-r", "/t", "n0", &format!("r{d1}")],
    );
    let ls = ok(&s0, "xenstore-ls", &["-p", "/t"]);
    for l in ls.lines() {
        assert!(l.ends_with(&format!("(n0,r{d1})")), "{ls}");
    }
    // g1 may read, not write; g2 may do neither.
    assert_eq!(ok(&s1, "xenstore-read", &["/t/b/c"]), "2\n");
    let r = run(&s1, "xenstore-write", &["/t/b/c", "9"]);
    assert_eq!(r.code, 1);
    assert_eq!(
        r.stderr.trim(),
        "xenstore-write: could not write path /t/b/c"
    );
    assert_eq!(run(&s2, "xenstore-read", &["/t/b/c"]).code, 1);

    // A guest's home as libxl lays it out.
    let home = format!("/local/domain/{d1}");
    let ls = ok(&s0, "xenstore-ls", &["-p", &home]);
    assert!(ls.contains("name = \"g1\""), "{ls}");
    assert!(
        ls.lines()
            .any(|l| l.starts_with("data = \"\"") && l.ends_with(&format!("(n{d1})"))),
        "{ls}"
    );
    assert!(
        ls.lines()
            .any(|l| l.contains("label = \"blue\"") && l.ends_with(&format!("(n0,r{d1})"))),
        "{ls}"
    );

    // Relative paths are the guest's home; its data/ is its own.
    ok(&s1, "xenstore-write", &["data/x", "hello"]);
    assert_eq!(ok(&s1, "xenstore-read", &["data/x"]), "hello\n");
    assert_eq!(
        ok(&s0, "xenstore-read", &[&format!("{home}/data/x")]),
        "hello\n"
    );
    assert_eq!(ok(&s1, "xenstore-read", &["name"]), "g1\n");
    // Not another guest's, nor its own label, nor the domain list.
    assert_eq!(
        run(&s2, "xenstore-read", &[&format!("{home}/data/x")]).code,
        1
    );
    assert_eq!(
        run(&s2, "xenstore-write", &[&format!("{home}/data/y"), "1"]).code,
        1
    );
    assert_eq!(
        run(&s1, "xenstore-write", &["xensock/label", "red"]).code,
        1
    );
    assert_eq!(
        run(&s1, "xenstore-chmod", &["xensock/label", &format!("b{d1}")]).code,
        1
    );
    let r = run(&s1, "xenstore-ls", &["/local/domain"]);
    assert_eq!(r.code, 1);
    assert_eq!(
        r.stderr.trim(),
        "xenstore-ls: xs_directory (/local/domain): Permission denied"
    );
    assert_eq!(
        ok(&s0, "xenstore-read", &[&format!("{home}/xensock/label")]),
        "blue\n"
    );
    // The guest may share its own node with g2, but not give it away.
    ok(
        &s1,
        "xenstore-chmod",
        &["data/x", &format!("n{d1}"), &format!("r{d2}")],
    );
    assert_eq!(
        ok(&s2, "xenstore-read", &[&format!("{home}/data/x")]),
        "hello\n"
    );
    assert_eq!(
        run(&s1, "xenstore-chmod", &["data/x", &format!("b{d2}")]).code,
        1
    );
}

#[test]
fn watch_prints_the_registration_then_changes() {
    let host = SimHost::start().unwrap();
    let s = host.dom0().xenstored_path();
    ok(&s, "xenstore-write", &["/w", ""]);
    let mut child = tool("xenstore-watch")
        .args(["-n", "3", "/w"])
        .env("XENSTORED_PATH", &s)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let t = Duration::from_secs(10);
    let next = |what: &str| {
        rx.recv_timeout(t)
            .unwrap_or_else(|_| panic!("no {what} event"))
    };
    assert_eq!(next("initial"), "/w");
    ok(&s, "xenstore-write", &["/w/x", "1"]);
    assert_eq!(next("write"), "/w/x");
    ok(&s, "xenstore-write", &["/elsewhere", "1"]);
    ok(&s, "xenstore-rm", &["/w/x"]);
    assert_eq!(next("rm"), "/w/x");
    assert!(child.wait().unwrap().success());
}

#[test]
fn concurrent_tool_writes_all_commit() {
    // The tools run every command in a transaction and retry on EAGAIN;
    // concurrent writers to one directory conflict and must all succeed.
    let host = SimHost::start().unwrap();
    let s = host.dom0().xenstored_path();
    let children: Vec<_> = (0..6)
        .map(|i| {
            let key = format!("/c/k{i}");
            tool("xenstore-write")
                .args([key.as_str(), "v", &format!("/c/j{i}"), "w"])
                .env("XENSTORED_PATH", &s)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let list = ok(&s, "xenstore-list", &["/c"]);
    assert_eq!(list.lines().count(), 12, "{list}");
}
