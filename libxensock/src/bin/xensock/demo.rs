// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock demo`: a checksummed stream echoed between two domains of a
//! simulated host, beside the same through TCP loopback.

use super::*;

/// Streams `total` bytes through an echo peer: one thread writes, this one
/// reads back. Returns (sent checksum, received checksum, bytes received, elapsed).
pub(crate) fn echo_run<S>(
    s: S,
    total: u64,
    write_size: usize,
    pb: Option<&ProgressBar>,
) -> Res<(u64, u64, u64, Duration)>
where
    S: Read + Write + Send + 'static + TryCloneShut,
{
    // Writes start at varying offsets of a random block, so that lost,
    // duplicated or reordered data changes the checksum.
    let block = pattern(write_size + 8192);
    let mut w = s.try_clone_box()?;
    let start = Instant::now();
    let writer = thread::spawn(move || -> io::Result<u64> {
        let sum = write_stream(&mut w, &block, total, write_size)?;
        w.shutdown_write()?;
        Ok(sum)
    });
    let mut r = s;
    let (recv, got) = read_stream(&mut r, |got| {
        if let Some(pb) = pb {
            pb.set_position(got);
        }
    })?;
    let elapsed = start.elapsed();
    let sent = writer.join().map_err(|_| "writer panicked")??;
    Ok((sent, recv, got, elapsed))
}

/// A stream whose write side can be cloned off and shut down.
pub(crate) trait TryCloneShut: Read + Write + Send {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>>;
    fn shutdown_write(&self) -> io::Result<()>;
}

impl TryCloneShut for XenStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl TryCloneShut for TcpStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl TryCloneShut for UnixStream {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        Ok(Box::new(self.try_clone()?))
    }
    fn shutdown_write(&self) -> io::Result<()> {
        self.shutdown(Shutdown::Write)
    }
}
impl TryCloneShut for Box<dyn TryCloneShut> {
    fn try_clone_box(&self) -> io::Result<Box<dyn TryCloneShut>> {
        (**self).try_clone_box()
    }
    fn shutdown_write(&self) -> io::Result<()> {
        (**self).shutdown_write()
    }
}

/// Echoes everything back until EOF, then shuts down its write side.
pub(crate) fn echo_serve(mut s: Box<dyn TryCloneShut>) -> io::Result<u64> {
    let mut buf = vec![0u8; 256 * 1024];
    let mut total = 0;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            s.shutdown_write()?;
            return Ok(total);
        }
        s.write_all(&buf[..n])?;
        total += n as u64;
    }
}

pub(crate) fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

pub(crate) fn bar(total: u64, quiet: bool, what: &str) -> Option<ProgressBar> {
    if quiet {
        return None;
    }
    let pb = ProgressBar::new(total);
    pb.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{bar:40.cyan/blue}] {bytes}/{total_bytes} {bytes_per_sec}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    pb.set_prefix(what.to_string());
    Some(pb)
}

pub(crate) fn demo(mib: u64, write_size: usize, ring: usize, quiet: bool) -> Res<()> {
    let total = mib << 20;
    println!(
        "xensock demo: two domains of a simulated Xen host, in this process; \
         every figure below is the simulation's (real Xen: lab/run bench, docs/lab.md)."
    );
    let report = libxensock::backend();
    println!(
        "(This machine's own backend, which programs here would use: {})",
        report.kind
    );
    for r in &report.reasons {
        println!("  {r}");
    }
    println!("Starting the simulated host:");
    let host = SimHost::start()?;
    let ds = host.create_domain(DomainConfig::new("echo-server"))?;
    let dc = host.create_domain(DomainConfig::new("client"))?;
    println!(
        "  domain {} \"{}\" runs an echo server; domain {} \"{}\" the client (sim in {})",
        ds.domid,
        ds.name,
        dc.domid,
        dc.name,
        host.dir().display()
    );
    let ts = Transport::sim(host.dir(), ds.domid)?;
    let tc = Transport::sim(host.dir(), dc.domid)?;
    let opts = SocketOptions {
        recv_buffer: Some(ring),
        ..Default::default()
    };
    let l = ts.bind_with("xen:self:7", opts)?;
    let server = thread::spawn(move || -> io::Result<u64> {
        let (s, peer) = l.accept()?;
        let _ = peer;
        echo_serve(Box::new(s))
    });
    let t0 = Instant::now();
    let c = tc.connect_with(SockAddrXen::new(ds.domid.into(), 7), None, opts)?;
    let setup = t0.elapsed();
    let node = xensock_proto::link::HalfPath {
        owner: dc.domid.into(),
        peer: ds.domid.into(),
    }
    .to_string();
    let read = |p: &str| {
        host.xenstore_read(p)
            .map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_else(|_| "?".into())
    };
    println!(
        "  link {} <-> {} set up through XenStore in {:.1?}: {node}/{{ring-ref={}, event-channel={}, state={}}}",
        dc.domid,
        ds.domid,
        setup,
        read(&format!("{node}/{}", link_node::RING_REF)),
        read(&format!("{node}/{}", link_node::EVENT_CHANNEL)),
        read(&format!("{node}/{}", link_node::STATE)),
    );
    println!(
        "  connected {} -> {}; rings: {} KiB each way; host now has {} grants, {} mappings, {} event-channel ports",
        c.local_addr()?,
        c.peer_addr()?,
        c.recv_buffer_size() / 1024,
        host.stats().grants,
        host.stats().mappings,
        host.stats().ports
    );
    println!("Streaming {mib} MiB through the echo server in {write_size}-byte writes:");
    let pb = bar(total, quiet, "xensock");
    let (sent, recv, got, xen_t) = echo_run(c, total, write_size, pb.as_ref())?;
    if let Some(pb) = pb {
        pb.finish();
    }
    let echoed = server.join().map_err(|_| "server panicked")??;
    if got != total || sent != recv {
        return Err(
            format!("checksum mismatch: sent {total} bytes, echoed {echoed}, got {got}").into(),
        );
    }
    println!(
        "  xensock (simulated host): {got} bytes echoed, checksum {recv:016x} matches, {:.0} MB/s each way",
        mbps(got, xen_t)
    );

    // The same over TCP loopback.
    let tl = TcpListener::bind("127.0.0.1:0")?;
    let addr = tl.local_addr()?;
    let tserver = thread::spawn(move || -> io::Result<u64> {
        let (s, _) = tl.accept()?;
        echo_serve(Box::new(s))
    });
    let tc2 = TcpStream::connect(addr)?;
    let pb = bar(total, quiet, "TCP loopback");
    let (tsent, trecv, tgot, tcp_t) = echo_run(tc2, total, write_size, pb.as_ref())?;
    if let Some(pb) = pb {
        pb.finish();
    }
    tserver.join().map_err(|_| "server panicked")??;
    if tgot != total || tsent != trecv {
        return Err("TCP checksum mismatch".into());
    }
    println!(
        "  TCP loopback:             {tgot} bytes echoed, checksum {trecv:016x} matches, {:.0} MB/s each way",
        mbps(tgot, tcp_t)
    );
    println!(
        "  xensock / TCP loopback throughput: {:.2}x (simulated host: grants and event channels are emulated by a process here)",
        tcp_t.as_secs_f64() / xen_t.as_secs_f64()
    );
    drop((tc, ts));
    let released = (0..200).any(|_| {
        thread::sleep(Duration::from_millis(10));
        host.stats().grants_and_channels_released()
    });
    println!(
        "Closed: every grant, mapping and event channel released: {}",
        if released { "yes" } else { "NO" }
    );
    if !released {
        return Err(format!("leaked: {:?}", host.stats()).into());
    }
    Ok(())
}
