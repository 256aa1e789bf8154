// SPDX-License-Identifier: MIT OR Apache-2.0
//! A transport's settings ([`Config`]) and the environment variables that
//! set them.

use super::*;

/// Settings of a [`Transport`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Receive ring size (bytes, rounded up to a power of two between 2 KiB
    /// and 4 MiB) for new connections: the `SO_RCVBUF` default.
    pub recv_buffer: usize,
    /// Listener backlog default.
    pub backlog: usize,
    /// How long `connect` waits for a new link to a known peer to come up
    /// before failing with `EHOSTUNREACH` (a domain discovery does not know
    /// fails at once). 30 s by default, or `XENSOCK_LINK_TIMEOUT_MS`: a
    /// first link takes milliseconds on hardware but 5-10 s between guests
    /// emulated by QEMU TCG (the lab), where xenstored and both guests
    /// share two host CPUs.
    pub link_timeout: Duration,
    /// How long `connect` waits for the link and the answer together when
    /// no timeout is given. 60 s by default, or `XENSOCK_CONNECT_TIMEOUT_MS`.
    pub connect_timeout: Duration,
    /// How long a blocking read or write spins on the ring before sleeping.
    pub busy_poll: Duration,
    /// Keep data rings granted and mapped across connections on links whose
    /// peer advertises it too (`feature-ring-reuse`): a connect then costs
    /// no grant, map or unmap. Off, this transport behaves like a peer that
    /// does not know the feature (as the kernel module today).
    pub ring_reuse: bool,
    /// Domids this transport may link with when the dom0 agent publishes
    /// no co-residency table for this domain. `None`: the domids of the
    /// static peer list named by `XENSOCK_PEERS`, if set. With neither a
    /// table nor a list, any domid is tried (and only the link timeout
    /// tells that nobody answers).
    pub static_peers: Option<Vec<DomId>>,
    /// Migration: once a connection has left its ring, how long its TCP
    /// legs may take to come up (and, once up, how long sent data may stay
    /// unacknowledged) before it fails with `ECONNRESET`. 10 s by default,
    /// or `XENSOCK_PEER_LOST_MS`.
    pub peer_lost_after: Duration,
    /// Give connections a TCP carrier (a leg listener on this host's
    /// address, the endpoint and cookie in the handshake). Off: connections
    /// live and die with their ring, as before migration support.
    pub tcp_carrier: bool,
}

/// Environment variable overriding [`Config::peer_lost_after`] (milliseconds).
pub const ENV_PEER_LOST_MS: &str = "XENSOCK_PEER_LOST_MS";

/// Environment variable overriding [`Config::link_timeout`] (milliseconds).
pub const ENV_LINK_TIMEOUT_MS: &str = "XENSOCK_LINK_TIMEOUT_MS";
/// Environment variable overriding [`Config::connect_timeout`] (milliseconds).
pub const ENV_CONNECT_TIMEOUT_MS: &str = "XENSOCK_CONNECT_TIMEOUT_MS";

pub(super) fn parse_ms(name: &str, value: &str) -> io::Result<Duration> {
    value
        .trim()
        .parse::<u64>()
        .map(Duration::from_millis)
        .map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}={value:?}: expected a whole number of milliseconds"),
            )
        })
}

/// A duration in milliseconds from the environment: `Ok(None)` when unset.
pub(super) fn env_ms(name: &str) -> io::Result<Option<Duration>> {
    match std::env::var(name) {
        Ok(v) => parse_ms(name, &v).map(Some),
        Err(_) => Ok(None),
    }
}

/// The domids of the static peer list `XENSOCK_PEERS` names: `Ok(None)`
/// when unset, an error naming the file when it cannot be loaded.
pub(super) fn env_static_peers() -> io::Result<Option<Vec<DomId>>> {
    let Some(f) = std::env::var_os(xensock_discovery::peers::ENV_PEERS_FILE) else {
        return Ok(None);
    };
    let list = xensock_discovery::peers::StaticPeers::load(&f).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}={f:?}: {e}", xensock_discovery::peers::ENV_PEERS_FILE),
        )
    })?;
    Ok(Some(list.peers.iter().filter_map(|p| p.domid).collect()))
}

impl Default for Config {
    /// The defaults, with `XENSOCK_LINK_TIMEOUT_MS`,
    /// `XENSOCK_CONNECT_TIMEOUT_MS` and `XENSOCK_PEERS` applied. A
    /// malformed value is left out here and reported by the transport's
    /// constructors (`InvalidInput`, naming the variable).
    fn default() -> Config {
        Config {
            recv_buffer: 256 * 1024,
            backlog: 128,
            link_timeout: env_ms(ENV_LINK_TIMEOUT_MS)
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(30)),
            connect_timeout: env_ms(ENV_CONNECT_TIMEOUT_MS)
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(60)),
            busy_poll: Duration::from_micros(50),
            ring_reuse: true,
            static_peers: None,
            peer_lost_after: env_ms(ENV_PEER_LOST_MS)
                .ok()
                .flatten()
                .unwrap_or(Duration::from_secs(10)),
            tcp_carrier: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millisecond_settings_parse_or_name_the_variable() {
        assert_eq!(
            parse_ms(ENV_LINK_TIMEOUT_MS, " 1500 ").unwrap(),
            Duration::from_millis(1500)
        );
        for bad in ["", "1.5", "-3", "30s", "abc"] {
            let e = parse_ms(ENV_LINK_TIMEOUT_MS, bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad:?}");
            assert!(e.to_string().contains(ENV_LINK_TIMEOUT_MS), "{e}");
        }
    }
}
