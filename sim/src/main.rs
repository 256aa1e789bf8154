// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock-sim`: run a simulated Xen host, or act as a process of a sim
//! domain.

use std::io::BufRead;
use std::path::PathBuf;
use std::sync::mpsc;

use clap::{Parser, Subcommand};
use xensock_sim::{DomainConfig, MigrateTo, SimConfig, SimDomain, SimHost, SimXen};
use xensock_xenif::{Access, EventChannel, MappedRegion, UnmapNotify, XenBackend};

#[derive(Parser)]
#[command(version, about = "A simulated Xen host for xensock")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a host with N guest domains and keep it running until Ctrl-C.
    ///
    /// Prints each domain's XENSTORED_PATH: point Debian's xenstore-* tools
    /// at it to act as that domain. Reads commands on stdin: `list`,
    /// `stats`, `create NAME [LABEL]`, `destroy ID`, `migrate ID [HOST]`.
    Up {
        /// Number of guest domains.
        n: u16,
        /// Directory for the sockets (default: a new temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Tenant labels, one per guest, comma-separated (repeats the last).
        #[arg(long, value_delimiter = ',')]
        labels: Vec<String>,
        /// Also run `xensock-agent` (found next to this binary) in dom0.
        #[arg(long)]
        agent: bool,
        /// A command each guest runs as its init process; the domain is
        /// destroyed when it exits.
        #[arg(last = true)]
        init: Vec<String>,
    },
    /// (Inside a sim domain) bind to a peer's event channel, map its
    /// grants with an unmap notification, print `ready`, and hold them until
    /// killed. For tests and experiments with process death.
    Hold {
        /// The granting domain.
        #[arg(long)]
        peer: u16,
        /// Grant references, comma-separated.
        #[arg(long, value_delimiter = ',', required = true)]
        refs: Vec<u32>,
        /// The peer's unbound event-channel port to bind.
        #[arg(long)]
        port: u32,
        /// Byte to clear in the mapping when this process goes away.
        #[arg(long)]
        clear_byte: Option<usize>,
    },
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Up {
            n,
            dir,
            labels,
            agent,
            init,
        } => up(n, dir, labels, agent, init),
        Cmd::Hold {
            peer,
            refs,
            port,
            clear_byte,
        } => hold(peer, &refs, port, clear_byte),
    };
    if let Err(e) = result {
        eprintln!("xensock-sim: {e}");
        std::process::exit(1);
    }
}

fn hold(
    peer: u16,
    refs: &[u32],
    port: u32,
    clear_byte: Option<usize>,
) -> Result<(), Box<dyn std::error::Error>> {
    let xen = SimXen::from_env()?;
    let chan = xen.bind_interdomain(peer, port)?;
    let mut map = xen.map(peer, refs, Access::ReadWrite)?;
    map.set_unmap_notify(UnmapNotify {
        clear_byte,
        send_event: Some(chan.local_port()),
    })?;
    println!("ready");
    loop {
        std::thread::park();
    }
}

enum Event {
    Signal,
    Line(String),
}

fn print_domain(d: &SimDomain) {
    println!(
        "dom{:<4} {:<10} uuid={} label={}\n        XENSTORED_PATH={}",
        d.domid,
        d.name,
        d.uuid,
        d.label.as_deref().unwrap_or("-"),
        d.xenstored_path().display()
    );
}

fn up(
    n: u16,
    dir: Option<PathBuf>,
    labels: Vec<String>,
    agent: bool,
    init: Vec<String>,
) -> Result<(), Box<dyn std::error::Error>> {
    let sigs = xensock_sim::StopSignals::block();
    let host = SimHost::with_config(SimConfig {
        dir,
        ..SimConfig::default()
    })?;
    let mut agent_child = None;
    if agent {
        let exe = std::env::current_exe()?.with_file_name("xensock-agent");
        if !exe.exists() {
            return Err(format!(
                "{} not found (build it: cargo build -p xensock-discovery)",
                exe.display()
            )
            .into());
        }
        agent_child = Some(host.dom0().command(&exe).spawn()?);
    }
    for i in 1..=n {
        let mut cfg = DomainConfig::new(format!("guest{i}"));
        if let Some(l) = labels.get(usize::from(i - 1)).or(labels.last()) {
            cfg = cfg.label(l.clone());
        }
        if init.is_empty() {
            host.create_domain(cfg)?;
        } else {
            let mut cmd = std::process::Command::new(&init[0]);
            cmd.args(&init[1..]);
            host.spawn_domain(cfg, cmd)?;
        }
    }
    println!("xensock-sim: host running in {}", host.dir().display());
    for d in host.domains() {
        print_domain(&d);
    }
    println!(
        "Example: XENSTORED_PATH={} xenstore-ls /local/domain",
        host.dom0().xenstored_path().display()
    );
    println!("Commands on stdin: list | stats | create NAME [LABEL] | destroy ID | migrate ID [HOST] | away ID HOST | back ID; Ctrl-C stops.");

    let (tx, rx) = mpsc::channel();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        sigs.wait();
        let _ = tx2.send(Event::Signal);
    });
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(Event::Line(line)).is_err() {
                break;
            }
        }
    });
    for ev in rx {
        match ev {
            Event::Signal => break,
            Event::Line(line) => {
                if let Err(e) = command(&host, &line) {
                    println!("error: {e}");
                }
            }
        }
    }
    if let Some(mut a) = agent_child {
        let _ = a.kill();
        let _ = a.wait();
    }
    host.shutdown();
    Ok(())
}

fn command(host: &SimHost, line: &str) -> Result<(), Box<dyn std::error::Error>> {
    let words: Vec<&str> = line.split_whitespace().collect();
    match words.as_slice() {
        [] => {}
        ["list"] => host.domains().iter().for_each(print_domain),
        ["stats"] => println!("{:?}", host.stats()),
        ["create", name] => print_domain(&host.create_domain(DomainConfig::new(*name))?),
        ["create", name, label] => {
            print_domain(&host.create_domain(DomainConfig::new(*name).label(*label))?)
        }
        ["destroy", id] => host.destroy_domain(id.parse()?)?,
        ["migrate", id] => match host.migrate_domain(id.parse()?, MigrateTo::SameHost)? {
            Some(new) => println!("dom{id} is now dom{new}"),
            None => println!("dom{id} left"),
        },
        ["away", id, dest] => {
            host.mark_away(id.parse()?, dest)?;
            println!("dom{id} marked away at {dest}");
        }
        ["back", id] => {
            host.mark_back(id.parse()?)?;
            println!("dom{id} back");
        }
        ["migrate", id, dest] => {
            host.migrate_domain(id.parse()?, MigrateTo::OtherHost(dest.to_string()))?;
            println!("dom{id} moved to {dest}");
        }
        _ => return Err(format!("unknown command: {line}").into()),
    }
    Ok(())
}
