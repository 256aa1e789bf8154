// SPDX-License-Identifier: MIT OR Apache-2.0
//! An echo server and its client over xensock with the blocking API:
//! `XenListener` and `XenStream`, used as `std::net`'s `TcpListener` and
//! `TcpStream`.
//!
//! In two guests of one Xen host:
//!
//! ```text
//! guest A$ echo serve 5000
//! guest B$ echo send <A's domid> 5000 hello xen
//! hello xen
//! ```
//!
//! The backend is what the guest has: `af_xen.ko` if it is loaded, else
//! the user-space transport. `XENSOCK_SIM` and `XENSOCK_SIM_DOMID` put
//! both on a simulated host instead (how the tests run it).
//!
//! `cargo run -p xensock-examples --bin echo -- serve 5000`

use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::process::ExitCode;
use std::thread;

use libxensock::{XenListener, XenStream};

/// Accepts connections from any domain on `port` and echoes each one's
/// bytes back, a thread per connection, until its peer stops writing.
fn serve(port: u32) -> io::Result<()> {
    let listener = XenListener::bind(format!("xen:any:{port}").as_str())?;
    println!("echo: listening on {}", listener.local_addr()?);
    for conn in listener.incoming() {
        let mut stream = conn?;
        thread::spawn(move || {
            let peer = stream.peer_addr();
            let mut back = match stream.try_clone() {
                Ok(s) => s,
                Err(e) => return eprintln!("echo: {e}"),
            };
            // io::copy reads until the peer's shutdown(Write), then we end
            // our side too: the client's read_to_end returns
            let r = io::copy(&mut stream, &mut back).and_then(|_| back.shutdown(Shutdown::Write));
            if let (Err(e), Ok(p)) = (r, peer) {
                eprintln!("echo: {p}: {e}");
            }
        });
    }
    Ok(())
}

/// Sends `text` to the echo server at `domid`:`port` and returns what
/// came back.
fn send(domid: u32, port: u32, text: &str) -> io::Result<String> {
    let mut stream = XenStream::connect((domid, port))?;
    stream.write_all(text.as_bytes())?;
    stream.shutdown(Shutdown::Write)?;
    let mut back = String::new();
    stream.read_to_string(&mut back)?;
    Ok(back)
}

fn number(s: Option<&String>, what: &str) -> Result<u32, String> {
    let s = s.ok_or_else(|| format!("missing {what}"))?;
    s.parse()
        .map_err(|_| format!("{what} {s:?} is not a number"))
}

fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("serve") => serve(number(args.get(1), "port")?).map_err(|e| e.to_string()),
        Some("send") => {
            let domid = number(args.get(1), "domid")?;
            let port = number(args.get(2), "port")?;
            let back = send(domid, port, &args[3..].join(" ")).map_err(|e| e.to_string())?;
            println!("{back}");
            Ok(())
        }
        _ => Err("usage: echo serve <port> | echo send <domid> <port> <text>...".into()),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("echo: {e}");
            ExitCode::FAILURE
        }
    }
}
