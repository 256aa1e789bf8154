// SPDX-License-Identifier: MIT OR Apache-2.0
//! A guest advertises its addresses and xensock version under its own
//! `data/xensock/` subtree, where only it and dom0 can read them.

use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::layout;
use crate::xs::{XsClient, XsError};

/// What a guest advertises.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advert {
    /// The guest's IP addresses.
    pub addrs: Vec<IpAddr>,
    /// Its xensock version.
    pub version: String,
}

impl Advert {
    /// An advert for these addresses and this build's protocol version.
    pub fn new(addrs: Vec<IpAddr>) -> Advert {
        Advert {
            addrs,
            version: layout::PROTOCOL_VERSION.to_string(),
        }
    }

    fn addrs_string(&self) -> String {
        self.addrs
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Writes the advert (one transaction, relative paths: the caller's own
/// home).
pub fn advertise(xs: &XsClient, advert: &Advert) -> Result<(), XsError> {
    if advert.version.is_empty() || advert.version.contains(char::is_whitespace) {
        return Err(XsError::InvalidArgument(format!(
            "bad version {:?}",
            advert.version
        )));
    }
    let addrs = advert.addrs_string();
    xs.transaction(|tx| {
        tx.write(layout::ADVERT_ADDRS, &addrs)?;
        tx.write(layout::ADVERT_VERSION, &advert.version)
    })
}

/// Removes the advert.
pub fn withdraw(xs: &XsClient) -> Result<(), XsError> {
    xs.rm(layout::ADVERT)
}

/// Keeps a guest's advert in place: writes it now, and again whenever the
/// guest's `domid` node fires (after a migration the guest has a new home
/// and must advertise there). Stops and withdraws on drop.
pub struct Advertiser {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    xs: XsClient,
}

impl Advertiser {
    /// Advertises and starts following migrations.
    pub fn start(xs: XsClient, advert: Advert) -> Result<Advertiser, XsError> {
        advertise(&xs, &advert)?;
        let mut watch = xs.watch(layout::DOMID)?;
        // The first event is the registration itself.
        let _ = watch.recv_timeout(Duration::from_secs(5))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (s, x) = (stop.clone(), xs.clone());
        let thread = std::thread::Builder::new()
            .name("xensock-advertiser".into())
            .spawn(move || {
                while !s.load(Ordering::Acquire) {
                    match watch.recv_timeout(Duration::from_millis(100)) {
                        Ok(Some(_)) => {
                            while let Ok(Some(_)) = watch.try_recv() {}
                            if let Err(e) = advertise(&x, &advert) {
                                tracing::warn!("re-advertising failed: {e}");
                            }
                        }
                        Ok(None) => {}
                        Err(_) => break,
                    }
                }
            })
            .map_err(XsError::Io)?;
        Ok(Advertiser {
            stop,
            thread: Some(thread),
            xs,
        })
    }
}

impl Drop for Advertiser {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = withdraw(&self.xs);
    }
}

/// This machine's addresses, without loopback and IPv6 link-local ones.
pub fn local_addresses() -> io::Result<Vec<IpAddr>> {
    let mut out = crate::sys::interface_addresses()?;
    out.retain(|a| match a {
        IpAddr::V4(v) => !v.is_loopback(),
        IpAddr::V6(v) => !v.is_loopback() && (v.segments()[0] & 0xffc0) != 0xfe80,
    });
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses_exclude_loopback() {
        let a = local_addresses().unwrap();
        assert!(a.iter().all(|a| !a.is_loopback()), "{a:?}");
    }

    #[test]
    fn advert_formats_addresses() {
        let a = Advert::new(vec![
            "10.0.0.1".parse().unwrap(),
            "fd00::2".parse().unwrap(),
        ]);
        assert_eq!(a.addrs_string(), "10.0.0.1 fd00::2");
        assert_eq!(a.version, layout::PROTOCOL_VERSION);
    }
}
