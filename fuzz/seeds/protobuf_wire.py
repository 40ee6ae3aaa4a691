"""Protobuf's wire format by hand, for the seed writers (independent of
kvpick's own encoders, so a seed also checks them), and the fuzz targets'
stream framing: each frame prefixed with its length as a little-endian u16.
"""
import struct


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def key(field, wire):
    return varint(field << 3 | wire)


def fixed64(field, n):
    return key(field, 1) + struct.pack("<Q", n)


def double(field, x):
    return key(field, 1) + struct.pack("<d", x)


def uint(field, n):
    """A varint field; absent when 0, as proto3 writes it."""
    return key(field, 0) + varint(n) if n else b""


def message(field, body):
    """A length-delimited field: a message or bytes."""
    return key(field, 2) + varint(len(body)) + body


def packed64(field, values):
    return message(field, b"".join(struct.pack("<Q", v) for v in values)) if values else b""


def packed_uint(field, values):
    return message(field, b"".join(varint(v) for v in values)) if values else b""


def stream(*frames):
    return b"".join(struct.pack("<H", len(f)) + f for f in frames)
