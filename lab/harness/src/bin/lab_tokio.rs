// SPDX-License-Identifier: MIT OR Apache-2.0
//! `lab_tokio`: tokio-xensock across two real Xen domains, run by
//! `tests/lab/kmod-rust` with `af_xen.ko` loaded (the tokio code is the
//! same as over the user-space transport; only the backend differs).
//!
//! ```text
//! lab_tokio server                 serve until a connection to 7299
//! lab_tokio client <server-domid>  run the checks against that server
//! ```
//!
//! Ports: 7201 echo (the accepted stream `into_split`, `tokio::io::copy`
//! from the read half to the write half), 7202 `Framed<_, LinesCodec>`
//! upper-casing, 7299 stop. Each check prints
//! `@@RESULT tokio-<name> PASS|FAIL <detail>`; exit status = failures.

use std::time::{Duration, Instant};

use futures_util::{SinkExt, StreamExt};
use libxensock::{BackendKind, SockAddrXen, DOMID_ANY};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::codec::{Framed, LinesCodec};
use tokio_xensock::{XenListener, XenStream};

const ECHO: u32 = 7201;
const LINES: u32 = 7202;
const STOP: u32 = 7299;
const ECHO_MIB: usize = 16;

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn pat(pos: usize) -> u8 {
    let p = (pos % 65521) as u64;
    ((p * 131) ^ (p >> 7)) as u8
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let a: Vec<String> = std::env::args().collect();
    print!("{}", libxensock::backend());
    let r = match (a.get(1).map(String::as_str), a.get(2)) {
        (Some("server"), _) => server().await.map(|()| 0),
        (Some("client"), Some(d)) => match d.parse() {
            Ok(d) => Ok(client(d).await),
            Err(_) => Err("bad domid".into()),
        },
        _ => Err("usage: lab_tokio server | client <server-domid>".into()),
    };
    match r {
        Ok(f) => std::process::exit(f.min(100) as i32),
        Err(e) => {
            eprintln!("lab_tokio: error: {e}");
            std::process::exit(101);
        }
    }
}

async fn server() -> Res<()> {
    let echo = XenListener::bind(SockAddrXen::new(DOMID_ANY, ECHO))?;
    let lines = XenListener::bind(SockAddrXen::new(DOMID_ANY, LINES))?;
    let stop = XenListener::bind(SockAddrXen::new(DOMID_ANY, STOP))?;
    println!("lab_tokio server: listening on {ECHO}, {LINES}, {STOP}");
    tokio::spawn(async move {
        loop {
            match echo.accept().await {
                Ok((s, peer)) => {
                    tokio::spawn(async move {
                        let (mut r, mut w) = s.into_split();
                        match tokio::io::copy(&mut r, &mut w).await {
                            Ok(n) => println!("tokio echo {peer}: {n} bytes"),
                            Err(e) => println!("tokio echo {peer}: {e}"),
                        }
                        // dropping the write half shuts it down: the client sees EOF
                    });
                }
                Err(e) => println!("tokio echo accept: {e}"),
            }
        }
    });
    tokio::spawn(async move {
        let mut incoming = lines.incoming();
        while let Some(s) = incoming.next().await {
            let Ok(s) = s else { continue };
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
    let (mut s, who) = stop.accept().await?;
    // closing at once races the client's connect in af_xen (lab_kernel's
    // accept-close check): wait for its EOF
    let _ = s.read_to_end(&mut Vec::new()).await;
    println!("lab_tokio server: stop from {who}");
    Ok(())
}

async fn connect_retry(addr: SockAddrXen) -> Res<XenStream> {
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        match XenStream::connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < end => {
                println!("connect {addr}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(format!("connect {addr}: {e}").into()),
        }
    }
}

async fn client(server: u32) -> u32 {
    let mut failures = 0;
    let mut report = |name: &str, r: Res<String>, t: Instant| {
        let ms = t.elapsed().as_millis();
        match r {
            Ok(d) => println!("@@RESULT tokio-{name} PASS {d} ({ms} ms)"),
            Err(e) => {
                failures += 1;
                println!("@@RESULT tokio-{name} FAIL {e} ({ms} ms)");
            }
        }
    };

    let t = Instant::now();
    report("echo-into-split", echo_into_split(server).await, t);
    let t = Instant::now();
    report("framed-lines", framed_lines(server).await, t);
    let t = Instant::now();
    let r = tokio::task::spawn_blocking(move || concurrent_connects(server))
        .await
        .unwrap_or_else(|e| Err(e.to_string().into()));
    report("concurrent-connects", r, t);
    let t = Instant::now();
    let r = async {
        let _s = XenStream::connect(SockAddrXen::new(server, STOP)).await?;
        Ok(String::new())
    }
    .await;
    report("stop-server", r, t);
    failures
}

/// 16 MiB through the echo, written by one task and read back and
/// checked by another, over the two owned halves of one stream.
async fn echo_into_split(server: u32) -> Res<String> {
    let s = connect_retry(SockAddrXen::new(server, ECHO)).await?;
    if libxensock::backend().kind != BackendKind::Kernel {
        return Err(format!("backend is {}", libxensock::backend().kind).into());
    }
    let (mut r, mut w) = s.into_split();
    let total = ECHO_MIB << 20;
    let t = Instant::now();
    let writer = tokio::spawn(async move {
        let chunk: Vec<u8> = (0..65521 + 65536).map(pat).collect();
        let mut pos = 0;
        while pos < total {
            let n = (total - pos).min(65536);
            let off = pos % 65521;
            w.write_all(&chunk[off..off + n]).await?;
            pos += n;
        }
        w.shutdown().await?;
        Ok::<_, std::io::Error>(())
    });
    let mut buf = vec![0u8; 65536];
    let mut pos = 0usize;
    loop {
        let n = r.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        if let Some(i) = (0..n).find(|i| buf[*i] != pat(pos + i)) {
            return Err(format!("byte {} differs", pos + i).into());
        }
        pos += n;
    }
    writer.await??;
    if pos != total {
        return Err(format!("echoed {pos} of {total} bytes").into());
    }
    Ok(format!(
        "{ECHO_MIB} MiB out and back, checked ({:.1} MiB/s each way)",
        ECHO_MIB as f64 / t.elapsed().as_secs_f64()
    ))
}

async fn framed_lines(server: u32) -> Res<String> {
    let s = connect_retry(SockAddrXen::new(server, LINES)).await?;
    let mut f = Framed::new(s, LinesCodec::new());
    for i in 0..100 {
        let line = format!("line {i} over xen grants");
        f.send(line.clone()).await?;
        let answer = f.next().await.ok_or("connection closed")??;
        if answer != line.to_uppercase() {
            return Err(format!("answer {answer:?} to {line:?}").into());
        }
    }
    Ok("100 lines through Framed<XenStream, LinesCodec>".into())
}

/// 32 connects to the echo server at once from a current-thread runtime of
/// their own: over a link the kernel's connect is non-blocking
/// (`EINPROGRESS`, then the socket's write readiness and `SO_ERROR`), so
/// several are in flight before the first answer and no thread of tokio's
/// blocking pool starts. Each connection echoes its own 4 bytes.
fn concurrent_connects(server: u32) -> Res<String> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    const N: u32 = 32;
    let threads = Arc::new(AtomicUsize::new(0));
    let started = threads.clone();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .on_thread_start(move || {
            started.fetch_add(1, Ordering::Relaxed);
        })
        .build()?;
    let (max_in_flight, echoed) = rt.block_on(async {
        let in_flight = Arc::new(AtomicUsize::new(0));
        let max = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for i in 0..N {
            let (in_flight, max) = (in_flight.clone(), max.clone());
            tasks.push(tokio::spawn(async move {
                in_flight.fetch_add(1, Ordering::SeqCst);
                let connect = XenStream::connect(SockAddrXen::new(server, ECHO));
                let s = tokio::time::timeout(Duration::from_secs(60), connect).await;
                max.fetch_max(in_flight.load(Ordering::SeqCst), Ordering::SeqCst);
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let mut s = s.map_err(|_| format!("connect {i}: no answer in 60 s"))??;
                s.write_all(&i.to_le_bytes()).await?;
                s.shutdown().await?;
                let mut back = Vec::new();
                s.read_to_end(&mut back).await?;
                Ok::<bool, Box<dyn std::error::Error + Send + Sync>>(back == i.to_le_bytes())
            }));
        }
        let mut echoed = 0;
        for t in tasks {
            echoed += u32::from(t.await??);
        }
        Ok::<_, Box<dyn std::error::Error + Send + Sync>>((max.load(Ordering::SeqCst), echoed))
    })?;
    if echoed != N {
        return Err(format!("{echoed} of {N} connections echoed their own bytes").into());
    }
    if max_in_flight < 2 {
        return Err(
            format!("connects ran one at a time (at most {max_in_flight} in flight)").into(),
        );
    }
    let blocking = threads.load(Ordering::Relaxed);
    if blocking != 0 {
        return Err(format!("{blocking} blocking-pool thread(s) started").into());
    }
    Ok(format!(
        "{N} connects, up to {max_in_flight} in flight on one thread, no blocking-pool thread"
    ))
}
