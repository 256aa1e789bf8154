// SPDX-License-Identifier: MIT OR Apache-2.0
//! Every workspace crate's `rust-version` is at least what its locked
//! dependencies (normal and build, as `cargo metadata` resolves them)
//! declare they need: a user with that compiler can build it.

use std::collections::HashMap;
use std::process::Command;

fn version(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

#[test]
fn rust_version_covers_the_locked_dependencies() {
    let workspace = concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--manifest-path", workspace])
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let packages: HashMap<&str, &serde_json::Value> = m["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| (p["id"].as_str().unwrap(), p))
        .collect();
    let nodes: HashMap<&str, &serde_json::Value> = m["resolve"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["id"].as_str().unwrap(), n))
        .collect();
    let mut short = Vec::new();
    for member in m["workspace_members"].as_array().unwrap() {
        let member = member.as_str().unwrap();
        let own = packages[member]["rust_version"]
            .as_str()
            .unwrap_or_else(|| panic!("{member} has no rust-version"));
        let mut seen = std::collections::HashSet::new();
        let mut stack = vec![member];
        while let Some(id) = stack.pop() {
            for dep in nodes[id]["deps"].as_array().unwrap() {
                let runtime = dep["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null() || k["kind"] == "build");
                let pkg = dep["pkg"].as_str().unwrap();
                if runtime && seen.insert(pkg) {
                    stack.push(pkg);
                    let p = packages[pkg];
                    if let Some(need) = p["rust_version"].as_str() {
                        if version(need) > version(own) {
                            short.push(format!(
                                "{} (rust-version {own}) depends on {} {}, which needs {need}",
                                packages[member]["name"], p["name"], p["version"]
                            ));
                        }
                    }
                }
            }
        }
    }
    assert!(short.is_empty(), "{}", short.join("\n"));
}
