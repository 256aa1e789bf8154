// SPDX-License-Identifier: MIT OR Apache-2.0
//! `xensock status` and the migration hooks: the backend, XenStore's
//! links, the kernel module's `/proc/net/af_xen`, every transport's own.

use super::*;

/// One connection of the kernel module, as `/proc/net/af_xen` lists it.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct KernelConn<'a> {
    state: &'a str,
    local: &'a str,
    peer: &'a str,
    carrier: &'a str,
    to_tcp: u64,
    to_ring: u64,
    /// A TCP program's connection (the preload library): the AF_INET or
    /// AF_INET6 peer it asked for; its dual listener: the address it
    /// listens on.
    inet: Option<&'a str>,
}

/// Parses `/proc/net/af_xen` (header, then one line per socket; the
/// carrier and switch columns are named in the header, so an older module
/// without them still parses, with `-` and 0).
pub(crate) fn parse_proc_af_xen(text: &str) -> Vec<KernelConn<'_>> {
    let mut lines = text.lines();
    let Some(header) = lines.next() else {
        return Vec::new();
    };
    let cols: Vec<&str> = header.split_whitespace().collect();
    let at = |name: &str| cols.iter().position(|c| *c == name);
    let (carrier, to_tcp, to_ring, inet) = (at("carrier"), at("to_tcp"), at("to_ring"), at("inet"));
    lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 3 {
                return None;
            }
            let num = |i: Option<usize>| {
                i.and_then(|i| f.get(i))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            };
            Some(KernelConn {
                state: f[0],
                local: f[1],
                peer: f[2],
                carrier: carrier.and_then(|i| f.get(i)).copied().unwrap_or("-"),
                to_tcp: num(to_tcp),
                to_ring: num(to_ring),
                inet: inet.and_then(|i| f.get(i)).copied().filter(|v| *v != "-"),
            })
        })
        .collect()
}

/// The kernel module's view, when it is loaded.
/// What `/proc/net/af_xen` and `/proc/net/af_xen_stats` say, if the
/// module is loaded: its connections and its switch counters.
pub(crate) struct KernelStatus {
    proc_text: String,
    switch: Vec<(String, i64)>,
}

pub(crate) fn kernel_status() -> Option<KernelStatus> {
    let proc_text = std::fs::read_to_string("/proc/net/af_xen").ok()?;
    let switch = std::fs::read_to_string("/proc/net/af_xen_stats")
        .map(|stats| {
            stats
                .lines()
                .filter(|l| l.starts_with("switch_"))
                .filter_map(|l| {
                    let (k, v) = l.split_once(' ')?;
                    Some((k.to_string(), v.trim().parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default();
    Some(KernelStatus { proc_text, switch })
}

pub(crate) fn print_kernel_status(k: &KernelStatus) {
    let conns = parse_proc_af_xen(&k.proc_text);
    println!("kernel module (af_xen): {} sockets", conns.len());
    for c in conns.iter() {
        match (c.state, c.inet) {
            ("ESTABLISHED", inet) => println!(
                "  {} -> {}{}: carrier {}, switched to TCP {} times, back to a ring {} times",
                c.local,
                c.peer,
                inet.map(|a| format!(" (a TCP program's connection to {a})"))
                    .unwrap_or_default(),
                c.carrier,
                c.to_tcp,
                c.to_ring
            ),
            ("LISTEN", Some(a)) => println!(
                "  {}: a TCP program's listener on {a}, taking co-resident clients over AF_XEN",
                c.local
            ),
            _ => {}
        }
    }
    if !k.switch.is_empty() {
        let line: Vec<String> = k.switch.iter().map(|(n, v)| format!("{n} {v}")).collect();
        println!("  {}", line.join(", "));
    }
}

/// One link of this domain as XenStore shows it (written by whichever
/// process of this domain runs the transport).
pub(crate) struct LinkNode {
    peer: String,
    state: String,
    ring_ref: String,
    event_channel: String,
    generation: String,
}

/// The XenStore the user-space transport would use: the simulated
/// domain's when the backend is the simulated host, else the guest's.
fn open_xenstore(user_space: libxensock::BackendKind) -> Option<xensock_discovery::xs::XsClient> {
    use xensock_discovery::xs::XsClient;
    if user_space != libxensock::BackendKind::Sim {
        return XsClient::open().ok();
    }
    let dir = std::env::var_os(xensock_sim::ENV_SIM_DIR)?;
    let domid = std::env::var(xensock_sim::ENV_SIM_DOMID)
        .ok()?
        .parse()
        .ok()?;
    let path = xensock_sim::domain_dir(std::path::Path::new(&dir), domid).join("xenstored.sock");
    XsClient::open_path(path).ok()
}

/// This domain's id and its links' XenStore nodes, if XenStore answers.
pub(crate) fn xenstore_status(
    user_space: libxensock::BackendKind,
) -> Option<(String, String, Vec<LinkNode>)> {
    let xs = open_xenstore(user_space)?;
    let me = xs
        .read_string(xensock_proto::store::DOMID)
        .ok()?
        .trim()
        .to_string();
    let dir = xensock_proto::store::InHome {
        domid: me.parse().ok()?,
        rel: xensock_proto::store::LINK_DIR,
    }
    .to_string();
    let peers = xs.directory(&dir).unwrap_or_default();
    let links = peers
        .into_iter()
        .map(|p| {
            let get = |n: &str| {
                xs.read_string(&format!("{dir}/{p}/{n}"))
                    .unwrap_or_else(|_| "-".into())
            };
            LinkNode {
                state: get(link_node::STATE),
                ring_ref: get(link_node::RING_REF),
                event_channel: get(link_node::EVENT_CHANNEL),
                generation: get(link_node::GENERATION),
                peer: p,
            }
        })
        .collect();
    Some((me, dir, links))
}

pub(crate) fn hook(cmd: &str) -> Res<()> {
    let answers = libxensock::hooks::broadcast(cmd);
    if answers.is_empty() {
        println!("no user-space transport runs here");
    }
    for (pid, answer) in answers {
        print!("process {pid}: {answer}");
    }
    Ok(())
}

pub(crate) fn status(json: bool) -> Res<()> {
    let backend = libxensock::backend();
    let kernel = kernel_status();
    // No transport of our own: starting one would take this domain's link
    // nodes from the process that runs the transport.
    let domain = xenstore_status(backend.user_space);
    let answers = libxensock::hooks::broadcast(if json { "status-fields" } else { "status" });
    let none = backend.kind == libxensock::BackendKind::None;
    if json {
        println!(
            "{}",
            status_json(&backend, kernel.as_ref(), domain.as_ref(), &answers)
        );
        return if none { Err(NO_BACKEND.into()) } else { Ok(()) };
    }
    print!("{backend}");
    if let Some(k) = &kernel {
        print_kernel_status(k);
    }
    if let Some((me, dir, links)) = &domain {
        println!("domain {me}");
        if links.is_empty() {
            println!("no links in XenStore");
        } else {
            println!("links in XenStore ({dir}):");
            for l in links {
                println!(
                    "  peer {}: state={} ring-ref={} event-channel={} generation={}",
                    l.peer, l.state, l.ring_ref, l.event_channel, l.generation
                );
            }
        }
    }
    if answers.is_empty() {
        println!("no user-space transport runs here");
    }
    for (pid, answer) in answers {
        print!("process {pid}: {answer}");
    }
    if none {
        return Err(NO_BACKEND.into());
    }
    Ok(())
}

/// Why `status` fails when nothing here can carry a connection.
const NO_BACKEND: &str = "no backend here: load af_xen.ko (a kernel with Rust support), \
     or run in a Xen guest with /dev/xen (the user-space transport), or set XENSOCK_SIM";

/// `xensock status --json`: the same facts as the text, as one object.
pub(crate) fn status_json(
    backend: &libxensock::BackendReport,
    kernel: Option<&KernelStatus>,
    domain: Option<&(String, String, Vec<LinkNode>)>,
    answers: &[(u32, String)],
) -> serde_json::Value {
    use serde_json::json;
    let kernel = kernel.map(|k| {
        let conns: Vec<_> = parse_proc_af_xen(&k.proc_text)
            .iter()
            .map(|c| {
                json!({
                    "state": c.state, "local": c.local, "peer": c.peer,
                    "carrier": c.carrier, "to_tcp": c.to_tcp, "to_ring": c.to_ring,
                    "inet": c.inet,
                })
            })
            .collect();
        let switch: serde_json::Map<_, _> = k
            .switch
            .iter()
            .map(|(n, v)| (n.clone(), json!(v)))
            .collect();
        json!({ "sockets": conns, "switch": switch })
    });
    let (domid, links) = match domain {
        Some((me, _, links)) => (
            me.parse::<u32>().ok(),
            links
                .iter()
                .map(|l| {
                    json!({
                        "peer": l.peer, "state": l.state, "ring_ref": l.ring_ref,
                        "event_channel": l.event_channel, "generation": l.generation,
                    })
                })
                .collect(),
        ),
        None => (None, Vec::new()),
    };
    json!({
        "backend": {
            "kind": backend.kind.token(),
            "description": backend.kind.to_string(),
            "family": backend.family,
            "user_space": backend.user_space.token(),
            "reasons": backend.reasons,
        },
        "kernel": kernel,
        "domid": domid,
        "links": links,
        "processes": answers
            .iter()
            .map(|(pid, text)| process_json(*pid, text))
            .collect::<Vec<_>>(),
    })
}

/// One process's transport, from its `status-fields` answer (its records:
/// `transport` and `legs` objects, `link` and `connection` lists); a
/// process whose transport does not know the command gives its answer's
/// lines as `text`.
fn process_json(pid: u32, text: &str) -> serde_json::Value {
    use serde_json::{json, Map, Value};
    let mut out = Map::new();
    out.insert("pid".into(), json!(pid));
    let (mut links, mut conns, mut other) = (Vec::new(), Vec::new(), Vec::new());
    for line in text.lines() {
        let mut words = line.split(' ');
        let record = words.next().unwrap_or_default();
        let fields: Option<Map<String, Value>> = words
            .map(|w| {
                let (k, v) = w.split_once('=')?;
                let v = libxensock::decode_field(v);
                let v = match (v.parse::<u64>(), v.as_str()) {
                    (Ok(n), _) => json!(n),
                    (_, "true") => json!(true),
                    (_, "false") => json!(false),
                    _ => json!(v),
                };
                Some((k.to_string(), v))
            })
            .collect();
        match (record, fields) {
            ("transport" | "legs", Some(f)) => {
                out.insert(record.into(), Value::Object(f));
            }
            ("link", Some(f)) => links.push(Value::Object(f)),
            ("connection", Some(f)) => conns.push(Value::Object(f)),
            _ => other.push(json!(line)),
        }
    }
    out.insert("links".into(), json!(links));
    out.insert("connections".into(), json!(conns));
    if !other.is_empty() {
        out.insert("text".into(), json!(other));
    }
    Value::Object(out)
}

#[cfg(test)]
mod proc_tests {
    use super::*;

    #[test]
    fn a_processs_status_fields_become_one_object() {
        let text = "transport domid=3 backend=sim links=1 connections=1 listeners=0 resets_sent=0 resets_received=0 ring_errors=0 links_lost=0 refused=0\n\
                    link peer=2 up=true connections=1 pending_frames=0 ring_reuse=false pooled_rings=0 lent_rings=0 kept_mappings=0\n\
                    connection id=7 local=xen:3:49152 peer=xen:2:7 phase=Open rx_fill=0 rx_size=65536 tx_fill=0 tx_size=65536 bytes_in=5 bytes_out=6 carrier=switched tx=tcp rx=ring tx_to_tcp=1 tx_to_ring=0 rx_to_ring=0 legs_up=true failure=peer%20gone%25\n";
        let v = process_json(42, text);
        assert_eq!(v["pid"], 42);
        assert_eq!(v["transport"]["domid"], 3);
        assert_eq!(v["transport"]["backend"], "sim");
        assert_eq!(v["links"][0]["up"], true);
        assert_eq!(v["connections"][0]["peer"], "xen:2:7");
        assert_eq!(v["connections"][0]["carrier"], "switched");
        assert_eq!(v["connections"][0]["failure"], "peer gone%");
        assert!(v.get("text").is_none());
        let old = process_json(1, "unknown command \"status-fields\"\n");
        assert_eq!(old["text"][0], "unknown command \"status-fields\"");
    }

    #[test]
    fn proc_af_xen_columns_are_found_by_name() {
        let text = "state       local            peer             rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier    to_tcp to_ring\n\
                    ESTABLISHED     2:7301           1:49155       131072       0  131072       0      100       200 tcp             2       1\n\
                    LISTEN          2:7301           -:-                0       0       0       0        0         0 -               0       0\n";
        let c = parse_proc_af_xen(text);
        assert_eq!(c.len(), 2);
        assert_eq!(
            c[0],
            KernelConn {
                state: "ESTABLISHED",
                local: "2:7301",
                peer: "1:49155",
                carrier: "tcp",
                to_tcp: 2,
                to_ring: 1,
                inet: None
            }
        );
        assert_eq!(c[1].state, "LISTEN");
        assert_eq!(c[1].to_tcp, 0);
    }

    #[test]
    fn proc_af_xen_inet_column_names_a_tcp_programs_connection() {
        let text = "state       local            peer             rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier    to_tcp to_ring inet\n\
                    ESTABLISHED     2:49160          1:6379        131072       0  131072       0      100       200 ring-xen        0       0 10.0.0.11:6379\n\
                    ESTABLISHED     2:7301           1:49155       131072       0  131072       0      100       200 tcp             2       1 -\n\
                    LISTEN          2:6379           -:-                0       0       0       0        0         0 -               0       0 0.0.0.0:6379\n";
        let c = parse_proc_af_xen(text);
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].inet, Some("10.0.0.11:6379"));
        assert_eq!(c[1].inet, None, "an AF_XEN program's connection");
        assert_eq!((c[2].state, c[2].inet), ("LISTEN", Some("0.0.0.0:6379")));
    }

    #[test]
    fn proc_af_xen_without_switch_columns_still_parses() {
        let text = "state local peer rx_size rx_fill tx_size tx_fill bytes_in bytes_out carrier\nESTABLISHED 2:1 1:2 1 0 1 0 0 0 ring-xen\n";
        let c = parse_proc_af_xen(text);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].carrier, "ring-xen");
        assert_eq!((c[0].to_tcp, c[0].to_ring), (0, 0));
    }
}
