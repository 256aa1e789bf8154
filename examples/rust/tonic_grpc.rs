// SPDX-License-Identifier: MIT OR Apache-2.0
//! A tonic gRPC server and client talking over xensock between two domains
//! of a simulated host (in this process): one unary RPC,
//! `xensock.Greeter/SayHello`.
//!
//! No `protoc` and no build script: the two messages are written by hand
//! with `prost`'s derive, and the service and client are the few lines that
//! `tonic-build` would generate, over `tonic_prost::ProstCodec`.
//!
//! The transport plumbing is what any custom tonic transport needs:
//! - server: `Server::serve_with_incoming` over a `Stream` of connections
//!   that implement `AsyncRead + AsyncWrite + Connected` ([`XenStream`]
//!   with tokio-xensock's `tonic` feature, which gives handlers a
//!   [`XenConnectInfo`]);
//! - client: `Endpoint::connect_with_connector` with a tower service that
//!   dials a [`XenStream`] and wraps it in `hyper_util::rt::TokioIo`.
//!
//! `cargo run -p xensock-examples --bin tonic_grpc`

use std::convert::Infallible;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use libxensock::Transport;
use tokio_xensock::{XenConnectInfo, XenListener, XenStream};
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::NamedService;
use tonic::transport::{Endpoint, Server};
use tonic_prost::ProstCodec;
use xensock_sim::{DomainConfig, SimHost};

/// `message HelloRequest { string name = 1; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloRequest {
    /// Who to greet.
    #[prost(string, tag = "1")]
    pub name: String,
}

/// `message HelloReply { string message = 1; uint32 caller_domid = 2; }`
#[derive(Clone, PartialEq, prost::Message)]
pub struct HelloReply {
    /// The greeting.
    #[prost(string, tag = "1")]
    pub message: String,
    /// The caller's domain id as the server saw it (from [`XenConnectInfo`]).
    #[prost(uint32, tag = "2")]
    pub caller_domid: u32,
}

const SAY_HELLO: &str = "/xensock.Greeter/SayHello";

/// The `Greeter` service, as `tonic-build` would generate its server.
#[derive(Clone, Default)]
pub struct GreeterServer;

impl NamedService for GreeterServer {
    const NAME: &'static str = "xensock.Greeter";
}

async fn say_hello(
    req: tonic::Request<HelloRequest>,
) -> Result<tonic::Response<HelloReply>, tonic::Status> {
    let caller_domid = req
        .extensions()
        .get::<XenConnectInfo>()
        .and_then(|i| i.peer)
        .map_or(u32::MAX, |p| p.domid);
    let name = req.into_inner().name;
    if name.is_empty() {
        return Err(tonic::Status::invalid_argument("name must not be empty"));
    }
    Ok(tonic::Response::new(HelloReply {
        message: format!("hello over xensock, {name}"),
        caller_domid,
    }))
}

impl<B> Service<http::Request<B>> for GreeterServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        match req.uri().path() {
            SAY_HELLO => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(tower::service_fn(say_hello), req).await)
            }),
            _ => Box::pin(async { Ok(tonic::Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The `Greeter` client, as `tonic-build` would generate it.
pub struct GreeterClient {
    inner: tonic::client::Grpc<tonic::transport::Channel>,
}

impl GreeterClient {
    /// A client over `channel`.
    pub fn new(channel: tonic::transport::Channel) -> GreeterClient {
        GreeterClient {
            inner: tonic::client::Grpc::new(channel),
        }
    }

    /// The unary `SayHello` RPC.
    pub async fn say_hello(
        &mut self,
        req: HelloRequest,
    ) -> Result<tonic::Response<HelloReply>, tonic::Status> {
        self.inner
            .ready()
            .await
            .map_err(|e| tonic::Status::unknown(format!("service not ready: {e}")))?;
        let path = http::uri::PathAndQuery::from_static(SAY_HELLO);
        self.inner
            .unary(tonic::Request::new(req), path, ProstCodec::default())
            .await
    }
}

/// Serves `Greeter` on one domain and calls it from another with each of
/// `names`; returns, per call, the reply (message and the caller domain id
/// the server saw) or the status code, and the client's domain id.
#[allow(clippy::type_complexity)]
pub async fn run(
    names: &[&str],
) -> Result<(Vec<Result<(String, u32), tonic::Code>>, u32), Box<dyn std::error::Error + Send + Sync>>
{
    let host = SimHost::start()?;
    let ds = host.create_domain(DomainConfig::new("grpc-server"))?;
    let dc = host.create_domain(DomainConfig::new("grpc-client"))?;
    let server_t = Transport::sim(host.dir(), ds.domid)?;
    let client_t = Transport::sim(host.dir(), dc.domid)?;

    let listener = XenListener::bind_on(&server_t, "xen:self:50051")?;
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let incoming = listener;
        Server::builder()
            .serve_with_incoming_shutdown(GreeterServer, incoming, async {
                let _ = stop_rx.await;
            })
            .await
    });

    let server_addr = (u32::from(ds.domid), 50051);
    // The URI is only used for the :authority header; the connector ignores it.
    let channel = Endpoint::from_static("http://greeter.xen")
        .connect_with_connector(tower::service_fn(move |_uri: http::Uri| {
            let t = client_t.clone();
            async move {
                XenStream::connect_on(&t, server_addr)
                    .await
                    .map(TokioIo::new)
            }
        }))
        .await?;
    let mut client = GreeterClient::new(channel);
    let mut out = Vec::new();
    for name in names {
        let r = client
            .say_hello(HelloRequest {
                name: (*name).to_string(),
            })
            .await;
        out.push(match r {
            Ok(resp) => {
                let r = resp.into_inner();
                Ok((r.message, r.caller_domid))
            }
            Err(status) => Err(status.code()),
        });
    }
    drop(client);
    let _ = stop_tx.send(());
    server.await??;
    Ok((out, u32::from(dc.domid)))
}

#[cfg_attr(test, allow(dead_code))]
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let (replies, _) = run(&["dom-a", "", "grpc"]).await?;
    for r in replies {
        match r {
            Ok((message, domid)) => println!("{message} (caller domain {domid})"),
            Err(code) => println!("error: {code:?}"),
        }
    }
    Ok(())
}
