// SPDX-License-Identifier: MIT OR Apache-2.0
//! The fuzz bodies of `xensock_proto::fuzzing` under `cargo test`: every
//! seed and corpus file (`fuzz/seeds/<target>/`, `fuzz/corpus/<target>/`), then a few
//! thousand deterministic pseudo-random inputs per target. `cargo fuzz run
//! <target>` (see `fuzz/`) explores further with coverage guidance.

use std::path::PathBuf;

use arbitrary::Unstructured;
use xensock_proto::fuzzing;

type Body = fn(&[u8]);

fn targets() -> Vec<(&'static str, Body)> {
    fn unstructured(f: fn(&mut Unstructured<'_>) -> arbitrary::Result<()>) -> impl Fn(&[u8]) {
        move |data| {
            let _ = f(&mut Unstructured::new(data));
        }
    }
    // Plain fn pointers keep the table simple.
    fn message(d: &[u8]) {
        unstructured(fuzzing::message_round_trip)(d)
    }
    fn ring(d: &[u8]) {
        unstructured(fuzzing::ring_with_hostile_peer)(d)
    }
    fn header(d: &[u8]) {
        unstructured(fuzzing::header_and_directory)(d)
    }
    fn switch(d: &[u8]) {
        unstructured(fuzzing::switch_with_hostile_peer)(d)
    }
    fn records(d: &[u8]) {
        unstructured(fuzzing::records_from_hostile_peer)(d)
    }
    vec![
        ("ctrl_decode", fuzzing::decode_frame as Body),
        ("ctrl_round_trip", message),
        ("ring_hostile_peer", ring),
        ("layout_pages", header),
        ("switch_hostile_peer", switch),
        ("record_hostile_peer", records),
    ]
}

#[test]
fn corpus_replays_cleanly() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus");
    let mut replayed = 0;
    for (name, body) in targets() {
        let dir = root.join(name);
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("corpus {}: {e}", dir.display()));
        for entry in entries {
            let path = entry.unwrap().path();
            body(&std::fs::read(&path).unwrap());
            replayed += 1;
        }
    }
    assert!(
        replayed >= 5,
        "the corpus is checked in; found only {replayed} inputs"
    );
}

/// xorshift: deterministic, so a failure reproduces.
fn inputs(seed: u64, count: usize) -> impl Iterator<Item = Vec<u8>> {
    let mut state = seed | 1;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    (0..count).map(move |_| {
        let len = (next() % 600) as usize;
        (0..len).map(|_| next() as u8).collect()
    })
}

#[test]
fn random_inputs_never_break_an_invariant() {
    for (k, (_, body)) in targets().into_iter().enumerate() {
        for input in inputs(0x5eed + k as u64, 3000) {
            body(&input);
        }
    }
}

/// Frames that are valid except for one mutated byte: strict decoding must
/// refuse or re-encode them exactly (checked by the body).
#[test]
fn mutated_valid_frames_decode_canonically_or_not_at_all() {
    use xensock_proto::ctrl::{Message, RingGrant, SockType, TcpEndpoint};
    let frames = [
        Message::ConnectRequest {
            conn_id: 3,
            src_port: 1,
            dst_port: 2,
            sock_type: SockType::SeqPacket,
            cookie: 99,
            rx: RingGrant {
                order: 12,
                epoch: 0,
                header_ref: 8,
                dir_ref: 9,
            },
            tcp: TcpEndpoint::NONE,
        },
        Message::Consumed {
            conn_id: 1,
            epoch: 4,
            offset: 1 << 33,
        },
        Message::Data {
            conn_id: 1,
            offset: 5,
            payload: b"payload",
        },
    ];
    for msg in frames {
        let mut buf = vec![0u8; msg.encoded_len()];
        msg.encode(&mut buf).unwrap();
        for i in 0..buf.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut m = buf.clone();
                m[i] ^= flip;
                fuzzing::decode_frame(&m);
            }
        }
    }
}

/// The seed frames are encoded by an independent encoder
/// (`fuzz/seed-corpus.py`, written from docs/protocol.md): each must decode,
/// so the documented layout and the codec agree.
#[test]
fn independently_encoded_frames_of_every_kind_decode() {
    use xensock_proto::ctrl::{decode, Channel};
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/seeds/ctrl_decode");
    let mut kinds = std::collections::BTreeSet::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap() == "truncated" {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        let decoded = decode(&bytes, Channel::Link).or_else(|_| decode(&bytes, Channel::Tcp));
        let (msg, _) = decoded.unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        kinds.insert(msg.kind() as u8);
    }
    assert_eq!(kinds.len(), 15, "one seed per frame kind");
}
