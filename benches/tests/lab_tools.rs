// SPDX-License-Identifier: MIT OR Apache-2.0
//! The lab's ratio tools (`lab/tools/pooled-ratios`, `lab/tools/bench-ratios`)
//! on made-up runs: the TCP carrier figures in the docs come from
//! them, so their arithmetic and their refusals are checked here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tool(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../lab/tools")
        .join(name)
}

/// A run directory whose metrics.tsv holds `rows`' stream rates, round by
/// round, in the order the bench prints them.
fn run_dir(root: &Path, name: &str, rows: &[(&str, &[f64])]) -> PathBuf {
    let dir = root.join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let rounds = rows.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let mut tsv = String::new();
    for i in 0..rounds {
        for (row, values) in rows {
            if let Some(v) = values.get(i) {
                tsv += &format!("domu2\t{row}.stream_mib_s\t{v}\tMiB/s\n");
            }
        }
    }
    std::fs::write(dir.join("metrics.tsv"), tsv).unwrap();
    dir
}

fn run(name: &str, args: &[&Path]) -> Output {
    Command::new("bash")
        .arg(tool(name))
        .args(args)
        .output()
        .unwrap()
}

/// Geometric mean and its 95% interval (mean of the logs +- 1.96
/// standard errors), as the tools print them.
fn geo(ratios: &[f64]) -> (String, String, String) {
    let n = ratios.len() as f64;
    let logs: Vec<f64> = ratios.iter().map(|r| r.ln()).collect();
    let mean = logs.iter().sum::<f64>() / n;
    let var = logs.iter().map(|l| (l - mean).powi(2)).sum::<f64>() / (n - 1.0);
    let se = (var / n).sqrt();
    (
        format!("{:.2}x", mean.exp()),
        format!("{:.2}", (mean - 1.96 * se).exp()),
        format!("{:.2}x", (mean + 1.96 * se).exp()),
    )
}

#[test]
fn pooled_ratios_pools_the_paired_rounds_of_every_run() {
    let root = tempfile::tempdir().unwrap();
    let a = run_dir(
        root.path(),
        "bench-a",
        &[
            ("afxen-tcp-carrier", &[45.0, 50.0, 40.0]),
            ("tcp-same-phase", &[50.0, 50.0, 50.0]),
        ],
    );
    let b = run_dir(
        root.path(),
        "bench-b",
        &[
            ("afxen-tcp-carrier", &[90.0, 85.0, 95.0]),
            ("tcp-same-phase", &[100.0, 100.0, 100.0]),
        ],
    );
    let out = run(
        "pooled-ratios",
        &[
            Path::new("afxen-tcp-carrier"),
            Path::new("tcp-same-phase"),
            &a,
            &b,
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let pooled = text.lines().find(|l| l.starts_with("pooled")).expect(&text);
    let (mean, low, high) = geo(&[0.9, 1.0, 0.8, 0.9, 0.85, 0.95]);
    assert!(pooled.contains(" 6 "), "{pooled}");
    assert!(pooled.contains(&mean), "{pooled}: want {mean}");
    assert!(
        pooled.contains(&format!("{low}-{high}")),
        "{pooled}: want {low}-{high}"
    );
    // the median of 0.8 0.85 0.9 0.9 0.95 1.0
    assert!(pooled.trim_end().ends_with("0.90x"), "{pooled}");
    let (a_mean, _, _) = geo(&[0.9, 1.0, 0.8]);
    let line_a = text
        .lines()
        .find(|l| l.starts_with("bench-a"))
        .expect(&text);
    assert!(line_a.contains(&a_mean), "{line_a}");
}

#[test]
fn pooled_ratios_leaves_out_a_run_whose_rows_do_not_pair() {
    let root = tempfile::tempdir().unwrap();
    let good = run_dir(
        root.path(),
        "bench-good",
        &[
            ("afxen-tcp-carrier", &[45.0, 50.0, 40.0]),
            ("tcp-same-phase", &[50.0, 50.0, 50.0]),
        ],
    );
    let odd = run_dir(
        root.path(),
        "bench-odd",
        &[
            ("afxen-tcp-carrier", &[10.0, 10.0, 10.0]),
            ("tcp-same-phase", &[50.0, 50.0]),
        ],
    );
    let out = run(
        "pooled-ratios",
        &[
            Path::new("afxen-tcp-carrier"),
            Path::new("tcp-same-phase"),
            &good,
            &odd,
        ],
    );
    assert!(out.status.success());
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("bench-odd left out"), "{stderr}");
    let text = String::from_utf8(out.stdout).unwrap();
    let pooled = text.lines().find(|l| l.starts_with("pooled")).expect(&text);
    assert!(pooled.contains(" 3 "), "only bench-good's rounds: {pooled}");
    assert!(!text.contains("bench-odd"), "{text}");
}

#[test]
fn pooled_ratios_refuses_bad_arguments() {
    let root = tempfile::tempdir().unwrap();
    let usage = run("pooled-ratios", &[Path::new("afxen-tcp-carrier")]);
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("usage"));
    let empty = root.path().join("bench-empty");
    std::fs::create_dir_all(&empty).unwrap();
    let missing = run("pooled-ratios", &[Path::new("a"), Path::new("b"), &empty]);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no metrics"));
    // rows no run has
    let other = run_dir(root.path(), "bench-other", &[("tcp", &[50.0, 50.0, 50.0])]);
    let none = run(
        "pooled-ratios",
        &[
            Path::new("afxen-tcp-carrier"),
            Path::new("tcp-same-phase"),
            &other,
        ],
    );
    assert_eq!(none.status.code(), Some(1));
}

#[test]
fn bench_ratios_judges_the_carrier_by_the_median_and_prints_the_interval() {
    let root = tempfile::tempdir().unwrap();
    let carrier = [45.0, 50.0, 40.0, 48.0];
    let tcp = [50.0, 50.0, 50.0, 50.0];
    let dir = run_dir(
        root.path(),
        "bench-c",
        &[("tcp-same-phase", &tcp), ("afxen-tcp-carrier", &carrier)],
    );
    let out = run("bench-ratios", &[&dir]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    // medians 46.5 / 50 = 0.93x: "met"
    let target = text
        .lines()
        .find(|l| l.contains("stream within 10% of TCP (tcp-same-phase)"))
        .expect(&text);
    assert!(
        target.contains("0.93x") && target.contains("met") && !target.contains("NOT"),
        "{target}"
    );
    let ratios: Vec<f64> = carrier.iter().zip(tcp).map(|(c, t)| c / t).collect();
    let (mean, low, high) = geo(&ratios);
    let interval = text
        .lines()
        .find(|l| l.contains("geometric mean of the same"))
        .expect(&text);
    assert!(
        interval.contains(&mean) && interval.contains(&format!("{low}-{high}")),
        "{interval}: want {mean} ({low}-{high})"
    );
}
