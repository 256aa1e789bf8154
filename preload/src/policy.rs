// SPDX-License-Identifier: MIT OR Apache-2.0
//! Which connections the preload may take over: the ports and addresses a
//! user includes or excludes, from the environment and a config file.
//! Pure: parsing and deciding, no I/O.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// A set of TCP ports: single ports and inclusive ranges (`80,8000-8100`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Ports(Vec<(u16, u16)>);

impl Ports {
    /// Parses `80, 443, 8000-8100`.
    pub fn parse(s: &str) -> Result<Ports, ConfigError> {
        let mut v = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || ConfigError::Port(item.to_string());
            let (a, b) = match item.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (item, item),
            };
            let a: u16 = a.parse().map_err(|_| bad())?;
            let b: u16 = b.parse().map_err(|_| bad())?;
            if a > b {
                return Err(bad());
            }
            v.push((a, b));
        }
        Ok(Ports(v))
    }

    /// Whether `port` is in the set.
    pub fn contains(&self, port: u16) -> bool {
        self.0.iter().any(|&(a, b)| (a..=b).contains(&port))
    }
}

/// A set of networks: addresses and `addr/prefix` blocks, IPv4 and IPv6.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Networks(Vec<(IpAddr, u8)>);

impl Networks {
    /// Parses `10.0.0.0/24, 10.1.2.3, fd00::/8`.
    pub fn parse(s: &str) -> Result<Networks, ConfigError> {
        let mut v = Vec::new();
        for item in s.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = || ConfigError::Address(item.to_string());
            let (addr, prefix) = match item.split_once('/') {
                Some((a, p)) => (a.trim(), Some(p.trim())),
                None => (item, None),
            };
            let addr: IpAddr = addr.parse().map_err(|_| bad())?;
            let max = if addr.is_ipv4() { 32 } else { 128 };
            let prefix = match prefix {
                Some(p) => p.parse::<u8>().ok().filter(|&p| p <= max).ok_or_else(bad)?,
                None => max,
            };
            v.push((addr, prefix));
        }
        Ok(Networks(v))
    }

    /// Whether `ip` is in one of the networks (an IPv4-mapped IPv6
    /// address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.0.iter().any(|&(net, prefix)| match (net, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                u32::from(n) & mask == u32::from(a) & mask
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                u128::from(n) & mask == u128::from(a) & mask
            }
            _ => false,
        })
    }
}

/// A setting that does not parse. The preload then takes over nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    /// Not a port or `low-high` range of ports.
    Port(String),
    /// Not an address or `address/prefix`.
    Address(String),
    /// A config file line that is not `key = value` with a known key.
    Line(usize, String),
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::Port(s) => write!(f, "{s:?} is not a port or port range"),
            ConfigError::Address(s) => write!(f, "{s:?} is not an address or address/prefix"),
            ConfigError::Line(n, s) => {
                write!(f, "line {n}: {s:?} is not `key = value` with a known key")
            }
        }
    }
}

/// The names of the settings, in the environment (`XENSOCK_PRELOAD_` +
/// upper case) and in the config file (as here).
pub const KEYS: [&str; 4] = ["ports", "exclude_ports", "addrs", "exclude_addrs"];

/// What the user allows the preload to take over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Only these ports (None: any).
    pub ports: Option<Ports>,
    /// Never these ports.
    pub exclude_ports: Ports,
    /// Only peers in these networks (None: any).
    pub addrs: Option<Networks>,
    /// Never peers in these networks.
    pub exclude_addrs: Networks,
}

impl Policy {
    /// The policy from a config file's text (`key = value` lines, `#`
    /// comments) with the environment's settings over it; `env(key)` is
    /// the value of `XENSOCK_PRELOAD_<KEY>`.
    pub fn load(
        file: Option<&str>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Policy, ConfigError> {
        let mut values: [Option<String>; 4] = Default::default();
        if let Some(text) = file {
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let (k, v) = line
                    .split_once('=')
                    .map(|(k, v)| (k.trim(), v.trim()))
                    .ok_or_else(|| ConfigError::Line(n + 1, line.to_string()))?;
                let i = KEYS
                    .iter()
                    .position(|&key| key == k)
                    .ok_or_else(|| ConfigError::Line(n + 1, line.to_string()))?;
                values[i] = Some(v.to_string());
            }
        }
        for (i, key) in KEYS.iter().enumerate() {
            if let Some(v) = env(key) {
                values[i] = Some(v);
            }
        }
        let [ports, exclude_ports, addrs, exclude_addrs] = values;
        Ok(Policy {
            ports: ports.as_deref().map(Ports::parse).transpose()?,
            exclude_ports: Ports::parse(exclude_ports.as_deref().unwrap_or(""))?,
            addrs: addrs.as_deref().map(Networks::parse).transpose()?,
            exclude_addrs: Networks::parse(exclude_addrs.as_deref().unwrap_or(""))?,
        })
    }

    /// Whether a connection to `peer` may be taken over; Err: why not.
    pub fn allows_connect(&self, peer: SocketAddr) -> Result<(), Refusal> {
        let ip = peer.ip();
        if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
            return Err(Refusal::NotAGuest);
        }
        self.allows_port(peer.port())?;
        if self.exclude_addrs.contains(ip) {
            return Err(Refusal::AddressExcluded);
        }
        if self.addrs.as_ref().is_some_and(|a| !a.contains(ip)) {
            return Err(Refusal::AddressNotIncluded);
        }
        Ok(())
    }

    /// Whether a listener bound to `local` may also serve co-resident
    /// guests (one bound to loopback never can; the unspecified address
    /// listens on every address, so it may).
    pub fn allows_listen(&self, local: SocketAddr) -> Result<(), Refusal> {
        if local.ip().to_canonical().is_loopback() {
            return Err(Refusal::NotAGuest);
        }
        self.allows_port(local.port())
    }

    fn allows_port(&self, port: u16) -> Result<(), Refusal> {
        if self.exclude_ports.contains(port) {
            return Err(Refusal::PortExcluded);
        }
        if self.ports.as_ref().is_some_and(|p| !p.contains(port)) {
            return Err(Refusal::PortNotIncluded);
        }
        Ok(())
    }
}

/// Why a connection stays on TCP, as the decision log says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Loopback, unspecified or multicast: never another guest.
    NotAGuest,
    /// The port is in `exclude_ports`.
    PortExcluded,
    /// `ports` is set and the port is not in it.
    PortNotIncluded,
    /// The peer is in `exclude_addrs`.
    AddressExcluded,
    /// `addrs` is set and the peer is not in it.
    AddressNotIncluded,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Refusal::NotAGuest => {
                "a loopback, unspecified or multicast address is never another guest"
            }
            Refusal::PortExcluded => "the port is excluded (exclude_ports)",
            Refusal::PortNotIncluded => "the port is not included (ports)",
            Refusal::AddressExcluded => "the address is excluded (exclude_addrs)",
            Refusal::AddressNotIncluded => "the address is not included (addrs)",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ports_and_ranges() {
        let p = Ports::parse(" 80, 8000-8100 ,443").unwrap();
        assert!(p.contains(80) && p.contains(8050) && p.contains(443));
        assert!(!p.contains(81) && !p.contains(8101));
        assert_eq!(
            Ports::parse("90-80"),
            Err(ConfigError::Port("90-80".into()))
        );
        assert_eq!(Ports::parse("http"), Err(ConfigError::Port("http".into())));
        assert_eq!(
            Ports::parse("70000"),
            Err(ConfigError::Port("70000".into()))
        );
        assert!(!Ports::parse("").unwrap().contains(80));
    }

    #[test]
    fn networks_match_by_prefix_in_both_families() {
        let n = Networks::parse("10.0.0.0/24, 192.168.1.7, fd00::/8").unwrap();
        assert!(n.contains("10.0.0.200".parse().unwrap()));
        assert!(!n.contains("10.0.1.1".parse().unwrap()));
        assert!(n.contains("192.168.1.7".parse().unwrap()));
        assert!(!n.contains("192.168.1.8".parse().unwrap()));
        assert!(n.contains("fd12::1".parse().unwrap()));
        assert!(
            n.contains("::ffff:10.0.0.3".parse().unwrap()),
            "IPv4-mapped"
        );
        assert!(Networks::parse("0.0.0.0/0")
            .unwrap()
            .contains("8.8.8.8".parse().unwrap()));
        assert_eq!(
            Networks::parse("10.0.0.0/33"),
            Err(ConfigError::Address("10.0.0.0/33".into()))
        );
        assert_eq!(
            Networks::parse("host"),
            Err(ConfigError::Address("host".into()))
        );
    }

    #[test]
    fn the_environment_overrides_the_file() {
        let file = "# a comment\nports = 80, 6379\nexclude_addrs = 10.0.0.9 # the backup host\n";
        let p = Policy::load(Some(file), |k| (k == "ports").then(|| "5201".to_string())).unwrap();
        assert_eq!(p.allows_connect(sa("10.0.0.5:5201")), Ok(()));
        assert_eq!(
            p.allows_connect(sa("10.0.0.5:80")),
            Err(Refusal::PortNotIncluded)
        );
        assert_eq!(
            p.allows_connect(sa("10.0.0.9:5201")),
            Err(Refusal::AddressExcluded)
        );
        assert_eq!(
            Policy::load(Some("port = 80"), |_| None),
            Err(ConfigError::Line(1, "port = 80".into()))
        );
        assert_eq!(
            Policy::load(None, |k| (k == "exclude_ports").then(|| "x".into())),
            Err(ConfigError::Port("x".into()))
        );
    }

    #[test]
    fn decisions_without_settings() {
        let p = Policy::default();
        assert_eq!(p.allows_connect(sa("10.0.0.5:6379")), Ok(()));
        assert_eq!(p.allows_connect(sa("[fd00::5]:6379")), Ok(()));
        assert_eq!(
            p.allows_connect(sa("127.0.0.1:6379")),
            Err(Refusal::NotAGuest)
        );
        assert_eq!(p.allows_connect(sa("[::1]:6379")), Err(Refusal::NotAGuest));
        assert_eq!(p.allows_listen(([0, 0, 0, 0], 6379).into()), Ok(()));
        assert_eq!(
            p.allows_listen(([127, 0, 0, 1], 6379).into()),
            Err(Refusal::NotAGuest)
        );
        let p = Policy::load(None, |k| (k == "exclude_ports").then(|| "22".into())).unwrap();
        assert_eq!(
            p.allows_listen(([10, 0, 0, 11], 22).into()),
            Err(Refusal::PortExcluded)
        );
        let p = Policy::load(None, |k| (k == "addrs").then(|| "10.0.0.0/24".into())).unwrap();
        assert_eq!(
            p.allows_connect(sa("10.0.1.5:80")),
            Err(Refusal::AddressNotIncluded)
        );
    }
}
