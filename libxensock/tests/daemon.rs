// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock daemon`: one guest's user-space transport shared by any number
//! of its processes, each with its own connections; a process that dies
//! takes only its own.

mod common;
mod pattern;

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use libxensock::{BackendKind, Transport, XenListener, XenStream};
use xensock_sim::{DomainConfig, SimDomain, SimHost};

const T: Duration = Duration::from_secs(20);

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

/// Helper run as a process of domain b: echo `XENSOCK_TEST_BYTES` through
/// `XENSOCK_TEST_CONNECT` (through the daemon), check it, say `ok`.
#[test]
#[ignore = "helper: run as a child process by the daemon tests"]
fn daemon_child_echo() {
    let Ok(addr) = std::env::var("XENSOCK_TEST_CONNECT") else {
        return;
    };
    let n: usize = std::env::var("XENSOCK_TEST_BYTES")
        .unwrap()
        .parse()
        .unwrap();
    let seed = std::process::id() as u8;
    let s = XenStream::connect(addr.as_str()).unwrap();
    assert_eq!(s.backend_kind(), BackendKind::Daemon);
    let data = bytes(n, seed);
    let w = {
        let mut s = s.try_clone().unwrap();
        let data = data.clone();
        std::thread::spawn(move || {
            s.write_all(&data).unwrap();
            s.shutdown(std::net::Shutdown::Write).unwrap();
        })
    };
    let mut got = Vec::new();
    (&s).read_to_end(&mut got).unwrap();
    w.join().unwrap();
    assert!(got == data, "echo differs ({} of {} bytes)", got.len(), n);
    println!("ok");
}

/// Helper: connect through the daemon, say `connected`, wait to be killed.
#[test]
#[ignore = "helper: run as a child process by the daemon tests"]
fn daemon_child_hold() {
    let Ok(addr) = std::env::var("XENSOCK_TEST_CONNECT") else {
        return;
    };
    let _s = XenStream::connect(addr.as_str()).unwrap();
    println!("connected");
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Helper: listen on `XENSOCK_TEST_LISTEN` through the daemon, echo one
/// connection; `in use` (exit 3) if the port is taken.
#[test]
#[ignore = "helper: run as a child process by the daemon tests"]
fn daemon_child_listen() {
    let Ok(addr) = std::env::var("XENSOCK_TEST_LISTEN") else {
        return;
    };
    let l = match XenListener::bind(addr.as_str()) {
        Ok(l) => l,
        Err(e) if e.raw_os_error() == Some(libc::EADDRINUSE) => {
            println!("in use");
            std::process::exit(3);
        }
        Err(e) => panic!("bind: {e}"),
    };
    assert_eq!(l.backend_kind(), BackendKind::Daemon);
    println!("listening {}", l.local_addr().unwrap());
    std::io::stdout().flush().unwrap();
    let (s, peer) = l.accept().unwrap();
    println!("accepted {peer}");
    let mut buf = Vec::new();
    (&s).read_to_end(&mut buf).unwrap();
    (&s).write_all(&buf).unwrap();
}

fn child(d: &SimDomain, test: &str, env: &[(&str, String)]) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(d.env())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap()
}

fn wait_line(c: &mut Child, want: &str) -> String {
    let out = c.stdout.as_mut().unwrap();
    let mut r = BufReader::new(out);
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            r.read_line(&mut line).unwrap() > 0,
            "child exited before {want:?}"
        );
        if line.contains(want) {
            return line;
        }
    }
}

struct Daemon(Child);
impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_daemon(d: &SimDomain, sock: &std::path::Path) -> Daemon {
    let c = Command::new(env!("CARGO_BIN_EXE_xensock"))
        .args(["daemon", "--socket"])
        .arg(sock)
        .envs(d.env())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !sock.exists() {
        assert!(t0.elapsed() < T, "the daemon never made its socket");
        std::thread::sleep(Duration::from_millis(20));
    }
    Daemon(c)
}

/// An echo server in domain a (this process): every connection echoed
/// until its end of stream; returns what each connection saw end.
fn echo_server(a: &Transport, port: u32) -> std::sync::mpsc::Receiver<std::io::Result<usize>> {
    let l = a.bind(format!("xen:self:{port}").as_str()).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let _server = std::thread::spawn(move || loop {
        let Ok((s, _)) = l.accept() else { return };
        let tx = tx.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            let mut total = 0;
            let r = loop {
                match (&s).read(&mut buf) {
                    Ok(0) => break Ok(total),
                    Ok(n) => {
                        total += n;
                        if let Err(e) = (&s).write_all(&buf[..n]) {
                            break Err(e);
                        }
                    }
                    Err(e) => break Err(e),
                }
            };
            let _ = s.shutdown(std::net::Shutdown::Write);
            let _ = tx.send(r);
        });
    });
    rx
}

#[test]
fn processes_share_the_guest_transport_and_a_dead_one_takes_only_its_own() {
    // A relay that never ends a connection leaves the processes waiting:
    // fail rather than hang.
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(120));
        eprintln!("daemon test: no progress for 120 s");
        std::process::exit(101);
    });
    let host = SimHost::start().unwrap();
    let da = host.create_domain(DomainConfig::new("a")).unwrap();
    let db = host.create_domain(DomainConfig::new("b")).unwrap();
    let a = Transport::sim_with(host.dir(), da.domid, config()).unwrap();
    let ends = echo_server(&a, 7);
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("daemon.sock");
    let _daemon = start_daemon(&db, &sock);
    let env = |extra: (&'static str, String)| {
        vec![
            (
                libxensock::daemon::ENV_DAEMON_SOCKET,
                sock.display().to_string(),
            ),
            ("XENSOCK_TEST_CONNECT", format!("xen:{}:7", da.domid)),
            extra,
        ]
    };

    // A process that holds its connection, and two that echo at once.
    let mut holder = child(&db, "daemon_child_hold", &env(("X", String::new())));
    wait_line(&mut holder, "connected");
    let echoers: Vec<Child> = (0..2)
        .map(|_| {
            child(
                &db,
                "daemon_child_echo",
                &env(("XENSOCK_TEST_BYTES", (4 << 20).to_string())),
            )
        })
        .collect();
    for mut e in echoers {
        wait_line(&mut e, "ok");
        assert!(e.wait().unwrap().success());
    }
    // The two echo connections ended cleanly (their processes closed).
    for _ in 0..2 {
        assert_eq!(ends.recv_timeout(T).unwrap().unwrap(), 4 << 20);
    }
    // The holder dies: its connection ends, and nothing else does.
    holder.kill().unwrap();
    holder.wait().unwrap();
    let end = ends
        .recv_timeout(T)
        .expect("the dead process's connection never ended");
    assert!(matches!(end, Ok(0) | Err(_)), "{end:?}");
    let mut again = child(
        &db,
        "daemon_child_echo",
        &env(("XENSOCK_TEST_BYTES", (1 << 20).to_string())),
    );
    wait_line(&mut again, "ok");
    assert!(again.wait().unwrap().success());
    assert_eq!(ends.recv_timeout(T).unwrap().unwrap(), 1 << 20);

    // A process of b listens through the daemon; a second one cannot take
    // the same port; a connects and gets its echo.
    let lenv = vec![
        (
            libxensock::daemon::ENV_DAEMON_SOCKET,
            sock.display().to_string(),
        ),
        ("XENSOCK_TEST_LISTEN", "xen:self:9".to_string()),
    ];
    let mut listener = child(&db, "daemon_child_listen", &lenv);
    let line = wait_line(&mut listener, "listening");
    assert!(line.contains(&format!("xen:{}:9", db.domid)), "{line}");
    let mut second = child(&db, "daemon_child_listen", &lenv);
    wait_line(&mut second, "in use");
    assert_eq!(second.wait().unwrap().code(), Some(3));
    let c = a.connect((u32::from(db.domid), 9)).unwrap();
    let data = bytes(300_000, 9);
    (&c).write_all(&data).unwrap();
    c.shutdown(std::net::Shutdown::Write).unwrap();
    let mut got = Vec::new();
    (&c).read_to_end(&mut got).unwrap();
    assert!(got == data, "echo through a daemon listener differs");
    assert!(listener.wait().unwrap().success());

    // And b's own in-process transport is refused while the daemon runs.
    let e = Transport::sim_with(host.dir(), db.domid, config()).unwrap_err();
    assert!(e.to_string().contains("in use by process"), "{e}");
}
