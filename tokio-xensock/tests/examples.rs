// SPDX-License-Identifier: MIT OR Apache-2.0
//! The examples run as tests.

#[path = "../examples/hyper_http1.rs"]
mod hyper_http1;

#[path = "../examples/framed_lines.rs"]
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

#[path = "../examples/tonic_grpc.rs"]
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
