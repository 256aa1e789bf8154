// SPDX-License-Identifier: MIT OR Apache-2.0
//! The `xensock` command line tool.
//!
//! * `xensock demo`: a simulated host with two domains, an echo server in
//!   one, a client in the other, a checksummed stream through the rings,
//!   and the same through TCP loopback for comparison.
//! * `xensock bench`: throughput, latency, connection rate and memory per
//!   idle connection for xensock vs AF_UNIX vs TCP loopback, in one run.
//! * `xensock status`: the backend, and the links and connections of this
//!   domain as XenStore and this process see them; with the kernel module
//!   loaded, its connections from `/proc/net/af_xen` (carrier and switch
//!   counts) and its switch counters.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use libxensock::{SockAddrXen, SocketOptions, Transport, XenStream};
use xensock_proto::link::node as link_node;
use xensock_sim::{DomainConfig, SimHost};

#[derive(Parser)]
#[command(
    name = "xensock",
    version,
    about = "Sockets between co-resident Xen domains: status, migration hooks, the daemon, run, demo, bench"
)]
struct Cli {
    /// What to log on stderr: error, warn, info, debug or trace, or a
    /// tracing filter (`libxensock=debug`); `RUST_LOG` when not given.
    #[arg(long, global = true, value_name = "FILTER")]
    log_level: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Echo a checksummed stream between two (simulated) domains and compare with TCP loopback.
    Demo {
        /// MiB to stream (each way).
        #[arg(long, default_value_t = 256)]
        mib: u64,
        /// Write size in bytes.
        #[arg(long, default_value_t = 65536)]
        write_size: usize,
        /// Receive ring size in bytes.
        #[arg(long, default_value_t = 1 << 20)]
        ring: usize,
        /// No progress bar.
        #[arg(long)]
        quiet: bool,
    },
    /// Throughput, latency, connection rate and memory: xensock vs AF_UNIX vs TCP loopback.
    Bench {
        /// Scale the amount of work (1 = default; smaller is quicker).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Write a PNG chart of the throughput table to this path.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// Repetitions of every measurement; the table shows the median
        /// (and xensock's min..max).
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// Where the stream test's writer and reader run: `spread` pins
        /// them to different CPUs (as two domains on two vCPUs), `same`
        /// to one CPU, `any` lets the scheduler choose (then the figures
        /// jump between the two regimes from run to run).
        #[arg(long, value_enum, default_value_t = Placement::Spread)]
        placement: Placement,
    },
    /// Backend, links and connections of the calling domain (this
    /// process's and, through their control sockets, every other
    /// process's user-space transport: carrier and switch counts).
    Status {
        /// One JSON object instead of text (for scripts and monitoring).
        #[arg(long)]
        json: bool,
    },
    /// Migration hook, before this guest is suspended, saved or migrated:
    /// every process's user-space transport moves its connections off the
    /// rings (onto their TCP carrier). Run it from the guest's suspend path.
    Suspend,
    /// Migration hook, after resume: transports follow a new domid and
    /// bring connections back onto rings. (They also notice a new domid by
    /// themselves.)
    Resume,
    /// Connect to a xensock listener and copy stdin to it and it to stdout
    /// (as `nc`): stdin's end of file half-closes the connection; the
    /// command ends when the peer's end of stream arrives.
    Connect {
        /// `xen:DOMID:PORT`.
        addr: String,
    },
    /// Listen on a port of this domain, accept one connection and copy it
    /// to stdout and stdin to it (as `nc -l`).
    Listen {
        /// The port (`xen:self:PORT` is also accepted).
        port: String,
    },
    /// Run this guest's user-space transport for every process of the
    /// guest: programs' XenStream and XenListener then go through this
    /// daemon (each connection a Unix socket it relays), so any number of
    /// processes have their own connections. Runs until killed.
    Daemon {
        /// The socket programs reach the daemon on (default
        /// `$XENSOCK_DAEMON_SOCKET`, else /run/xensock/daemon.sock).
        #[arg(long)]
        socket: Option<PathBuf>,
    },
    /// Run an unmodified TCP program with libxensock_preload.so
    /// (`LD_PRELOAD`): `xensock run -- PROG ARGS...`. The library is
    /// `$XENSOCK_PRELOAD_LIB`, else the one next to this binary, else
    /// `../lib/libxensock_preload.so` from it.
    Run {
        /// The program and its arguments.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Print this command's shell completions (bash, zsh, fish, elvish,
    /// powershell) to stdout, for the shell's completion directory.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print this command's manual page (roff) to stdout, for
    /// `man1/xensock.1`.
    Manpage,
}

/// The preload library `xensock run` puts in front of a program.
fn preload_library() -> Result<PathBuf, Box<dyn std::error::Error>> {
    const NAME: &str = "libxensock_preload.so";
    if let Some(p) = std::env::var_os("XENSOCK_PRELOAD_LIB") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("XENSOCK_PRELOAD_LIB={}: no such file", p.display()).into())
        };
    }
    let exe = std::env::current_exe()?;
    let dir = exe.parent().ok_or("the xensock binary has no directory")?;
    // a package's place for it, given at build time (scripts/package)
    let packaged = option_env!("XENSOCK_PRELOAD_DIR").map(|d| PathBuf::from(d).join(NAME));
    let candidates: Vec<PathBuf> = [dir.join(NAME), dir.join("../lib").join(NAME)]
        .into_iter()
        .chain(packaged)
        .collect();
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            format!(
                "{NAME} not found: looked in {} (set XENSOCK_PRELOAD_LIB)",
                candidates
                    .iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
            .into()
        })
}

/// `xensock run`: the program, with the preload library first in
/// `LD_PRELOAD`; replaces this process.
fn run(command: Vec<std::ffi::OsString>) -> Result<(), Box<dyn std::error::Error>> {
    use std::os::unix::process::CommandExt;
    let lib = preload_library()?;
    let mut preload = lib.into_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(" ");
        preload.push(old);
    }
    let (prog, args) = command.split_first().ok_or("no program to run")?;
    let e = std::process::Command::new(prog)
        .args(args)
        .env("LD_PRELOAD", preload)
        .exec();
    eprintln!("xensock: {}: {e}", prog.to_string_lossy());
    // as shells say it: not found, or found and not runnable
    std::process::exit(if e.kind() == io::ErrorKind::NotFound {
        127
    } else {
        126
    });
}

/// What `bench` can know is wrong before it runs for minutes.
fn check_bench_args(scale: f64, plot: Option<&std::path::Path>) -> Res<()> {
    if !(scale.is_finite() && scale > 0.0) {
        return Err(format!("--scale must be a positive number, not {scale}").into());
    }
    if let Some(p) = plot {
        // the chart is written at the end: find out now that it can be
        std::fs::File::create(p)
            .and_then(|_| std::fs::remove_file(p))
            .map_err(|e| format!("--plot {}: {e}", p.display()))?;
    }
    Ok(())
}

/// What to try after a connect or bind failed with `e`, for the message.
fn next_step(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::ECONNREFUSED) => {
            " (nothing listens on that port of that domain: start a listener there, \
             e.g. `xensock listen PORT`)"
        }
        Some(libc::EHOSTUNREACH) | Some(libc::ENETUNREACH) => {
            " (that domain is not reachable from here: not on this host, not known to \
             dom0's xensock agent, or gone; `xensock status` shows the links)"
        }
        Some(libc::ENODEV) | Some(libc::EAFNOSUPPORT) => {
            " (no xensock backend here: `xensock status` says what is missing)"
        }
        Some(libc::ETIMEDOUT) => {
            " (the domain did not answer: is a xensock transport or af_xen.ko running \
             there?)"
        }
        Some(libc::EADDRINUSE) => " (another socket of this domain listens on that port)",
        Some(libc::EINVAL) => {
            " (not an address to connect to from here: this domain itself, port 0 or a \
             reserved domid)"
        }
        _ => "",
    }
}

/// `xensock listen`: one connection, piped.
fn listen(port: &str) -> Res<()> {
    let addr = if port.starts_with("xen:") {
        port.to_string()
    } else {
        format!("xen:self:{port}")
    };
    let l = libxensock::XenListener::bind(addr.as_str())
        .map_err(|e| format!("listen {addr}: {e}{}", next_step(&e)))?;
    eprintln!("xensock: listening on {}", l.local_addr()?);
    let (s, peer) = l.accept()?;
    eprintln!("xensock: connection from {peer}");
    drop(l);
    pipe(s)
}

/// Copies stdin to `s` (then half-closes it) and `s` to stdout. The
/// peer's end of stream ends stdout too, so what reads it (a pipe, a
/// program such as `cat` in `socat EXEC:'xensock listen 7' EXEC:cat`) sees
/// its end while stdin may still be copying. Ends once stdin is sent too,
/// unless stdin is a terminal (a person typing), which is not waited for.
fn pipe(s: XenStream) -> Res<()> {
    use std::io::IsTerminal;
    let mut w = s.try_clone()?;
    let sender = thread::spawn(move || {
        let _ = io::copy(&mut io::stdin().lock(), &mut w);
        let _ = w.shutdown(Shutdown::Write);
    });
    let mut r = s;
    let mut out = io::stdout().lock();
    io::copy(&mut r, &mut out)?;
    out.flush()?;
    drop(out);
    end_stdout();
    if !io::stdin().is_terminal() {
        let _ = sender.join();
    }
    Ok(())
}

/// Ends this process's stdout: a socket is shut down for writing (stdin
/// may be the same socket, as socat's EXEC gives it, and still be read),
/// then descriptor 1 becomes /dev/null, so a pipe or file it was is closed
/// here (nothing more is written to it).
fn end_stdout() {
    use std::os::fd::AsRawFd;
    let _ = nix::sys::socket::shutdown(libc::STDOUT_FILENO, nix::sys::socket::Shutdown::Write);
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        let _ = nix::unistd::dup2(null.as_raw_fd(), libc::STDOUT_FILENO);
    }
}

/// `xensock daemon`: the process-wide transport, served to the guest.
fn daemon(socket: Option<PathBuf>) -> Result<(), Box<dyn std::error::Error>> {
    let path = socket.unwrap_or_else(libxensock::daemon::socket_path);
    let t = libxensock::Transport::global()?;
    eprintln!(
        "xensock daemon: domain {} ({}), serving on {}",
        t.domid(),
        t.backend_kind(),
        path.display()
    );
    libxensock::daemon::serve(&t, &path)?;
    Ok(())
}

/// Logs to stderr as `--log-level`, else `RUST_LOG`, else warnings say.
fn init_logging(level: Option<&str>) -> Res<()> {
    use tracing_subscriber::EnvFilter;
    let filter = match level {
        Some(l) => EnvFilter::try_new(l).map_err(|e| format!("--log-level {l}: {e}"))?,
        None => EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn")),
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(io::stderr)
        .init();
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = init_logging(cli.log_level.as_deref()) {
        eprintln!("xensock: {e}");
        std::process::exit(2);
    }
    let r = match cli.cmd {
        Cmd::Demo { write_size: 0, .. } => Err("--write-size must be at least 1 byte".into()),
        Cmd::Demo {
            mib,
            write_size,
            ring,
            quiet,
        } => demo(mib, write_size, ring, quiet),
        Cmd::Bench {
            scale,
            plot,
            reps,
            placement,
        } => check_bench_args(scale, plot.as_deref())
            .and_then(|()| bench(scale, plot, reps.max(1), placement)),
        Cmd::Status { json } => status(json),
        Cmd::Suspend => hook("suspend"),
        Cmd::Resume => hook("resume"),
        Cmd::Daemon { socket } => daemon(socket),
        Cmd::Connect { addr } => XenStream::connect(addr.as_str())
            .map_err(|e| format!("connect {addr}: {e}{}", next_step(&e)).into())
            .and_then(pipe),
        Cmd::Listen { port } => listen(&port),
        Cmd::Run { command } => run(command),
        Cmd::Completions { shell } => {
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "xensock", &mut io::stdout());
            Ok(())
        }
        Cmd::Manpage => {
            use clap::CommandFactory;
            clap_mangen::Man::new(Cli::command())
                .render(&mut io::stdout())
                .map_err(Into::into)
        }
    };
    if let Err(e) = r {
        eprintln!("xensock: {e}");
        std::process::exit(1);
    }
}

type Res<T> = Result<T, Box<dyn std::error::Error>>;

#[path = "../../../shared/stream_check.rs"]
mod stream_check;
use stream_check::{pattern, read_stream, write_stream};

mod bench;
mod demo;
mod status;

use bench::*;
use demo::*;
use status::*;
