// SPDX-License-Identifier: MIT OR Apache-2.0
//! `tokio_util::codec::Framed` over xensock: a line-based upper-casing
//! service between two domains of a simulated host (in this process).
//!
//! `cargo run -p xensock-examples --bin framed_lines`

use futures_util::{SinkExt, StreamExt};
use libxensock::Transport;
use tokio_util::codec::{Framed, LinesCodec};
use tokio_xensock::{XenListener, XenStream};
use xensock_sim::{DomainConfig, SimHost};

/// Sends `lines` and returns the answers.
pub async fn run(lines: &[&str]) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let host = SimHost::start()?;
    let ds = host.create_domain(DomainConfig::new("upper"))?;
    let dc = host.create_domain(DomainConfig::new("client"))?;
    let st = Transport::sim(host.dir(), ds.domid)?;
    let ct = Transport::sim(host.dir(), dc.domid)?;
    let listener = XenListener::bind_on(&st, "xen:self:7")?;
    let server = tokio::spawn(async move {
        let mut incoming = listener.incoming();
        while let Some(Ok(s)) = incoming.next().await {
            tokio::spawn(async move {
                let mut f = Framed::new(s, LinesCodec::new());
                while let Some(Ok(line)) = f.next().await {
                    if f.send(line.to_uppercase()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let s = XenStream::connect_on(&ct, (u32::from(ds.domid), 7)).await?;
    let mut f = Framed::new(s, LinesCodec::new());
    let mut out = Vec::new();
    for l in lines {
        f.send(*l).await?;
        out.push(f.next().await.ok_or("connection closed")??);
    }
    server.abort();
    Ok(out)
}

#[cfg_attr(test, allow(dead_code))]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for l in run(&["hello", "xen", "grant tables"]).await? {
        println!("{l}");
    }
    Ok(())
}
