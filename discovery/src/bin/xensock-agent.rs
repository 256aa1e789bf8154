// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock-agent`: publishes co-residency tables for every guest (dom0).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use clap::{Parser, Subcommand};
use xensock_discovery::agent::{self, Agent, AgentConfig};
use xensock_discovery::xs::XsClient;

#[derive(Parser)]
#[command(
    name = "xensock-agent",
    version,
    about = "xensock dom0 agent: tells each guest its co-resident peers"
)]
struct Cli {
    /// Unlabelled guests see no peers (default: they form one tenant).
    #[arg(long)]
    require_label: bool,
    /// Do one pass and exit.
    #[arg(long)]
    once: bool,
    /// This host's name, noted as the destination of the peers an
    /// away-marked guest is separated from (default: the hostname).
    #[arg(long)]
    host_name: Option<String>,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Tell the (running) agent that a domain moved to HOST while it stays
    /// on this one: its peers lose it as if it had left.
    Away {
        /// domid or UUID
        domain: String,
        /// destination host label
        host: String,
    },
    /// Undo `away`: the domain is co-resident with its peers again.
    Back {
        /// domid or UUID
        domain: String,
    },
    /// Print this command's manual page (roff) to stdout.
    Manpage,
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("xensock-agent: {e}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(Cmd::Manpage) = cli.cmd {
        use clap::CommandFactory;
        clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
        return Ok(());
    }
    let xs = XsClient::open()?;
    match &cli.cmd {
        Some(Cmd::Away { domain, host }) => {
            let uuid = agent::domain_uuid(&xs, domain)?;
            agent::mark_away(&xs, &uuid, host)?;
            println!("{uuid} away at {host}");
            return Ok(());
        }
        Some(Cmd::Back { domain }) => {
            let uuid = agent::domain_uuid(&xs, domain)?;
            agent::mark_back(&xs, &uuid)?;
            println!("{uuid} back");
            return Ok(());
        }
        Some(Cmd::Manpage) | None => {}
    }
    let cfg = AgentConfig {
        require_label: cli.require_label,
        host_name: cli.host_name,
    };
    let mut agent = Agent::new(xs, cfg);
    if cli.once {
        let n = agent.sync()?;
        eprintln!("xensock-agent: wrote {n} tables");
        return Ok(());
    }
    let stop = Arc::new(AtomicBool::new(false));
    // SIGINT/SIGTERM stop the loop (checked every 100 ms).
    let s = stop.clone();
    // Blocked in this thread, so in the agent threads spawned later too.
    let mut set = nix::sys::signal::SigSet::empty();
    set.add(nix::sys::signal::Signal::SIGINT);
    set.add(nix::sys::signal::Signal::SIGTERM);
    set.thread_block()?;
    std::thread::spawn(move || {
        let _ = set.wait();
        s.store(true, std::sync::atomic::Ordering::Release);
    });
    tracing::info!("xensock-agent running");
    agent.run(&stop)?;
    Ok(())
}
