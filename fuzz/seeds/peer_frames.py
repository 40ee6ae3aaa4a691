#!/usr/bin/env python3
"""Writes the peer_frames fuzz target's seed corpus: streams of
`kvpick.peer.v1` frames (see proto/peer.proto) one origin could send, each
frame prefixed with its length as a little-endian u16. The protobuf is
written here by hand from the schema, apart from kvpick's own encoder.

    python3 fuzz/seeds/peer_frames.py   # from the repository root
"""
import os
import struct

from protobuf_wire import fixed64, message, stream, uint

OUT = os.path.join(os.path.dirname(__file__), "..", "corpus", "peer_frames")


def booking(id, worker, hashes, unhashed=0, prefill=64, lease=300_000, done=False):
    packed = b"".join(struct.pack("<Q", h) for h in hashes)
    return (fixed64(1, id) + fixed64(2, worker) + (message(3, packed) if hashes else b"")
            + uint(4, unhashed) + uint(5, prefill) + uint(6, lease) + uint(7, int(done)))


def reserved(id, worker, hashes, **kw):
    return message(1, booking(id, worker, hashes, **kw))


def prefill_complete(id):
    return fixed64(2, id)


def renewed(id, lease):
    return message(3, fixed64(1, id) + uint(2, lease))


def freed(id):
    return fixed64(4, id)


def batch(first_seq, events, origin=1, incarnation=1):
    body = fixed64(1, origin) + fixed64(2, incarnation) + uint(3, first_seq)
    body += b"".join(message(4, e) for e in events)
    return message(1, body)


def snapshot(last_seq, bookings, origin=1, incarnation=1):
    body = fixed64(1, origin) + fixed64(2, incarnation) + uint(3, last_seq)
    body += b"".join(message(4, b) for b in bookings)
    return message(2, body)


def digest(last_seq, live, total, origin=1, incarnation=1):
    return message(3, fixed64(1, origin) + fixed64(2, incarnation) + uint(3, last_seq) + uint(4, live)
                   + fixed64(5, total))


def resync(from_seq, origin=1, incarnation=1):
    return message(4, fixed64(1, origin) + fixed64(2, incarnation) + uint(3, from_seq))


SEEDS = {
    # Book, finish prefill, renew, free: in order.
    "in_order": stream(
        batch(1, [reserved(10, 2, [0xA, 0xB]), reserved(11, 4, [0xC], unhashed=1)]),
        batch(3, [prefill_complete(10), renewed(11, 600_000), freed(10)]),
        batch(6, [freed(11)]),
    ),
    # A retransmission overlapping what was applied.
    "overlap": stream(
        batch(1, [reserved(10, 2, [0xA])]),
        batch(1, [reserved(10, 2, [0xA]), reserved(12, 6, [0xD])]),
    ),
    # Events 2-3 lost; the snapshot answers the resync.
    "gap_then_snapshot": stream(
        batch(1, [reserved(10, 2, [0xA]), reserved(11, 2, [0xB])]),
        batch(4, [freed(10)]),
        resync(2),
        snapshot(4, [booking(11, 2, [0xB], done=True), booking(13, 8, [0xE])]),
        batch(5, [freed(13)]),
    ),
    # The origin restarted: its new incarnation starts over; the old one's
    # frames are stale.
    "restart": stream(
        batch(1, [reserved(10, 2, [0xA])]),
        batch(1, [reserved(20, 4, [0xF])], incarnation=2),
        batch(2, [freed(10)]),
    ),
    # A digest showing a lost tail, then one that disagrees.
    "digests": stream(
        batch(1, [reserved(10, 2, [0xA])]),
        digest(2, 2, 0x1234),
        snapshot(2, [booking(10, 2, [0xA]), booking(11, 4, [])]),
        digest(2, 2, 0x1234),
    ),
    # Bookings on workers this replica does not know (odd ids), and a
    # snapshot repeating an id.
    "strangers": stream(
        batch(1, [reserved(10, 3, [0xA]), prefill_complete(10), reserved(11, 2, [0xB]), freed(10)]),
        snapshot(4, [booking(11, 2, [0xB]), booking(11, 5, [0xB])]),
    ),
}

os.makedirs(OUT, exist_ok=True)
for name, data in SEEDS.items():
    with open(os.path.join(OUT, f"seed-{name}"), "wb") as f:
        f.write(data)
print(f"wrote {len(SEEDS)} seeds to {os.path.normpath(OUT)}")
