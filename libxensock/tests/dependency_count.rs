// SPDX-License-Identifier: MIT OR Apache-2.0
//! A program that links libxensock with its default features builds few
//! crates: the CLI's argument parsing, progress bars, chart and logging
//! are behind the `cli` feature.

use std::collections::BTreeSet;
use std::process::Command;

/// At most this many crates (libxensock included) in the library's
/// normal dependency tree with default features.
const MAX_CRATES: usize = 40;

#[test]
fn the_library_with_default_features_pulls_few_crates() {
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--locked",
            "--offline",
        ])
        .args(["--manifest-path", manifest])
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let crates: BTreeSet<&str> = text
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert!(crates.contains("libxensock"), "{text}");
    for cli_only in ["clap", "indicatif", "plotters", "tracing-subscriber"] {
        assert!(
            !crates.contains(cli_only),
            "{cli_only} without the cli feature"
        );
    }
    assert!(
        crates.len() <= MAX_CRATES,
        "{} crates: {crates:?}",
        crates.len()
    );
}
