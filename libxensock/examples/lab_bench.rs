//! `lab_bench`: xlbench's workload (`lab/tools/xlbench.c`) over libxensock,
//! for the xensock rows of `lab/run bench`.
//!
//! ```text
//! lab_bench server kernel|user <port> <MiB> <N>
//! lab_bench client kernel|user <server-domid> <port> <MiB> <N> [connect-timeout-s]
//! ```
//!
//! `kernel`: `XenListener::bind` / `XenStream::connect`, which use the
//! AF_XEN family of `af_xen.ko` (refused if another backend is chosen).
//! `user`: the user-space transport over `/dev/xen`
//! (`Transport::from_env`, with a 30 s link timeout: the first link takes
//! seconds under TCG).
//!
//! Workload, as xlbench: the client streams `<MiB>` MiB in 64 KiB writes
//! of a prime-period pattern, the server checks every byte and answers one
//! byte, then `<N>` one-byte round trips. The client prints
//! `@@METRIC <label>.stream_mib_s` and `<label>.rtt_us_{avg,p50,p99}`
//! (label: `$XLBENCH_LABEL`, default `xensock-<mode>`).

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use libxensock::{BackendKind, Config, SockAddrXen, Transport, XenListener, XenStream, DOMID_ANY};
use xensock_discovery::xs::XsClient;

const CHUNK: usize = 64 * 1024;
const PATLEN: usize = 65521;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn pattern() -> Vec<u8> {
    (0..PATLEN + CHUNK)
        .map(|i| {
            let p = (i % PATLEN) as u64;
            ((p * 131) ^ (p >> 7)) as u8
        })
        .collect()
}

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> Res<T> {
    a.get(i)
        .ok_or_else(|| format!("missing {what}"))?
        .parse()
        .map_err(|_| format!("bad {what}").into())
}

fn user_transport() -> Res<Transport> {
    let report = libxensock::backend();
    if report.user_space != BackendKind::DevXen {
        return Err(format!(
            "user-space transport needs /dev/xen, have {}",
            report.user_space
        )
        .into());
    }
    let xs = XsClient::open()?;
    let domid = xs.read_string("domid")?.trim().parse()?;
    let cfg = Config {
        link_timeout: Duration::from_secs(30),
        ..Default::default()
    };
    let dev = xensock_xenif::dev::DevXen::open()?;
    Ok(Transport::with_backend(
        dev,
        xs,
        domid,
        BackendKind::DevXen,
        cfg,
    )?)
}

fn check_kernel() -> Res<()> {
    let r = libxensock::backend();
    if r.kind != BackendKind::Kernel {
        return Err(format!("kernel mode, but the backend is {}", r.kind).into());
    }
    Ok(())
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let r = match a.get(1).map(String::as_str) {
        Some("server") => server(&a),
        Some("client") => client(&a),
        _ => Err("usage: lab_bench server kernel|user PORT MIB N | client kernel|user DOMID PORT MIB N [TIMEOUT]".into()),
    };
    match r {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("lab_bench: error: {e}");
            std::process::exit(2);
        }
    }
}

fn server(a: &[String]) -> Res<i32> {
    let mode = a.get(2).map(String::as_str).unwrap_or("");
    let port: u32 = arg(a, 3, "port")?;
    let mib: u64 = arg(a, 4, "MiB")?;
    let n: u64 = arg(a, 5, "N")?;
    let addr = SockAddrXen::new(DOMID_ANY, port);
    let mut transport = None;
    let listener = match mode {
        "kernel" => {
            check_kernel()?;
            XenListener::bind(addr)?
        }
        "user" => transport.insert(user_transport()?).bind(addr)?,
        _ => return Err("mode must be kernel or user".into()),
    };
    println!(
        "lab_bench {mode} server: {} on {}",
        listener.backend_kind(),
        listener.local_addr()?
    );
    let (mut s, peer) = listener.accept()?;
    println!("lab_bench {mode} server: connection from {peer}");
    let pat = pattern();
    let total = mib << 20;
    let mut buf = vec![0u8; CHUNK];
    let (mut pos, mut bad) = (0u64, 0u64);
    while pos < total {
        let want = (total - pos).min(CHUNK as u64) as usize;
        let r = s.read(&mut buf[..want])?;
        if r == 0 {
            return Err(format!("stream ended at {pos} of {total} bytes").into());
        }
        let off = (pos % PATLEN as u64) as usize;
        if buf[..r] != pat[off..off + r] {
            bad += 1;
        }
        pos += r as u64;
    }
    s.write_all(if bad == 0 { b"K" } else { b"X" })?;
    let mut b = [0u8; 1];
    for _ in 0..n {
        s.read_exact(&mut b)?;
        s.write_all(&b)?;
    }
    println!("lab_bench {mode} server: received {mib} MiB ({bad} bad reads), echoed {n} pings");
    // let the client read the last echo before the connection goes
    std::thread::sleep(Duration::from_secs(1));
    drop(s);
    drop(listener);
    drop(transport);
    Ok(if bad == 0 { 0 } else { 1 })
}

fn connect(mode: &str, t: Option<&Transport>, addr: SockAddrXen, secs: u64) -> Res<XenStream> {
    let end = Instant::now() + Duration::from_secs(secs);
    loop {
        let r = match (mode, t) {
            ("kernel", _) => XenStream::connect(addr),
            (_, Some(t)) => t.connect(addr),
            _ => return Err("no transport".into()),
        };
        match r {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() < end => {
                println!("connect {addr}: {e}; retrying");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => return Err(format!("connect {addr}: {e}").into()),
        }
    }
}

fn client(a: &[String]) -> Res<i32> {
    let mode = a.get(2).map(String::as_str).unwrap_or("");
    let domid: u32 = arg(a, 3, "domid")?;
    let port: u32 = arg(a, 4, "port")?;
    let mib: u64 = arg(a, 5, "MiB")?;
    let n: usize = arg(a, 6, "N")?;
    let timeout: u64 = if a.len() > 7 {
        arg(a, 7, "timeout")?
    } else {
        120
    };
    let label = std::env::var("XLBENCH_LABEL").unwrap_or_else(|_| format!("xensock-{mode}"));
    let transport = match mode {
        "kernel" => {
            check_kernel()?;
            None
        }
        "user" => Some(user_transport()?),
        _ => return Err("mode must be kernel or user".into()),
    };
    let mut s = connect(
        mode,
        transport.as_ref(),
        SockAddrXen::new(domid, port),
        timeout,
    )?;
    println!(
        "lab_bench {mode} client: {} {} -> {}",
        s.backend_kind(),
        s.local_addr()?,
        s.peer_addr()?
    );
    let pat = pattern();
    let total = mib << 20;
    let t0 = Instant::now();
    let mut pos = 0u64;
    while pos < total {
        let len = (total - pos).min(CHUNK as u64) as usize;
        let off = (pos % PATLEN as u64) as usize;
        s.write_all(&pat[off..off + len])?;
        pos += len as u64;
    }
    let mut b = [0u8; 1];
    s.read_exact(&mut b)?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "@@METRIC {label}.stream_mib_s {:.1} MiB/s",
        mib as f64 / secs
    );
    if b[0] != b'K' {
        println!("lab_bench {mode}: server saw corrupted stream data");
        return Ok(1);
    }
    let mut rtt = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        s.write_all(&[i as u8])?;
        s.read_exact(&mut b)?;
        rtt.push(t.elapsed().as_secs_f64() * 1e6);
        if b[0] != i as u8 {
            println!("lab_bench {mode}: ping-pong byte mismatch");
            return Ok(1);
        }
    }
    if n > 0 {
        let avg = rtt.iter().sum::<f64>() / n as f64;
        rtt.sort_by(f64::total_cmp);
        println!("@@METRIC {label}.rtt_us_avg {avg:.1} us");
        println!("@@METRIC {label}.rtt_us_p50 {:.1} us", rtt[n / 2]);
        println!("@@METRIC {label}.rtt_us_p99 {:.1} us", rtt[n * 99 / 100]);
    }
    io::stdout().flush()?;
    drop(s);
    drop(transport);
    Ok(0)
}
