// SPDX-License-Identifier: MIT OR Apache-2.0
//! The examples run as tests.

#[path = "../rust/hyper_http1.rs"]
mod hyper_http1;

#[path = "../rust/framed_lines.rs"]
mod framed_lines;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_http1_example_serves_requests() {
    let bodies = hyper_http1::run(5).await.unwrap();
    assert_eq!(bodies.len(), 5);
    for (i, b) in bodies.iter().enumerate() {
        assert_eq!(
            b,
            &format!("hello over xensock: /item/{i} ({} bytes)", i * 1000)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn framed_example_upper_cases_lines() {
    let out = framed_lines::run(&["a", "bc", "grant"]).await.unwrap();
    assert_eq!(out, ["A", "BC", "GRANT"]);
}

#[path = "../rust/tonic_grpc.rs"]
mod tonic_grpc;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_grpc_example_serves_unary_rpcs() {
    let (replies, client_domid) = tonic_grpc::run(&["dom-a", "", "grpc"]).await.unwrap();
    assert_eq!(
        replies,
        [
            Ok(("hello over xensock, dom-a".to_string(), client_domid)),
            Err(tonic::Code::InvalidArgument),
            Ok(("hello over xensock, grpc".to_string(), client_domid)),
        ]
    );
}

// ---- the programs as a user runs them ---------------------------------------

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use xensock_sim::{DomainConfig, SimHost};

/// Two domains of a simulated host, for programs run with `XENSOCK_SIM`.
struct Guests {
    host: SimHost,
    server: u16,
    client: u16,
}

fn guests() -> Guests {
    let host = SimHost::start().unwrap();
    let server = host
        .create_domain(DomainConfig::new("server"))
        .unwrap()
        .domid;
    let client = host
        .create_domain(DomainConfig::new("client"))
        .unwrap()
        .domid;
    Guests {
        host,
        server,
        client,
    }
}

impl Guests {
    fn command(&self, program: &str, domid: u16) -> Command {
        let mut c = Command::new(program);
        c.env("XENSOCK_SIM", self.host.dir())
            .env("XENSOCK_SIM_DOMID", domid.to_string())
            .env_remove("XENSOCK_BACKEND");
        c
    }
}

/// A server program, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `program serve <port>` in the server domain and waits for its
/// "listening" line.
fn serve(g: &Guests, program: &str, port: u32) -> Server {
    let mut child = g
        .command(program, g.server)
        .args(["serve", &port.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.contains("listening on"),
        "{program} serve said {line:?}"
    );
    Server(child)
}

fn send(g: &Guests, program: &str, args: &[&str]) -> Output {
    g.command(program, g.client)
        .arg("send")
        .args(args)
        .output()
        .unwrap()
}

fn echoes(program: &str) {
    let g = guests();
    let _server = serve(&g, program, 5000);
    let domid = g.server.to_string();
    let out = send(&g, program, &[&domid, "5000", "hello", "xen"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "hello xen\n");
    // a large message comes back whole (one argument holds at most 128 KiB)
    let big = "x".repeat(120 << 10);
    let out = send(&g, program, &[&domid, "5000", &big]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len(), big.len() + 1);
    // nothing listens on that port: the error says so, the exit status too
    let out = send(&g, program, &[&domid, "5001", "x"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("refused"),
        "{out:?}"
    );
    // a malformed domid is named
    let out = send(&g, program, &["abc", "5000", "x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("domid \"abc\" is not a number"));
}

#[test]
fn echo_program_echoes_between_domains() {
    echoes(env!("CARGO_BIN_EXE_echo"));
}

#[test]
fn tokio_echo_program_echoes_between_domains() {
    echoes(env!("CARGO_BIN_EXE_tokio_echo"));
}

/// The in-process programs end on their own with what they promise.
#[test]
fn in_process_programs_run_to_the_end() {
    for (program, want) in [
        (
            env!("CARGO_BIN_EXE_hyper_http1"),
            "hello over xensock: /item/2 (2000 bytes)",
        ),
        (env!("CARGO_BIN_EXE_framed_lines"), "GRANT TABLES"),
        (env!("CARGO_BIN_EXE_tonic_grpc"), "hello over xensock, grpc"),
    ] {
        let out = Command::new(program).output().unwrap();
        assert!(out.status.success(), "{program}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains(want), "{program} printed {text:?}");
    }
}
