// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock-sim up 2` starts a host a person can inspect with Debian's
//! xenstore tools, takes commands on stdin, and stops on SIGTERM.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

#[test]
fn up_two_domains_prints_paths_usable_by_xenstore_tools() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_xensock-sim"))
        .args(["up", "2", "--labels", "blue,red"])
        .stdin(Stdio::piped())
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
    let mut paths = Vec::new();
    let mut dir = None;
    while paths.len() < 3 {
        let l = rx.recv_timeout(t).expect("xensock-sim printed no paths");
        if let Some(d) = l.strip_prefix("xensock-sim: host running in ") {
            dir = Some(d.to_string());
        }
        if let Some(p) = l.trim().strip_prefix("XENSTORED_PATH=") {
            paths.push(p.to_string());
        }
    }
    let dir = dir.expect("no directory line");
    let read = |sock: &str, key: &str| {
        let o = Command::new("xenstore-read")
            .arg(key)
            .env("XENSTORED_PATH", sock)
            .output()
            .expect("xenstore-read (Debian's xenstore-utils) not installed");
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        )
    };
    assert_eq!(
        read(&paths[0], "/local/domain/0/name"),
        (true, "Domain-0".into())
    );
    assert_eq!(read(&paths[1], "name"), (true, "guest1".into()));
    assert_eq!(read(&paths[2], "xensock/label"), (true, "red".into()));
    assert!(!read(&paths[2], "/local/domain/1/name").0);

    // Commands on stdin.
    let mut stdin = child.stdin.take().unwrap();
    writeln!(stdin, "destroy 2").unwrap();
    writeln!(stdin, "list").unwrap();
    let mut listed = Vec::new();
    while listed.len() < 2 {
        let l = rx.recv_timeout(t).expect("no list output");
        if l.starts_with("dom") {
            listed.push(l);
        }
    }
    assert!(listed[0].starts_with("dom0"), "{listed:?}");
    assert!(listed[1].starts_with("dom1"), "{listed:?}");
    assert!(!read(&paths[0], "/local/domain/2/name").0);

    // SIGTERM stops it and removes the temporary directory.
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert!(!std::path::Path::new(&dir).exists(), "{dir} left behind");
}
