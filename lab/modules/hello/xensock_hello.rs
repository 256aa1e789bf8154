// SPDX-License-Identifier: GPL-2.0
//! Minimal out-of-tree Rust-for-Linux module: proves the lab kernel tree can
//! build and load an external Rust module (the shape af_xen.ko will take).
//! Build: `lab/run build-module lab/modules/hello`.

use kernel::prelude::*;

module! {
    type: XensockHello,
    name: "xensock_hello",
    author: "xensock",
    description: "xensock lab: out-of-tree Rust module smoke test",
    license: "GPL",
}

struct XensockHello {
    numbers: KVec<u32>,
}

impl kernel::Module for XensockHello {
    fn init(_module: &'static ThisModule) -> Result<Self> {
        let mut numbers = KVec::new();
        for n in [1u32, 2, 3] {
            numbers.push(n, GFP_KERNEL)?;
        }
        pr_info!("loaded, sum={}\n", numbers.iter().sum::<u32>());
        Ok(XensockHello { numbers })
    }
}

impl Drop for XensockHello {
    fn drop(&mut self) {
        pr_info!("unloaded ({} numbers)\n", self.numbers.len());
    }
}
