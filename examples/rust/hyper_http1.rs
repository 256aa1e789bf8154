// SPDX-License-Identifier: MIT OR Apache-2.0
//! A hyper HTTP/1 server and client talking over xensock between two
//! domains of a simulated host (in this process).
//!
//! `cargo run -p xensock-examples --bin hyper_http1`

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use libxensock::Transport;
use tokio_xensock::{XenListener, XenStream};
use xensock_sim::{DomainConfig, SimHost};

async fn hello(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    Ok(Response::new(Full::new(Bytes::from(format!(
        "hello over xensock: {path} ({} bytes)",
        body.len()
    )))))
}

/// Serves one domain, requests from the other; returns the response bodies.
pub async fn run(requests: usize) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let host = SimHost::start()?;
    let ds = host.create_domain(DomainConfig::new("web"))?;
    let dc = host.create_domain(DomainConfig::new("client"))?;
    let server_t = Transport::sim(host.dir(), ds.domid)?;
    let client_t = Transport::sim(host.dir(), dc.domid)?;
    let listener = XenListener::bind_on(&server_t, "xen:self:80")?;
    let stream = XenStream::connect_on(&client_t, (u32::from(ds.domid), 80)).await?;
    exchange(listener, stream, requests).await
}

/// Serves HTTP/1 on `listener` and sends `requests` POSTs over `stream`
/// (connected to it), whatever the backend; returns the response bodies.
pub async fn exchange(
    listener: XenListener,
    stream: XenStream,
    requests: usize,
) -> Result<Vec<String>, Box<dyn std::error::Error + Send + Sync>> {
    let server = tokio::spawn(async move {
        loop {
            let Ok((stream, _peer)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), hyper::service::service_fn(hello))
                    .await;
            });
        }
    });
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    let driver = tokio::spawn(conn);
    let mut out = Vec::new();
    for i in 0..requests {
        let req = Request::post(format!("/item/{i}"))
            .header("host", "xen")
            .body(Full::new(Bytes::from(vec![b'x'; i * 1000])))?;
        sender.ready().await?;
        let resp = sender.send_request(req).await?;
        assert!(resp.status().is_success());
        let body = resp.into_body().collect().await?.to_bytes();
        out.push(String::from_utf8_lossy(&body).into_owned());
    }
    drop(sender);
    let _ = driver.await;
    server.abort();
    Ok(out)
}

#[cfg_attr(test, allow(dead_code))]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    for line in run(3).await? {
        println!("{line}");
    }
    Ok(())
}
