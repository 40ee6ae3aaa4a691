//! A msgpack writer that picks the markers msgspec picks, so the simulated
//! engine's payloads are byte-identical to vLLM's.
//!
//! msgspec always writes the smallest form: positive ints as fixint, then
//! `uint8`/`16`/`32`/`64` (`0xcc`–`0xcf`; so a hash ≥ 2^63 is `0xcf`);
//! floats always as `float64` (`0xcb`); strings as fixstr, then `str8`/`16`/`32`; bytes as
//! `bin8`/`16`/`32`; arrays and maps as fix, then 16/32-bit lengths. The
//! simulator never writes a negative int (vLLM's hashes are unsigned).
//!
//! # Why not `rmp`
//!
//! This writer is ~80 lines and only writes into a `Vec<u8>`: every marker
//! choice is visible and tested against msgspec's bytes (the fixtures in
//! `tests/fixtures/kv_events/`). `rmp::encode` makes the same choices but
//! returns a `Result` over `io::Write` on every call, which for a `Vec` can
//! never fail: the noise would outweigh the code saved.

/// Appends msgpack values to a byte buffer.
#[derive(Debug, Default)]
pub(crate) struct MsgpackWriter {
    buf: Vec<u8>,
}

impl MsgpackWriter {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.buf
    }

    pub(crate) fn nil(&mut self) {
        self.buf.push(0xc0);
    }

    pub(crate) fn uint(&mut self, v: u64) {
        if v < 0x80 {
            self.buf.push(v as u8);
        } else if v <= 0xff {
            self.buf.extend_from_slice(&[0xcc, v as u8]);
        } else if v <= 0xffff {
            self.buf.push(0xcd);
            self.buf.extend_from_slice(&(v as u16).to_be_bytes());
        } else if v <= 0xffff_ffff {
            self.buf.push(0xce);
            self.buf.extend_from_slice(&(v as u32).to_be_bytes());
        } else {
            self.buf.push(0xcf);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    /// A signed integer in msgpack's smallest form, as msgspec writes a
    /// Python int: non-negative values as unsigned, negative ones as
    /// negative fixint or int 8/16/32/64.
    pub(crate) fn int(&mut self, v: i64) {
        if v >= 0 {
            self.uint(v as u64);
        } else if v >= -32 {
            self.buf.push(v as u8);
        } else if v >= i64::from(i8::MIN) {
            self.buf.extend_from_slice(&[0xd0, v as u8]);
        } else if v >= i64::from(i16::MIN) {
            self.buf.push(0xd1);
            self.buf.extend_from_slice(&(v as i16).to_be_bytes());
        } else if v >= i64::from(i32::MIN) {
            self.buf.push(0xd2);
            self.buf.extend_from_slice(&(v as i32).to_be_bytes());
        } else {
            self.buf.push(0xd3);
            self.buf.extend_from_slice(&v.to_be_bytes());
        }
    }

    pub(crate) fn f64(&mut self, v: f64) {
        self.buf.push(0xcb);
        self.buf.extend_from_slice(&v.to_be_bytes());
    }

    pub(crate) fn str(&mut self, s: &str) {
        let n = s.len();
        if n < 32 {
            self.buf.push(0xa0 | n as u8);
        } else {
            self.len_marker(n, [0xd9, 0xda, 0xdb]);
        }
        self.buf.extend_from_slice(s.as_bytes());
    }

    pub(crate) fn bin(&mut self, b: &[u8]) {
        self.len_marker(b.len(), [0xc4, 0xc5, 0xc6]);
        self.buf.extend_from_slice(b);
    }

    pub(crate) fn array(&mut self, n: usize) {
        if n < 16 {
            self.buf.push(0x90 | n as u8);
        } else {
            self.len_marker_16_32(n, [0xdc, 0xdd]);
        }
    }

    pub(crate) fn map(&mut self, n: usize) {
        if n < 16 {
            self.buf.push(0x80 | n as u8);
        } else {
            self.len_marker_16_32(n, [0xde, 0xdf]);
        }
    }

    /// An 8-, 16- or 32-bit length after one of three markers.
    fn len_marker(&mut self, n: usize, markers: [u8; 3]) {
        if n <= 0xff {
            self.buf.extend_from_slice(&[markers[0], n as u8]);
        } else {
            self.len_marker_16_32(n, [markers[1], markers[2]]);
        }
    }

    fn len_marker_16_32(&mut self, n: usize, markers: [u8; 2]) {
        if n <= 0xffff {
            self.buf.push(markers[0]);
            self.buf.extend_from_slice(&(n as u16).to_be_bytes());
        } else {
            // msgpack's limit; nothing the simulator builds comes close.
            let n = u32::try_from(n).expect("msgpack containers hold fewer than 2^32 items");
            self.buf.push(markers[1]);
            self.buf.extend_from_slice(&n.to_be_bytes());
        }
    }
}
