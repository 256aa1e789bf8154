// SPDX-License-Identifier: MIT OR Apache-2.0
//! `stall_watch` (lab/guest/lib.sh), run by bash on the host as the
//! guests' shell runs it: the bench's kernel carrier phase relies on it to
//! say who waits for what when a round stands still, and to stop when
//! the phase ends.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn lib() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../lab/guest/lib.sh")
}

/// `bash -c '. lib.sh; stall_watch LOG SECS sleep'`, one look a second.
fn watcher(log: &Path, secs: u32, stop: &Path) -> Command {
    let mut c = Command::new("bash");
    c.arg("-c")
        .arg(format!(
            ". '{}'; stall_watch '{}' {secs} sleep",
            lib().display(),
            log.display()
        ))
        .env("LAB_ROLE", "test")
        .env("STALL_WATCH_STEP", "1")
        .env("STALL_WATCH_STOP", stop);
    c
}

#[test]
fn a_log_that_stopped_growing_is_reported_twice_with_the_waiting_threads() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("clients.log");
    std::fs::write(&log, "round 1\n").unwrap();
    let mut sleeper = Command::new("sleep").arg("60").spawn().unwrap();
    let pid = sleeper.id();
    let out = watcher(&log, 2, &dir.path().join("stop")).output().unwrap();
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let first = format!(
        "lab[test] stall: {} unchanged for 2 s (look 1 of 2)",
        log.display()
    );
    assert!(text.contains(&first), "{text}");
    assert!(text.contains("(look 2 of 2)"), "{text}");
    // the thread of the process it was told to describe, with its state
    let thread = format!("  [stall] sleep {pid}/task/{pid} state S wchan ");
    assert_eq!(text.matches(&thread).count(), 2, "{text}");
}

#[test]
fn the_stop_file_ends_the_watch_without_a_report() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("clients.log");
    std::fs::write(&log, "round 1\n").unwrap();
    let stop = dir.path().join("stop");
    let mut child = watcher(&log, 600, &stop)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "it watches until told to stop"
    );
    std::fs::write(&stop, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("stall_watch went on after its stop file appeared");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn bad_arguments_are_refused_with_the_usage() {
    let dir = tempfile::tempdir().unwrap();
    for args in ["", "log", "log 10", "log ten sleep", "log 1.5 sleep"] {
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(". '{}'; stall_watch {args}", lib().display()))
            .env("STALL_WATCH_STOP", dir.path().join("stop"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "args {args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("stall_watch: usage: stall_watch FILE SECS PROG..."),
            "args {args:?}: {err}"
        );
        assert!(out.stdout.is_empty(), "args {args:?}");
    }
}
