// SPDX-License-Identifier: MIT OR Apache-2.0
//! Wire-level tests of our XenStore client against the sim's xenstored.

use std::time::Duration;

use xensock_discovery::xs::{AsyncXsClient, WatchEvent, XsClient, XsError};
use xensock_sim::{DomainConfig, SimHost};
use xensock_xenif::xs_wire::{Perm, PermAccess, XsErrno};

const T: Duration = Duration::from_secs(5);

fn host_with_guest() -> (SimHost, XsClient, XsClient, u16) {
    let host = SimHost::start().unwrap();
    let g = host.create_domain(DomainConfig::new("g")).unwrap();
    let dom0 = XsClient::open_path(host.dom0().xenstored_path()).unwrap();
    let guest = XsClient::open_path(g.xenstored_path()).unwrap();
    (host, dom0, guest, g.domid)
}

/// A single-threaded runtime with timers, for the async API's tests.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap()
}

fn errno(e: XsError) -> XsErrno {
    e.errno()
        .unwrap_or_else(|| panic!("not a daemon error: {e}"))
}

#[test]
fn basic_operations() {
    let (_h, dom0, _g, _) = host_with_guest();
    dom0.write("/test/a/b", "hello").unwrap();
    assert_eq!(dom0.read("/test/a/b").unwrap(), b"hello");
    assert_eq!(dom0.read_string("/test/a").unwrap(), "");
    // Binary values, including NUL bytes, round-trip.
    dom0.write("/test/bin", [0u8, 1, 2, 0, 255]).unwrap();
    assert_eq!(dom0.read("/test/bin").unwrap(), vec![0u8, 1, 2, 0, 255]);
    dom0.mkdir("/test/dir").unwrap();
    dom0.mkdir("/test/dir").unwrap();
    let mut kids = dom0.directory("/test").unwrap();
    kids.sort();
    assert_eq!(kids, vec!["a", "bin", "dir"]);
    dom0.rm("/test/a").unwrap();
    assert_eq!(errno(dom0.read("/test/a/b").unwrap_err()), XsErrno::NoEnt);
    assert_eq!(dom0.try_read("/test/a").unwrap(), None);
    assert_eq!(
        errno(dom0.read("no/leading/slash/in/dom0").unwrap_err()),
        XsErrno::NoEnt
    );
    assert_eq!(errno(dom0.read("/bad//path").unwrap_err()), XsErrno::Inval);
    assert_eq!(dom0.get_domain_path(7).unwrap(), "/local/domain/7");
    assert!(matches!(
        dom0.read("/nul\0inside"),
        Err(XsError::InvalidArgument(_))
    ));
    assert!(matches!(
        dom0.write("/big", vec![b'x'; 5000]),
        Err(XsError::InvalidArgument(_))
    ));
}

#[test]
fn permissions_round_trip_and_errors_map_to_errno() {
    let (_h, dom0, guest, id) = host_with_guest();
    let home = format!("/local/domain/{id}");
    // Relative paths are below the guest's home.
    guest.write("data/x", "1").unwrap();
    assert_eq!(dom0.read(&format!("{home}/data/x")).unwrap(), b"1");
    assert_eq!(
        guest.get_perms("data/x").unwrap(),
        vec![Perm::new(PermAccess::None, u32::from(id))]
    );
    let p = [
        Perm::new(PermAccess::None, u32::from(id)),
        Perm::new(PermAccess::Read, 0),
    ];
    guest.set_perms("data/x", &p).unwrap();
    assert_eq!(guest.get_perms("data/x").unwrap(), p);
    // The guest may not give its node away, nor write dom0's nodes.
    let e = guest
        .set_perms("data/x", &[Perm::new(PermAccess::Both, 0)])
        .unwrap_err();
    assert_eq!(errno(e), XsErrno::Perm);
    assert_eq!(
        errno(guest.write(&format!("{home}/name"), "evil").unwrap_err()),
        XsErrno::Acces
    );
    assert_eq!(
        errno(guest.read("/local/domain/0/name").unwrap_err()),
        XsErrno::Acces
    );
    assert_eq!(
        errno(guest.directory("/local/domain").unwrap_err()),
        XsErrno::Acces
    );
    assert_eq!(guest.read_string("name").unwrap(), "g");
}

#[test]
fn watches_fire_at_once_on_change_and_stop_after_drop() {
    let (_h, dom0, _g, _) = host_with_guest();
    let mut w = dom0.watch("/w").unwrap();
    assert_eq!(w.recv_timeout(T).unwrap().unwrap().path, "/w");
    dom0.write("/w/x/y", "1").unwrap();
    assert_eq!(w.recv_timeout(T).unwrap().unwrap().path, "/w/x/y");
    let mut deep = dom0.watch("/w/x/y").unwrap();
    assert_eq!(deep.recv_timeout(T).unwrap().unwrap().path, "/w/x/y");
    dom0.write("/elsewhere", "1").unwrap();
    dom0.rm("/w/x").unwrap();
    // A watch above the removed node sees the removed node; a watch on a
    // removed descendant sees that descendant.
    let mut paths = Vec::new();
    while let Some(e) = w.recv_timeout(Duration::from_millis(200)).unwrap() {
        paths.push(e.path);
    }
    assert_eq!(paths, vec!["/w/x".to_string()]);
    assert_eq!(deep.recv_timeout(T).unwrap().unwrap().path, "/w/x/y");
    drop(w);
    // A new watch on the same path works (the old one was unregistered).
    let mut w2 = dom0.watch("/w").unwrap();
    assert_eq!(w2.recv_timeout(T).unwrap().unwrap().path, "/w");
}

#[test]
fn watch_events_arrive_while_requests_are_in_flight() {
    let (_h, dom0, guest, _) = host_with_guest();
    let mut w = guest.watch("data").unwrap();
    assert_eq!(w.recv_timeout(T).unwrap().unwrap().path, "data");
    let writer = {
        let guest = guest.clone();
        std::thread::spawn(move || {
            for i in 0..200 {
                guest
                    .write(&format!("data/k{}", i % 10), i.to_string())
                    .unwrap();
            }
        })
    };
    // Requests on the same connection from this thread meanwhile.
    for _ in 0..200 {
        assert_eq!(guest.read_string("name").unwrap(), "g");
    }
    writer.join().unwrap();
    let mut n = 0;
    while let Some(e) = w.recv_timeout(Duration::from_millis(300)).unwrap() {
        assert!(e.path.starts_with("data/k"), "{e:?}");
        n += 1;
    }
    assert_eq!(n, 200, "one event per write");
    // dom0 watches see the absolute path of the guest's relative write.
    let mut w0 = dom0.watch("/local/domain").unwrap();
    w0.recv_timeout(T).unwrap();
    guest.write("data/z", "1").unwrap();
    let e = w0.recv_timeout(T).unwrap().unwrap();
    assert!(e.path.ends_with("/data/z") && e.path.starts_with("/local/domain/"));
}

#[test]
fn transactions_commit_abort_and_retry_on_conflict() {
    let (_h, dom0, _g, _) = host_with_guest();
    dom0.write("/tx/n", "0").unwrap();
    // A conflicting write makes the first attempt fail with EAGAIN; the
    // helper retries and the second attempt commits.
    let mut attempts = 0;
    dom0.transaction(|tx| {
        attempts += 1;
        let n: u32 = tx.read_string("/tx/n")?.parse().unwrap();
        if attempts == 1 {
            dom0.write("/tx/n", "10").unwrap();
        }
        tx.write("/tx/n", (n + 1).to_string())
    })
    .unwrap();
    assert_eq!(attempts, 2);
    assert_eq!(dom0.read_string("/tx/n").unwrap(), "11");

    let tx = dom0.transaction_start().unwrap();
    tx.write("/tx/aborted", "x").unwrap();
    assert_eq!(tx.read_string("/tx/aborted").unwrap(), "x");
    assert_eq!(dom0.try_read("/tx/aborted").unwrap(), None, "isolated");
    tx.abort().unwrap();
    assert_eq!(dom0.try_read("/tx/aborted").unwrap(), None);

    // Manual commit with a conflict reports EAGAIN.
    let tx = dom0.transaction_start().unwrap();
    tx.read("/tx/n").unwrap();
    tx.write("/tx/m", "1").unwrap();
    dom0.write("/tx/n", "12").unwrap();
    assert_eq!(errno(tx.commit().unwrap_err()), XsErrno::Again);
    assert_eq!(dom0.try_read("/tx/m").unwrap(), None);

    // Dropping an open transaction aborts it.
    {
        let tx = dom0.transaction_start().unwrap();
        tx.write("/tx/dropped", "1").unwrap();
    }
    assert_eq!(dom0.try_read("/tx/dropped").unwrap(), None);
}

#[test]
fn guest_transaction_quota_is_enospc() {
    let (_h, _dom0, guest, _) = host_with_guest();
    let open: Vec<_> = (0..10)
        .map(|_| guest.transaction_start().unwrap())
        .collect();
    assert_eq!(
        errno(guest.transaction_start().unwrap_err()),
        XsErrno::NoSpc
    );
    drop(open);
}

/// An async transaction whose last clone goes without a commit or an
/// abort (its future cancelled, say) is aborted then: its writes never
/// land and it does not keep one of the guest's 10 open transactions
/// (more than 10 dropped in a row would be refused with `ENOSPC`).
#[test]
fn dropped_async_transactions_are_aborted() {
    let (_h, _dom0, guest, _) = host_with_guest();
    runtime().block_on(async move {
        let axs = guest.to_async();
        for i in 0..12 {
            let tx = axs.transaction_start().await.unwrap();
            tx.write(&format!("data/dropped{i}"), "1").await.unwrap();
            let clone = tx.clone();
            drop(tx);
            drop(clone);
        }
        // a transaction() future cancelled while its closure waits
        for _ in 0..12 {
            let cancelled = tokio::time::timeout(
                Duration::from_millis(20),
                axs.transaction(|tx| async move {
                    tx.write("data/cancelled", "1").await?;
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    Ok(())
                }),
            )
            .await;
            assert!(cancelled.is_err(), "the transaction was not cancelled");
        }
        for i in 0..12 {
            let e = axs.read(&format!("data/dropped{i}")).await.unwrap_err();
            assert!(e.is(XsErrno::NoEnt), "data/dropped{i}: {e}");
        }
        assert!(axs
            .read("data/cancelled")
            .await
            .unwrap_err()
            .is(XsErrno::NoEnt));
        // committed and aborted ones are not ended twice
        let tx = axs.transaction_start().await.unwrap();
        tx.write("data/kept", "1").await.unwrap();
        tx.commit().await.unwrap();
        axs.transaction_start()
            .await
            .unwrap()
            .abort()
            .await
            .unwrap();
        assert_eq!(axs.read_string("data/kept").await.unwrap(), "1");
    });
}

#[test]
fn connection_loss_fails_requests_and_ends_watches() {
    let host = SimHost::start().unwrap();
    let g = host.create_domain(DomainConfig::new("g")).unwrap();
    let guest = XsClient::open_path(g.xenstored_path()).unwrap();
    let mut w = guest.watch("data").unwrap();
    w.recv_timeout(T).unwrap();
    host.destroy_domain(g.domid).unwrap();
    assert!(matches!(w.recv_timeout(T), Err(XsError::Closed)));
    assert!(matches!(guest.read("name"), Err(XsError::Closed)));
}

#[test]
fn async_api_with_watch_stream() {
    let (_h, dom0, guest, id) = host_with_guest();
    runtime().block_on(async move {
        let axs = guest.to_async();
        let mut w = axs.watch("data").await.unwrap();
        let first = w.next_event().await.unwrap();
        assert_eq!(first.path, "data");
        // Many requests in flight at once, events interleaved.
        let futs: Vec<_> = (0..20)
            .map(|i| {
                let axs = axs.clone();
                async move { axs.write(&format!("data/a{i}"), "v").await }
            })
            .collect();
        for f in futs {
            f.await.unwrap();
        }
        let mut seen = 0;
        while seen < 20 {
            let ev = tokio::time::timeout(
                T,
                std::future::poll_fn(|cx| {
                    futures_core::Stream::poll_next(std::pin::Pin::new(&mut w), cx)
                }),
            )
            .await
            .unwrap()
            .unwrap();
            assert!(ev.path.starts_with("data/a"), "{ev:?}");
            seen += 1;
        }
        // Transactions with retry.
        let n = axs
            .transaction(|tx| async move {
                tx.write("data/t", "1").await?;
                tx.read_string("data/t").await
            })
            .await
            .unwrap();
        assert_eq!(n, "1");
        let e = axs.read("/local/domain/0/name").await.unwrap_err();
        assert!(e.is(XsErrno::Acces));
        assert_eq!(axs.read_string("name").await.unwrap(), "g");
    });
    assert_eq!(
        dom0.read_string(&format!("/local/domain/{id}/data/t"))
            .unwrap(),
        "1"
    );
    let _ = AsyncXsClient::open_path("/nonexistent/socket")
        .err()
        .unwrap();
}

#[test]
fn special_watches_are_for_dom0() {
    let host = SimHost::start().unwrap();
    let dom0 = XsClient::open_path(host.dom0().xenstored_path()).unwrap();
    let mut w = dom0
        .watch_paths(&["@introduceDomain", "@releaseDomain"])
        .unwrap();
    let mut initial: Vec<WatchEvent> = vec![
        w.recv_timeout(T).unwrap().unwrap(),
        w.recv_timeout(T).unwrap().unwrap(),
    ];
    initial.sort_by(|a, b| a.path.cmp(&b.path));
    assert_eq!(initial[0].path, "@introduceDomain");
    assert_eq!(initial[1].path, "@releaseDomain");
    let g = host.create_domain(DomainConfig::new("g")).unwrap();
    assert_eq!(w.recv_timeout(T).unwrap().unwrap().path, "@introduceDomain");
    // A guest may register the watch but is not told (default n0 perms).
    let guest = XsClient::open_path(g.xenstored_path()).unwrap();
    let mut gw = guest.watch("@releaseDomain").unwrap();
    assert_eq!(gw.recv_timeout(T).unwrap().unwrap().path, "@releaseDomain");
    let other = host.create_domain(DomainConfig::new("other")).unwrap();
    w.recv_timeout(T).unwrap();
    host.destroy_domain(other.domid).unwrap();
    assert_eq!(w.recv_timeout(T).unwrap().unwrap().path, "@releaseDomain");
    assert_eq!(gw.recv_timeout(Duration::from_millis(200)).unwrap(), None);
    assert_eq!(
        dom0.read_string(&format!("/local/domain/{}/name", g.domid))
            .unwrap(),
        "g"
    );
}

/// A stand-in for xenstored that answers READ after `read_delay`, WATCH at
/// once (plus the initial event), anything else with "OK", and logs what
/// it received and sent, in order.
fn fake_xenstored(
    read_delay: Duration,
) -> (
    tempdir_like::Dir,
    std::path::PathBuf,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
) {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    use std::sync::{Arc, Mutex};
    use xensock_xenif::xs_wire::{encode_message, split_strings, Header, MsgType, HEADER_LEN};
    let dir = tempdir_like::Dir::new();
    let path = dir.path().join("xenbus");
    let listener = UnixListener::bind(&path).unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let log2 = log.clone();
    std::thread::spawn(move || {
        let (mut sock, _) = listener.accept().unwrap();
        let out = Arc::new(Mutex::new(sock.try_clone().unwrap()));
        loop {
            let mut h = [0u8; HEADER_LEN];
            if sock.read_exact(&mut h).is_err() {
                return;
            }
            let h = Header::decode(&h);
            let mut body = vec![0u8; h.len as usize];
            sock.read_exact(&mut body).unwrap();
            let ty = h.msg_type().unwrap();
            log2.lock().unwrap().push(format!("recv {ty:?}"));
            let reply = |ty: MsgType, payload: &[u8]| {
                encode_message(ty, h.req_id, h.tx_id, payload).unwrap()
            };
            match ty {
                MsgType::Read => {
                    let (out, log) = (out.clone(), log2.clone());
                    let msg = reply(ty, b"value");
                    std::thread::spawn(move || {
                        std::thread::sleep(read_delay);
                        let mut o = out.lock().unwrap();
                        log.lock().unwrap().push("reply Read".into());
                        o.write_all(&msg).unwrap();
                    });
                }
                MsgType::Watch | MsgType::Unwatch => {
                    let (parts, _) = split_strings(&body);
                    let mut o = out.lock().unwrap();
                    log2.lock().unwrap().push(format!("reply {ty:?}"));
                    o.write_all(&reply(ty, b"OK\0")).unwrap();
                    if ty == MsgType::Watch {
                        let mut ev = parts[0].to_vec();
                        ev.push(0);
                        ev.extend_from_slice(parts[1]);
                        ev.push(0);
                        o.write_all(&encode_message(MsgType::WatchEvent, 0, 0, &ev).unwrap())
                            .unwrap();
                    }
                }
                _ => {
                    let mut o = out.lock().unwrap();
                    log2.lock().unwrap().push(format!("reply {ty:?}"));
                    o.write_all(&reply(ty, b"OK\0")).unwrap();
                }
            }
        }
    });
    (dir, path, log)
}

/// A xenstored that stops answering is an error once the reply bound runs
/// out, not a wait for ever; the connection is given up and nothing more
/// is written on it (on /dev/xen/xenbus a late reply with a WATCH written
/// meanwhile would stop the guest's xenbus).
#[test]
fn an_unanswered_request_gives_the_connection_up() {
    let (_dir, path, log) = fake_xenstored(Duration::from_secs(60));
    let xs = XsClient::open_path_with_device_rules(&path).unwrap();
    xs.set_reply_bound(Duration::from_millis(300));
    xs.write("/answered", "1").unwrap();
    let t0 = std::time::Instant::now();
    let e = xs.read("/never").unwrap_err();
    let waited = t0.elapsed();
    assert!(
        matches!(&e, XsError::Unanswered { op, path, after } if *op == "read" && path == "/never" && *after == Duration::from_millis(300)),
        "{e:?}"
    );
    assert!(e.to_string().contains("is xenstored alive?"), "{e}");
    // the reader looks once a second
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    let sent = || {
        log.lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("recv"))
            .count()
    };
    let sent_before = sent();
    let e = xs.write("/after", "1").unwrap_err();
    assert!(
        matches!(&e, XsError::Unanswered { path, .. } if path == "/after"),
        "{e:?}"
    );
    assert!(xs.watch("/after").is_err());
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(
        sent_before,
        sent(),
        "written after the give-up: {:?}",
        log.lock().unwrap()
    );
}

/// A private temporary directory (removed on drop).
mod tempdir_like {
    pub struct Dir(std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            use std::sync::atomic::{AtomicU32, Ordering};
            static N: AtomicU32 = AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "xs-fake-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Linux's /dev/xen/xenbus deadlocks the guest's whole XenStore if a reply
/// to another request of the same file arrives while a WATCH or UNWATCH
/// written to it waits for xenstored (see `Core::send`). On such a
/// connection the client must hold watch registration back until every
/// earlier request has its reply.
#[test]
fn watches_wait_for_a_quiet_xenbus_connection() {
    let (_dir, path, log) = fake_xenstored(Duration::from_millis(300));
    let xs = XsClient::open_path_with_device_rules(&path).unwrap();
    let reader = {
        let xs = xs.clone();
        std::thread::spawn(move || xs.read("/slow").unwrap())
    };
    // The read is in flight (its reply is 300 ms away) when we watch.
    let t0 = std::time::Instant::now();
    while !log.lock().unwrap().iter().any(|l| l == "recv Read") {
        assert!(t0.elapsed() < T, "the read never reached the daemon");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut w = xs.watch("/w").unwrap();
    assert_eq!(w.recv_timeout(T).unwrap().unwrap().path, "/w");
    assert_eq!(reader.join().unwrap(), b"value");
    drop(w);
    // Unwatch is sent from Drop; wait for it, then a read behind it.
    assert_eq!(xs.read("/slow").unwrap(), b"value");
    let log = log.lock().unwrap().clone();
    let pos = |s: &str| log.iter().position(|l| l == s).unwrap_or(usize::MAX);
    assert!(
        pos("reply Read") < pos("recv Watch"),
        "WATCH written while a READ was in flight: {log:?}"
    );
    assert!(pos("recv Unwatch") < log.len(), "no UNWATCH: {log:?}");
    // A socket connection keeps requests concurrent: the same sequence
    // writes the WATCH at once.
    let (_dir2, path2, log2) = fake_xenstored(Duration::from_millis(300));
    let xs2 = XsClient::open_path(&path2).unwrap();
    let reader = {
        let xs2 = xs2.clone();
        std::thread::spawn(move || xs2.read("/slow").unwrap())
    };
    while !log2.lock().unwrap().iter().any(|l| l == "recv Read") {
        std::thread::sleep(Duration::from_millis(5));
    }
    let _w2 = xs2.watch("/w").unwrap();
    reader.join().unwrap();
    let log2 = log2.lock().unwrap().clone();
    let pos2 = |s: &str| log2.iter().position(|l| l == s).unwrap_or(usize::MAX);
    assert!(pos2("recv Watch") < pos2("reply Read"), "{log2:?}");
}

/// Linux's /dev/xen/xenbus keeps a request's body in the open file's one
/// message buffer until the guest's xenbus thread copies it to the ring,
/// so a second request written meanwhile overwrites the first's body (and
/// Xen 4.17's xenstored may abort on what it then reads). On such a
/// connection requests from any number of threads go one at a time: each
/// is written only after the previous one's reply.
#[test]
fn requests_on_a_xenbus_connection_go_one_at_a_time() {
    let (_dir, path, log) = fake_xenstored(Duration::from_millis(30));
    let xs = XsClient::open_path_with_device_rules(&path).unwrap();
    let workers: Vec<_> = (0..8)
        .map(|i| {
            let xs = xs.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    assert_eq!(xs.read(&format!("/r{i}")).unwrap(), b"value");
                    xs.write(&format!("/w{i}"), "1").unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    let log = log.lock().unwrap().clone();
    assert_eq!(log.len(), 2 * 8 * 3 * 2, "{log:?}");
    for pair in log.chunks(2) {
        assert!(
            pair[0].starts_with("recv ") && pair[1].starts_with("reply "),
            "a request written while another waited for its reply: {log:?}"
        );
    }
    // A socket connection keeps them concurrent: 8 reads in flight at once.
    let (_dir2, path2, log2) = fake_xenstored(Duration::from_millis(300));
    let xs2 = XsClient::open_path(&path2).unwrap();
    let readers: Vec<_> = (0..8)
        .map(|i| {
            let xs2 = xs2.clone();
            std::thread::spawn(move || xs2.read(&format!("/r{i}")).unwrap())
        })
        .collect();
    for r in readers {
        r.join().unwrap();
    }
    let log2 = log2.lock().unwrap().clone();
    assert!(
        log2[..8].iter().all(|l| l == "recv Read"),
        "socket requests were serialised: {log2:?}"
    );
}

/// `watch_with` hands events to a callback and unregisters on drop.
#[test]
fn callback_watches_deliver_events_and_unregister() {
    let (_h, dom0, _g, _) = host_with_guest();
    let (s, r) = std::sync::mpsc::channel();
    let w = dom0
        .watch_with("/cb", move |ev| {
            let _ = s.send(ev.path);
        })
        .unwrap();
    assert_eq!(r.recv_timeout(T).unwrap(), "/cb");
    dom0.write("/cb/x", "1").unwrap();
    assert_eq!(r.recv_timeout(T).unwrap(), "/cb/x");
    drop(w);
    dom0.write("/cb/y", "1").unwrap();
    // A read behind the unwatch: any event for /cb/y would precede its reply.
    dom0.read("/cb/y").unwrap();
    assert!(r.recv_timeout(Duration::from_millis(200)).is_err());
}

/// On a guest's xenbus device a refused `TRANSACTION_START` leaves Linux
/// unable to suspend the guest ever again (its xenbus counts the refusal
/// twice), and the guest's one connection may hold only 10 open
/// transactions. So the client opens transactions one at a time there,
/// across threads and processes (a lock file): however many run at once,
/// none is refused.
#[test]
fn transactions_on_a_xenbus_connection_are_never_refused() {
    let dir = tempdir_like::Dir::new();
    std::env::set_var(
        xensock_discovery::xs::TX_LOCK_ENV,
        dir.path().join("tx.lock"),
    );
    let (host, _dom0, _guest, domid) = host_with_guest();
    let path = host.domain(domid).unwrap().xenstored_path().to_path_buf();
    let xs = XsClient::open_path_with_device_rules(&path).unwrap();
    xs.write("data/n", "0").unwrap();
    let workers: Vec<_> = (0..16)
        .map(|_| {
            let xs = xs.clone();
            std::thread::spawn(move || {
                xs.transaction(|tx| {
                    let n: u32 = tx.read_string("data/n")?.parse().unwrap();
                    // Long enough that, without the lock, all 16 would be
                    // open at once.
                    std::thread::sleep(Duration::from_millis(20));
                    tx.write("data/n", (n + 1).to_string())
                })
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap().unwrap();
    }
    // One at a time: no conflict either, every increment counted.
    assert_eq!(xs.read_string("data/n").unwrap(), "16");

    // A second client (as another process would) waits for the first's
    // transaction to end before its own starts.
    let other = XsClient::open_path_with_device_rules(&path).unwrap();
    let first = xs.transaction_start().unwrap();
    let (started, seen) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let tx = other.transaction_start().unwrap();
        started.send(()).unwrap();
        tx.abort().unwrap();
    });
    assert!(
        seen.recv_timeout(Duration::from_millis(200)).is_err(),
        "a second transaction started while the first was open"
    );
    first.commit().unwrap();
    seen.recv_timeout(T).unwrap();
    waiter.join().unwrap();

    // A lock file that cannot be made (its directory is missing) is
    // reported and the transaction goes ahead without it.
    std::env::set_var(
        xensock_discovery::xs::TX_LOCK_ENV,
        dir.path().join("missing").join("tx.lock"),
    );
    xs.transaction(|tx| tx.write("data/n", "17")).unwrap();
    assert_eq!(xs.read_string("data/n").unwrap(), "17");
}

static SIGPIPES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

extern "C" fn count_sigpipe(_: libc::c_int) {
    SIGPIPES.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
}

/// A request to a xenstored that stopped reading is an error for the
/// caller, not a SIGPIPE (whose default action ends a process that did not
/// ignore it).
#[test]
fn a_daemon_that_stopped_reading_gives_an_error_not_a_sigpipe() {
    // SAFETY: installs a handler that only bumps an atomic counter
    // (async-signal-safe); no other test in this binary relies on SIGPIPE
    // being ignored, and any SIGPIPE would be a defect.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = count_sigpipe as *const () as usize;
        sa.sa_flags = libc::SA_RESTART;
        assert_eq!(libc::sigaction(libc::SIGPIPE, &sa, std::ptr::null_mut()), 0);
    }
    let dir = tempdir_like::Dir::new();
    let path = dir.path().join("socket");
    let l = std::os::unix::net::UnixListener::bind(&path).unwrap();
    let xs = XsClient::open_path(&path).unwrap();
    let (daemon, _) = l.accept().unwrap();
    // It reads no more but stays connected: the next send is EPIPE.
    daemon.shutdown(std::net::Shutdown::Read).unwrap();
    assert!(xs.read("/x").is_err());
    assert_eq!(SIGPIPES.load(std::sync::atomic::Ordering::SeqCst), 0);
    drop(daemon);
}
