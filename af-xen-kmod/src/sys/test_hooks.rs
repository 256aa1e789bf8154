// SPDX-License-Identifier: GPL-2.0
//! The test hooks' switches (`glue/af_xen_test_hooks.c`), in the lab's
//! build only (cfg `afx_test_hooks`: `make LAB=1` or `TEST_HOOKS=1`). A
//! user's module has no such parameters: here every switch is off, a
//! constant, so the code behind it is compiled out; the socket options that
//! reach a hook are absent from it too (`socket/options.rs`).

pub(crate) use imp::*;

#[cfg(afx_test_hooks)]
mod imp {
    use kernel::ffi::c_int;

    extern "C" {
        fn afx_take_inject_bad_record() -> c_int;
        fn afx_take_inject_bad_dir() -> c_int;
        fn afx_take_inject_ring_offers() -> c_int;
        fn afx_hostile_test() -> c_int;
    }

    /// Whether the lab's hostile-peer test mode (module parameter) is on.
    pub(crate) fn hostile_test() -> bool {
        // SAFETY: reads a bool module parameter.
        unsafe { afx_hostile_test() != 0 }
    }

    /// Test hook (module parameter `inject_bad_record`): whether to corrupt the
    /// next SEQPACKET record header sent; clears the request.
    pub(crate) fn take_inject_bad_record() -> bool {
        // SAFETY: atomic exchange on a module parameter.
        unsafe { afx_take_inject_bad_record() != 0 }
    }

    /// Test hook (module parameter `inject_bad_dir`): whether the next large
    /// ring's grant directory should name an invalid grant; clears the request.
    pub(crate) fn take_inject_bad_dir() -> bool {
        // SAFETY: atomic exchange on a module parameter.
        unsafe { afx_take_inject_bad_dir() != 0 }
    }

    /// Test hook (module parameter `inject_ring_offers`): how many forged ring
    /// offers to send over each link (0: none); clears the request.
    pub(crate) fn take_inject_ring_offers() -> u32 {
        // SAFETY: atomic exchange on a module parameter.
        let n = unsafe { afx_take_inject_ring_offers() };
        u32::try_from(n).unwrap_or(0)
    }
}

#[cfg(not(afx_test_hooks))]
mod imp {
    pub(crate) fn take_inject_bad_record() -> bool {
        false
    }

    pub(crate) fn take_inject_bad_dir() -> bool {
        false
    }
}
