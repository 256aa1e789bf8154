// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock-discover`: a guest's view of co-residency, from the shell.

use std::net::IpAddr;
use std::time::Duration;

use clap::{Parser, Subcommand};
use xensock_discovery::advert::{advertise, local_addresses, withdraw, Advert, Advertiser};
use xensock_discovery::layout;
use xensock_discovery::peers::{CoResidency, Discovery};
use xensock_discovery::xs::XsClient;

#[derive(Parser)]
#[command(
    name = "xensock-discover",
    version,
    about = "xensock co-residency queries for a guest"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Advertise this guest's addresses (default: all non-loopback ones).
    Advertise {
        /// Addresses to advertise instead.
        #[arg(long = "addr")]
        addrs: Vec<IpAddr>,
        /// Keep running: advertise again whenever the advert is missing,
        /// e.g. in the new home after a save/restore or migration.
        #[arg(long)]
        keep: bool,
    },
    /// Remove this guest's advert.
    Withdraw,
    /// List co-resident peers.
    Peers,
    /// Is this address co-resident? Exit status 0 if yes, 1 if not.
    Lookup {
        /// The address.
        ip: IpAddr,
    },
    /// Print a co-resident peer's current domid (it changes when the peer
    /// moves; its address and UUID do not). Exit status 1 if not listed.
    Resolve {
        /// The peer's IP address or UUID.
        peer: String,
    },
    /// Print peer changes as they happen.
    Watch {
        /// Stop after this many seconds.
        #[arg(long)]
        seconds: Option<u64>,
    },
    /// Print this command's manual page (roff) to stdout.
    Manpage,
}

fn main() {
    match run(Cli::parse()) {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("xensock-discover: {e}");
            std::process::exit(2);
        }
    }
}

fn run(cli: Cli) -> Result<i32, Box<dyn std::error::Error + Send + Sync>> {
    match cli.cmd {
        Cmd::Manpage => {
            use clap::CommandFactory;
            clap_mangen::Man::new(Cli::command()).render(&mut std::io::stdout())?;
            return Ok(0);
        }
        Cmd::Advertise { addrs, keep } => {
            let addrs = if addrs.is_empty() {
                local_addresses()?
            } else {
                addrs
            };
            let xs = XsClient::open()?;
            let advert = Advert::new(addrs);
            if !keep {
                advertise(&xs, &advert)?;
                return Ok(0);
            }
            // The Advertiser follows the domid node; the check below also
            // covers a watch event lost across a suspend.
            let _follow = Advertiser::start(xs.clone(), advert.clone())?;
            loop {
                std::thread::sleep(Duration::from_secs(2));
                match xs.try_read(layout::ADVERT_ADDRS) {
                    Ok(Some(_)) => {}
                    Ok(None) => match advertise(&xs, &advert) {
                        Ok(()) => eprintln!("xensock-discover: advertised again"),
                        Err(e) => eprintln!("xensock-discover: advertising again failed: {e}"),
                    },
                    // suspended or reconnecting: try again next round
                    Err(e) => eprintln!("xensock-discover: reading the advert: {e}"),
                }
            }
        }
        Cmd::Withdraw => withdraw(&XsClient::open()?)?,
        Cmd::Peers => {
            let t = CoResidency::new(XsClient::open()?).table()?;
            for p in t.peers.values() {
                println!("{p}");
            }
            for (uuid, dest) in &t.moved {
                println!("moved {uuid} -> {dest}");
            }
        }
        Cmd::Lookup { ip } => match Discovery::from_env()?.lookup_ip(ip)? {
            Some(l) => {
                let d = l.domid.map(|d| d.to_string()).unwrap_or_else(|| "?".into());
                println!("{ip}: domid {d} uuid {}", l.uuid.as_deref().unwrap_or("?"));
            }
            None => {
                println!("{ip}: not co-resident");
                return Ok(1);
            }
        },
        Cmd::Resolve { peer } => match CoResidency::new(XsClient::open()?).resolve(&peer)? {
            Some(p) => println!("{}", p.domid),
            None => {
                eprintln!("xensock-discover: {peer} is not listed as co-resident");
                return Ok(1);
            }
        },
        Cmd::Watch { seconds } => {
            let mut w = CoResidency::new(XsClient::open()?).watch()?;
            let deadline = seconds.map(|s| std::time::Instant::now() + Duration::from_secs(s));
            loop {
                let left = deadline.map(|d| d.saturating_duration_since(std::time::Instant::now()));
                if left == Some(Duration::ZERO) {
                    break;
                }
                if let Some(e) = w.next_event(left)? {
                    println!("{e}");
                }
            }
        }
    }
    Ok(0)
}
