// SPDX-License-Identifier: MIT OR Apache-2.0
//! An echo server and its client over xensock with tokio: tokio-xensock's
//! `XenListener` and `XenStream`, used as tokio's `TcpListener` and
//! `TcpStream`.
//!
//! In two guests of one Xen host:
//!
//! ```text
//! guest A$ tokio_echo serve 5000
//! guest B$ tokio_echo send <A's domid> 5000 hello xen
//! hello xen
//! ```
//!
//! The backend is what the guest has: `af_xen.ko` if it is loaded, else
//! the user-space transport. `XENSOCK_SIM` and `XENSOCK_SIM_DOMID` put
//! both on a simulated host instead (how the tests run it).
//!
//! `cargo run -p xensock-examples --bin tokio_echo -- serve 5000`

use std::io;
use std::process::ExitCode;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_xensock::{XenListener, XenStream};

/// Accepts connections from any domain on `port` and echoes each one's
/// bytes back, a task per connection, until its peer stops writing.
async fn serve(port: u32) -> io::Result<()> {
    let listener = XenListener::bind(format!("xen:any:{port}").as_str())?;
    println!("tokio_echo: listening on {}", listener.local_addr()?);
    loop {
        let (mut stream, peer) = listener.accept().await?;
        tokio::spawn(async move {
            let (mut rd, mut wr) = stream.split();
            // copy reads until the peer's shutdown, then we end our side
            // too: the client's read_to_end returns
            let r = async {
                tokio::io::copy(&mut rd, &mut wr).await?;
                wr.shutdown().await
            };
            if let Err(e) = r.await {
                eprintln!("tokio_echo: {peer}: {e}");
            }
        });
    }
}

/// Sends `text` to the echo server at `domid`:`port` and returns what
/// came back.
async fn send(domid: u32, port: u32, text: &str) -> io::Result<String> {
    let mut stream = XenStream::connect((domid, port)).await?;
    stream.write_all(text.as_bytes()).await?;
    stream.shutdown().await?;
    let mut back = String::new();
    stream.read_to_string(&mut back).await?;
    Ok(back)
}

fn number(s: Option<&String>, what: &str) -> Result<u32, String> {
    let s = s.ok_or_else(|| format!("missing {what}"))?;
    s.parse()
        .map_err(|_| format!("{what} {s:?} is not a number"))
}

async fn run(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        Some("serve") => serve(number(args.get(1), "port")?)
            .await
            .map_err(|e| e.to_string()),
        Some("send") => {
            let domid = number(args.get(1), "domid")?;
            let port = number(args.get(2), "port")?;
            let back = send(domid, port, &args[3..].join(" "))
                .await
                .map_err(|e| e.to_string())?;
            println!("{back}");
            Ok(())
        }
        _ => {
            Err("usage: tokio_echo serve <port> | tokio_echo send <domid> <port> <text>...".into())
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tokio_echo: {e}");
            ExitCode::FAILURE
        }
    }
}
