// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock bench`: throughput, latency, connection rate and memory per
//! idle connection, xensock against AF_UNIX and TCP loopback, and its chart.

use super::*;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Kind {
    Xen,
    Unix,
    Tcp,
}

pub(crate) const KINDS: [Kind; 3] = [Kind::Xen, Kind::Unix, Kind::Tcp];

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Xen => "xensock",
            Kind::Unix => "AF_UNIX",
            Kind::Tcp => "TCP lo",
        }
    }
}

pub(crate) struct Env {
    host: SimHost,
    a: Transport,
    b: Transport,
    bid: u32,
    port: u32,
}

pub(crate) type Pair = (Box<dyn TryCloneShut>, Box<dyn TryCloneShut>);

pub(crate) fn make_pair(env: &mut Env, kind: Kind, ring: Option<usize>) -> Res<Pair> {
    Ok(match kind {
        Kind::Xen => {
            env.port += 1;
            let opts = SocketOptions {
                recv_buffer: ring,
                backlog: Some(4),
            };
            let l = env.b.bind_with((env.bid, env.port), opts)?;
            let c = env.a.connect_with((env.bid, env.port), None, opts)?;
            let (s, _) = l.accept()?;
            (Box::new(c), Box::new(s))
        }
        Kind::Unix => {
            let (a, b) = UnixStream::pair()?;
            (Box::new(a), Box::new(b))
        }
        Kind::Tcp => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let c = TcpStream::connect(l.local_addr()?)?;
            c.set_nodelay(true)?;
            let (s, _) = l.accept()?;
            s.set_nodelay(true)?;
            (Box::new(c), Box::new(s))
        }
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub(crate) enum Placement {
    /// Writer on CPU 0, reader on CPU 1.
    Spread,
    /// Both on CPU 0.
    Same,
    /// Wherever the scheduler puts them.
    Any,
}

impl Placement {
    /// CPUs for (writer, reader), if pinned.
    fn cpus(self) -> Option<(usize, usize)> {
        match self {
            Placement::Spread => Some((0, 1)),
            Placement::Same => Some((0, 0)),
            Placement::Any => None,
        }
    }
}

/// Restricts the calling thread to `cpu`, or lets it run anywhere again.
pub(crate) fn pin_to(cpu: Option<usize>) {
    use nix::sched::{sched_setaffinity, CpuSet};
    use nix::unistd::{sysconf, Pid, SysconfVar};
    // Not available_parallelism(): that follows our own affinity mask.
    let online = sysconf(SysconfVar::_NPROCESSORS_ONLN)
        .ok()
        .flatten()
        .and_then(|n| usize::try_from(n).ok())
        .unwrap_or(1)
        .max(1);
    let mut set = CpuSet::new();
    for c in 0..online.min(CpuSet::count()) {
        if cpu.is_none_or(|p| p % online == c) {
            let _ = set.set(c);
        }
    }
    // 0 is the calling thread. A failure leaves the thread where it was,
    // which only costs accuracy.
    let _ = sched_setaffinity(Pid::from_raw(0), &set);
}

pub(crate) fn throughput(
    env: &mut Env,
    kind: Kind,
    write: usize,
    total: u64,
    place: Placement,
) -> Res<f64> {
    let (mut c, mut s) = make_pair(env, kind, Some(1 << 20))?;
    let block = pattern(write);
    let cpus = place.cpus();
    pin_to(cpus.map(|c| c.1));
    let start = Instant::now();
    let w = thread::spawn(move || -> io::Result<()> {
        pin_to(cpus.map(|c| c.0));
        let mut sent = 0;
        while sent < total {
            c.write_all(&block)?;
            sent += block.len() as u64;
        }
        c.shutdown_write()
    });
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0u64;
    loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break;
        }
        got += n as u64;
    }
    let t = start.elapsed();
    pin_to(None);
    w.join().map_err(|_| "writer panicked")??;
    Ok(mbps(got, t))
}

pub(crate) fn pingpong(env: &mut Env, kind: Kind, rounds: u32) -> Res<f64> {
    let (mut c, mut s) = make_pair(env, kind, None)?;
    let echo = thread::spawn(move || -> io::Result<()> {
        let mut b = [0u8; 1];
        loop {
            if s.read(&mut b)? == 0 {
                return Ok(());
            }
            s.write_all(&b)?;
        }
    });
    let mut b = [7u8; 1];
    for _ in 0..rounds / 10 {
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
    }
    let start = Instant::now();
    for _ in 0..rounds {
        c.write_all(&b)?;
        c.read_exact(&mut b)?;
    }
    let t = start.elapsed();
    c.shutdown_write()?;
    echo.join().map_err(|_| "echo panicked")??;
    Ok(t.as_secs_f64() * 1e6 / f64::from(rounds) / 2.0)
}

pub(crate) fn connect_rate(env: &mut Env, kind: Kind, n: u32) -> Res<f64> {
    let start;
    match kind {
        Kind::Xen => {
            env.port += 1;
            let l = env.b.bind((env.bid, env.port))?;
            let addr = (env.bid, env.port);
            start = Instant::now();
            for _ in 0..n {
                let c = env.a.connect(addr)?;
                let (s, _) = l.accept()?;
                drop((c, s));
            }
        }
        Kind::Unix => {
            let dir = std::env::temp_dir().join(format!("xensock-bench-{}", std::process::id()));
            let _ = std::fs::remove_file(&dir);
            let l = std::os::unix::net::UnixListener::bind(&dir)?;
            start = Instant::now();
            for _ in 0..n {
                let c = UnixStream::connect(&dir)?;
                let (s, _) = l.accept()?;
                drop((c, s));
            }
            let _ = std::fs::remove_file(&dir);
        }
        Kind::Tcp => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            let addr = l.local_addr()?;
            start = Instant::now();
            for _ in 0..n {
                let c = TcpStream::connect(addr)?;
                let (s, _) = l.accept()?;
                drop((c, s));
            }
        }
    }
    Ok(f64::from(n) / start.elapsed().as_secs_f64())
}

pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Resident memory per idle connection (both ends, user space only: the
/// sim's shared pages are counted when touched, kernel socket buffers of
/// AF_UNIX/TCP are not in RSS).
///
/// Returns (RSS per connection, the part of it that is the peer's ring
/// pages mapped a second time: both domains live in this one process, so
/// each shared page is resident twice here, once in a real deployment).
pub(crate) fn idle_memory(env: &mut Env, kind: Kind, n: usize) -> Res<(f64, f64)> {
    let maps_before = env.host.stats().mappings;
    let before = rss_bytes();
    let mut keep = Vec::with_capacity(n);
    for _ in 0..n {
        keep.push(make_pair(env, kind, Some(2048))?);
    }
    let after = rss_bytes();
    let mapped_twice = env.host.stats().mappings.saturating_sub(maps_before) * 4096;
    drop(keep);
    let per = |b: u64| b as f64 / n as f64;
    let twice = if kind == Kind::Xen {
        per(mapped_twice as u64)
    } else {
        0.0
    };
    Ok((per(after.saturating_sub(before)), twice))
}

/// Median and spread of repeated measurements.
#[derive(Clone, Copy, Default)]
pub(crate) struct Stat {
    median: f64,
    min: f64,
    max: f64,
}

impl Stat {
    fn of(mut v: Vec<f64>) -> Stat {
        v.sort_by(|a, b| a.total_cmp(b));
        match (v.first(), v.get(v.len() / 2), v.last()) {
            (Some(&min), Some(&median), Some(&max)) => Stat { median, min, max },
            _ => Stat::default(),
        }
    }
}

pub(crate) fn bench(
    scale: f64,
    plot: Option<PathBuf>,
    reps: usize,
    placement: Placement,
) -> Res<()> {
    let host = SimHost::start()?;
    let da = host.create_domain(DomainConfig::new("bench-a"))?;
    let db = host.create_domain(DomainConfig::new("bench-b"))?;
    let mut env = Env {
        a: Transport::sim(host.dir(), da.domid)?,
        b: Transport::sim(host.dir(), db.domid)?,
        bid: db.domid.into(),
        port: 1000,
        host,
    };
    println!("{}", libxensock::backend());
    println!("xensock on the simulated host vs AF_UNIX vs TCP loopback (same run, same machine)");
    println!(
        "every figure is the median of {reps} runs, interleaved by kind; xensock's min..max in brackets\n"
    );
    let sizes = [64usize, 1024, 16 * 1024, 64 * 1024, 1 << 20];
    let placed = match placement {
        Placement::Spread => "spread: writer on CPU 0, reader on CPU 1",
        Placement::Same => "same: writer and reader on CPU 0",
        Placement::Any => "any: wherever the scheduler puts them",
    };
    println!("stream throughput, MB/s (one writer, one reader, 1 MiB rings; placement {placed})");
    println!(
        "{:>10} {:>10} {:>13} {:>10} {:>10} {:>9} {:>9}",
        "write", "xensock", "(min..max)", "AF_UNIX", "TCP lo", "x/unix", "x/tcp"
    );
    let mut rows = Vec::new();
    for &w in &sizes {
        let total = ((if w < 1024 { 16u64 << 20 } else { 256u64 << 20 }) as f64 * scale) as u64;
        let total = total.max(w as u64);
        let r = interleaved(reps, |k| throughput(&mut env, k, w, total, placement))?;
        println!(
            "{:>10} {:>10.0} {:>13} {:>10.0} {:>10.0} {:>8.2}x {:>8.2}x",
            human(w),
            r[0].median,
            format!("({:.0}..{:.0})", r[0].min, r[0].max),
            r[1].median,
            r[2].median,
            r[0].median / r[1].median,
            r[0].median / r[2].median
        );
        rows.push((w, r));
    }
    let rounds = ((20_000f64 * scale) as u32).max(100);
    let lat = interleaved(reps, |k| pingpong(&mut env, k, rounds))?;
    println!("\n1-byte ping-pong, one-way latency (us)");
    println!("{:>10} {:>10} {:>10}", "xensock", "AF_UNIX", "TCP lo");
    println!(
        "{:>10.2} {:>10.2} {:>10.2}   xensock/TCP {:.2}x  xensock/unix {:.2}x  (xensock {:.2}..{:.2})",
        lat[0].median,
        lat[1].median,
        lat[2].median,
        lat[0].median / lat[2].median,
        lat[0].median / lat[1].median,
        lat[0].min,
        lat[0].max
    );
    let n = ((2000f64 * scale) as u32).max(10);
    let rate = interleaved(reps, |k| connect_rate(&mut env, k, n))?;
    println!("\nconnect+accept+close per second ({n} in a row, one thread)");
    println!(
        "{:>10.0} {:>10.0} {:>10.0}   xensock/TCP {:.2}x  (xensock {:.0}..{:.0})",
        rate[0].median,
        rate[1].median,
        rate[2].median,
        rate[0].median / rate[2].median,
        rate[0].min,
        rate[0].max
    );
    let idle = ((1000f64 * scale) as usize).max(10);
    let mut mem = [(0f64, 0f64); 3];
    for (i, k) in KINDS.iter().enumerate() {
        mem[i] = idle_memory(&mut env, *k, idle)?;
    }
    println!("\nresident memory per idle connection, both ends, {idle} connections (bytes; xensock with 2 KiB rings; kernel socket memory is not in RSS)");
    println!("{:>10.0} {:>10.0} {:>10.0}", mem[0].0, mem[1].0, mem[2].0);
    println!(
        "  xensock: {:.0} of it is each ring page resident a second time as the peer's mapping (both domains are this one process); one copy each: {:.0}",
        mem[0].1,
        mem[0].0 - mem[0].1
    );
    println!("\ncolumns: {}", KINDS.map(|k| k.name()).join(", "));
    if let Some(p) = plot {
        let what = format!(
            "simulated host, one writer and one reader ({placed}), 1 MiB rings; \
             points: median of {reps} runs, bars: min..max"
        );
        write_plot(&p, &rows, &what)?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

/// Runs `f` for every kind, `reps` times, interleaving the kinds so that a
/// slow period of the machine hits all three alike.
pub(crate) fn interleaved(reps: usize, mut f: impl FnMut(Kind) -> Res<f64>) -> Res<[Stat; 3]> {
    let mut v: [Vec<f64>; 3] = Default::default();
    for _ in 0..reps {
        for (i, k) in KINDS.iter().enumerate() {
            v[i].push(f(*k)?);
        }
    }
    Ok(v.map(Stat::of))
}

pub(crate) fn human(n: usize) -> String {
    if n >= 1 << 20 {
        format!("{} MiB", n >> 20)
    } else if n >= 1024 {
        format!("{} KiB", n >> 10)
    } else {
        format!("{n} B")
    }
}

/// A PNG chart of the throughput table (plotters): MB/s per write size,
/// log scale, one line per kind (blue xensock, green AF_UNIX, red TCP)
/// through the medians, with each point's min..max as a bar; `what` (how
/// it was measured) under the title. Labels need a TrueType font (the
/// usual DejaVu/Liberation paths are tried); without one the chart has no
/// text.
pub(crate) fn write_plot(
    path: &std::path::Path,
    rows: &[(usize, [Stat; 3])],
    what: &str,
) -> Res<()> {
    use plotters::prelude::*;
    let text = match register_font() {
        Ok(()) => true,
        Err(e) => {
            eprintln!("xensock: chart without labels: {e}");
            false
        }
    };
    let root = BitMapBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let all = || {
        rows.iter()
            .flat_map(|(_, r)| r.iter().flat_map(|s| [s.min, s.max]))
    };
    let ymax = all().fold(1.0f64, f64::max) * 1.5;
    let ymin = (all().fold(f64::INFINITY, f64::min) / 1.5).clamp(0.1, ymax / 2.0);
    let root = if text {
        let (top, rest) = root.split_vertically(60);
        top.draw(&Text::new(
            "stream throughput: xensock (simulated host) vs AF_UNIX vs TCP loopback",
            (20, 8),
            ("sans-serif", 22),
        ))?;
        top.draw(&Text::new(what.to_string(), (20, 38), ("sans-serif", 13)))?;
        rest
    } else {
        root
    };
    let mut builder = ChartBuilder::on(&root);
    let mut chart = builder
        .margin(15)
        .x_label_area_size(if text { 45 } else { 0 })
        .y_label_area_size(if text { 80 } else { 0 })
        .build_cartesian_2d(
            (0..rows.len().saturating_sub(1)).into_segmented(),
            (ymin..ymax).log_scale(),
        )?;
    let label = |x: &SegmentValue<usize>| match x {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            rows.get(*i).map(|(w, _)| human(*w)).unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_labels(rows.len())
            .x_label_formatter(&label)
            .x_desc("write size")
            .y_desc("MB/s (log scale)");
    } else {
        mesh.disable_x_axis().disable_y_axis();
    }
    mesh.draw()?;
    for (k, colour) in [(0usize, BLUE), (1, GREEN), (2, RED)] {
        let points = || {
            rows.iter()
                .enumerate()
                .map(move |(i, (_, r))| (SegmentValue::CenterOf(i), r[k].median))
        };
        chart.draw_series(rows.iter().enumerate().map(|(i, (_, r))| {
            ErrorBar::new_vertical(
                SegmentValue::CenterOf(i),
                r[k].min,
                r[k].median,
                r[k].max,
                colour.stroke_width(1),
                8,
            )
        }))?;
        chart
            .draw_series(LineSeries::new(points(), colour.stroke_width(2)))?
            .label(KINDS[k].name())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
        chart.draw_series(points().map(|p| Circle::new(p, 4, colour.filled())))?;
    }
    if text {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}

/// Registers a system TrueType font as plotters' "sans-serif" (its
/// `ab_glyph` backend has no font lookup of its own).
pub(crate) fn register_font() -> Res<()> {
    const CANDIDATES: [&str; 3] = [
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
        "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
        "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    ];
    let bytes = CANDIDATES
        .iter()
        .find_map(|p| std::fs::read(p).ok())
        .ok_or("no TrueType font for the chart's labels (apt-get install fonts-dejavu-core)")?;
    // plotters keeps the font for the rest of the process.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
        .map_err(|_| "the font file is not a usable TrueType font")?;
    Ok(())
}
