#!/usr/bin/env python3
"""Writes the index_frames fuzz target's seed corpus: streams of warm
start's `IndexFrame`s (see proto/peer.proto) a ready replica could send,
each frame prefixed with its length as a little-endian u16. The protobuf
is written here by hand from the schema, apart from kvpick's own encoder.

    python3 fuzz/seeds/index_frames.py   # from the repository root
"""
import os

from protobuf_wire import double, fixed64, message, packed64, packed_uint, stream, uint

OUT = os.path.join(os.path.dirname(__file__), "..", "corpus", "index_frames")


def worker(wid, blocks, orphans=(), tainted=False, part=0, parts=0, groups=(1,), seeds=()):
    """blocks: (engine, parent or None, seq); seeds: (index, seed)."""
    roots = bytearray((len(blocks) + 7) // 8)
    for i, (_, parent, _) in enumerate(blocks):
        if parent is None:
            roots[i // 8] |= 1 << (i % 8)
    body = (fixed64(1, wid) + uint(2, 16) + uint(3, 41) + double(4, 1764800000.25) + uint(5, 1)
            + packed_uint(6, list(groups))
            + packed64(7, [b[0] for b in blocks]) + packed64(8, [b[1] or 0 for b in blocks])
            + (message(9, bytes(roots)) if blocks else b"") + packed64(10, [b[2] for b in blocks])
            + packed_uint(11, [s[0] for s in seeds]) + packed64(12, [s[1] for s in seeds])
            + packed64(13, [o[0] for o in orphans]) + packed64(14, [o[1] for o in orphans])
            + uint(15, int(tainted)) + double(16, 12.5) + double(17, 3.25) + uint(18, part) + uint(19, parts))
    return message(1, body)


def end(workers, blocks):
    return message(2, uint(1, workers) + uint(2, blocks))


chain = [(100 + i, None if i == 0 else 99 + i, 7000 + i) for i in range(6)]
SEEDS = {
    "one_chain": stream(worker(1, chain), end(1, 6)),
    "two_workers_seeded": stream(worker(1, chain, seeds=[(3, 9)]), worker(2, chain[:2]), end(2, 8)),
    "holes_and_taint": stream(worker(1, chain[2:], orphans=[(101, 7001)], tainted=True), end(1, 4)),
    "in_parts": stream(worker(1, chain[:3], part=0, parts=2), worker(1, chain[3:], part=1, parts=2), end(1, 6)),
    "cycle": stream(worker(1, [(1, 2, 10), (2, 1, 11)]), end(1, 2)),
    "empty": stream(worker(1, []), end(1, 0)),
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"wrote {len(SEEDS)} seeds to {os.path.normpath(OUT)}")
