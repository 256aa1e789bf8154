#!/usr/bin/env python3
"""Writes the seeds (fuzz/seeds/<target>/): valid frames of every kind, encoded here with an
independent encoder (struct.pack, from docs/protocol.md), plus fixed
pseudo-random inputs for the structure-driven targets. Deterministic."""
import os, random, struct

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "seeds")

def frame(kind, conn, body):
    return struct.pack("<BBHI", 1, kind, len(body), conn) + body

grant = struct.pack("<B3xIII", 16, 0, 8, 9)
compact = struct.pack("<B3xIII", 11, 1, 8, 0)
endpoint = bytes(10) + b"\xff\xff" + bytes([127, 0, 0, 1]) + struct.pack("<H2x", 5000)
frames = {
    "connect_request": frame(1, 7, struct.pack("<IIB3xQ", 1025, 80, 1, 0x1122334455667788) + grant + endpoint),
    "connect_accept": frame(2, 7, struct.pack("<IQ", 9, 0x1122334455667788) + compact + endpoint),
    "connect_reject": frame(3, 7, struct.pack("<B3x", 1)),
    "close": frame(4, 7, b""),
    "reset": frame(5, 7, struct.pack("<B3x", 2)),
    "ring_offer": frame(6, 7, grant),
    "suspend": frame(7, 0, b""),
    "resume": frame(8, 0, struct.pack("<I", 12)),
    "ring_retire": frame(9, 0, grant),
    "tcp_hello": frame(16, 7, struct.pack("<Q", 0x1122334455667788)),
    "data": frame(17, 7, struct.pack("<Q", 4096) + b"hello, ring"),
    "ring_from": frame(18, 7, struct.pack("<I4xQ", 2, 1 << 32)),
    "tx_freeze": frame(19, 7, struct.pack("<I4xQ", 1, 777)),
    "consumed": frame(20, 7, struct.pack("<I4xQ", 1, 700)),
    "fin": frame(21, 7, struct.pack("<Q", 777)),
    "two_frames": frame(4, 1, b"") + frame(4, 2, b""),
    "truncated": frame(1, 7, b"\x00" * 10)[:12],
}

def write(target, name, data):
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)

for name, data in frames.items():
    write("ctrl_decode", name, data)
rng = random.Random(20261122)
for target in ["ctrl_round_trip", "ring_hostile_peer", "layout_pages", "switch_hostile_peer"]:
    for i in range(8):
        write(target, "seed%d" % i, bytes(rng.getrandbits(8) for _ in range(rng.randrange(16, 700))))
