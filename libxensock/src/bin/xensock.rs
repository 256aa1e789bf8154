//! The `xensock` command line tool (demo, bench, status).
fn main() {}
