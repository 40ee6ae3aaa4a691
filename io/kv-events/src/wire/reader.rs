//! A minimal zero-copy msgpack reader over a byte slice.
//!
//! Only what the KV-event decoder needs: read one token (scalar, string,
//! binary, or the header of an array/map), and skip a whole value. Every read
//! is bounds-checked and reports the byte offset where it failed; nothing here
//! can panic or allocate.
//!
//! Array and map headers are checked against the bytes left: every msgpack
//! value takes at least one byte, so an array of `n` elements needs `n` bytes
//! and a map `2n`. A header claiming more is rejected at once, which bounds
//! every loop and every `Vec::with_capacity` driven by a length to the size of
//! the input.

use super::WireError;

/// One msgpack token. Strings and binaries borrow from the input; arrays and
/// maps are only their header (the elements follow in the input).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Token<'a> {
    Nil,
    Bool(bool),
    /// Any non-negative integer, whatever its encoded width.
    Uint(u64),
    /// A negative integer (msgpack's signed encodings of values >= 0 are
    /// folded into `Uint`).
    Neg(i64),
    Float(f64),
    Str(&'a [u8]),
    Bin(&'a [u8]),
    Array(u32),
    Map(u32),
    Ext,
}

impl Token<'_> {
    /// Name of the token's msgpack family, for error messages.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Token::Nil => "nil",
            Token::Bool(_) => "bool",
            Token::Uint(_) | Token::Neg(_) => "int",
            Token::Float(_) => "float",
            Token::Str(_) => "str",
            Token::Bin(_) => "bin",
            Token::Array(_) => "array",
            Token::Map(_) => "map",
            Token::Ext => "ext",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Byte offset of the next read.
    #[inline]
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    /// Moves back (or forward) to an offset previously returned by `pos`.
    #[inline]
    pub(crate) fn seek(&mut self, pos: usize) {
        self.pos = pos.min(self.buf.len());
    }

    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.pos >= self.buf.len()
    }

    /// The marker byte of the next value, without consuming it.
    #[inline]
    pub(crate) fn peek(&self, what: &'static str) -> Result<u8, WireError> {
        match self.buf.get(self.pos) {
            Some(&b) => Ok(b),
            None => Err(WireError::Truncated { offset: self.pos, what }),
        }
    }

    #[inline]
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], WireError> {
        let end = self.pos.checked_add(n).filter(|&end| end <= self.buf.len());
        match end.and_then(|end| self.buf.get(self.pos..end)) {
            Some(bytes) => {
                self.pos += n;
                Ok(bytes)
            }
            None => Err(WireError::Truncated { offset: self.pos, what }),
        }
    }

    #[inline]
    fn be<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let bytes = self.take(N, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    #[inline]
    fn len8(&mut self, what: &'static str) -> Result<usize, WireError> {
        Ok(usize::from(self.be::<1>(what)?[0]))
    }

    #[inline]
    fn len16(&mut self, what: &'static str) -> Result<usize, WireError> {
        Ok(usize::from(u16::from_be_bytes(self.be(what)?)))
    }

    #[inline]
    fn len32(&mut self, what: &'static str) -> Result<usize, WireError> {
        // u32 always fits usize on the 32- and 64-bit targets we build for;
        // saturate anyway so a 16-bit target would fail the bounds check.
        Ok(usize::try_from(u32::from_be_bytes(self.be(what)?)).unwrap_or(usize::MAX))
    }

    /// Checks an array/map header of `elements` values against the input left.
    #[inline]
    fn container(&self, start: usize, len: usize, per_entry: usize, what: &'static str) -> Result<u32, WireError> {
        let need = len.saturating_mul(per_entry);
        if need > self.remaining() {
            return Err(WireError::Truncated { offset: start, what });
        }
        // `len` came from at most 32 bits.
        Ok(u32::try_from(len).unwrap_or(u32::MAX))
    }

    /// Reads the next token. Scalars, strings, binaries and extensions are
    /// consumed whole; arrays and maps only their header.
    pub(crate) fn token(&mut self, what: &'static str) -> Result<Token<'a>, WireError> {
        let start = self.pos;
        // Truncation is reported at the start of the value it cut.
        self.token_at(start, what).map_err(|e| match e {
            WireError::Truncated { what, .. } => WireError::Truncated { offset: start, what },
            other => other,
        })
    }

    fn token_at(&mut self, start: usize, what: &'static str) -> Result<Token<'a>, WireError> {
        let marker = self.peek(what)?;
        self.pos += 1;
        let token = match marker {
            0x00..=0x7f => Token::Uint(u64::from(marker)),
            0x80..=0x8f => Token::Map(self.container(start, usize::from(marker & 0x0f), 2, what)?),
            0x90..=0x9f => Token::Array(self.container(start, usize::from(marker & 0x0f), 1, what)?),
            0xa0..=0xbf => Token::Str(self.take(usize::from(marker & 0x1f), what)?),
            0xc0 => Token::Nil,
            0xc1 => return Err(WireError::InvalidMarker { offset: start, marker }),
            0xc2 => Token::Bool(false),
            0xc3 => Token::Bool(true),
            0xc4 => {
                let n = self.len8(what)?;
                Token::Bin(self.take(n, what)?)
            }
            0xc5 => {
                let n = self.len16(what)?;
                Token::Bin(self.take(n, what)?)
            }
            0xc6 => {
                let n = self.len32(what)?;
                Token::Bin(self.take(n, what)?)
            }
            0xc7 => {
                let n = self.len8(what)?;
                self.take(n.saturating_add(1), what)?;
                Token::Ext
            }
            0xc8 => {
                let n = self.len16(what)?;
                self.take(n.saturating_add(1), what)?;
                Token::Ext
            }
            0xc9 => {
                let n = self.len32(what)?;
                self.take(n.saturating_add(1), what)?;
                Token::Ext
            }
            0xca => Token::Float(f64::from(f32::from_be_bytes(self.be(what)?))),
            0xcb => Token::Float(f64::from_be_bytes(self.be(what)?)),
            0xcc => Token::Uint(u64::from(self.be::<1>(what)?[0])),
            0xcd => Token::Uint(u64::from(u16::from_be_bytes(self.be(what)?))),
            0xce => Token::Uint(u64::from(u32::from_be_bytes(self.be(what)?))),
            0xcf => Token::Uint(u64::from_be_bytes(self.be(what)?)),
            0xd0 => signed(i64::from(i8::from_be_bytes(self.be(what)?))),
            0xd1 => signed(i64::from(i16::from_be_bytes(self.be(what)?))),
            0xd2 => signed(i64::from(i32::from_be_bytes(self.be(what)?))),
            0xd3 => signed(i64::from_be_bytes(self.be(what)?)),
            0xd4 => {
                self.take(2, what)?;
                Token::Ext
            }
            0xd5 => {
                self.take(3, what)?;
                Token::Ext
            }
            0xd6 => {
                self.take(5, what)?;
                Token::Ext
            }
            0xd7 => {
                self.take(9, what)?;
                Token::Ext
            }
            0xd8 => {
                self.take(17, what)?;
                Token::Ext
            }
            0xd9 => {
                let n = self.len8(what)?;
                Token::Str(self.take(n, what)?)
            }
            0xda => {
                let n = self.len16(what)?;
                Token::Str(self.take(n, what)?)
            }
            0xdb => {
                let n = self.len32(what)?;
                Token::Str(self.take(n, what)?)
            }
            0xdc => {
                let n = self.len16(what)?;
                Token::Array(self.container(start, n, 1, what)?)
            }
            0xdd => {
                let n = self.len32(what)?;
                Token::Array(self.container(start, n, 1, what)?)
            }
            0xde => {
                let n = self.len16(what)?;
                Token::Map(self.container(start, n, 2, what)?)
            }
            0xdf => {
                let n = self.len32(what)?;
                Token::Map(self.container(start, n, 2, what)?)
            }
            0xe0..=0xff => Token::Neg(i64::from(marker as i8)),
        };
        Ok(token)
    }

    /// Skips one whole value, however deeply nested, without recursion: a
    /// counter of values still owed replaces the stack, so hostile nesting
    /// costs O(bytes) time and O(1) space.
    pub(crate) fn skip(&mut self, what: &'static str) -> Result<(), WireError> {
        let token = self.token(what)?;
        self.skip_contents(token, what)
    }

    /// Skips the elements of an array or map whose header `token` was just
    /// read (nothing for any other token, which `token` consumed whole).
    pub(crate) fn skip_contents(&mut self, token: Token<'a>, what: &'static str) -> Result<(), WireError> {
        let mut owed: u64 = match token {
            Token::Array(n) => u64::from(n),
            Token::Map(n) => 2 * u64::from(n),
            _ => return Ok(()),
        };
        while owed > 0 {
            owed -= 1;
            match self.token(what)? {
                Token::Array(n) => owed = owed.saturating_add(u64::from(n)),
                Token::Map(n) => owed = owed.saturating_add(2 * u64::from(n)),
                _ => {}
            }
        }
        Ok(())
    }

    /// Fast path for the most common scalar of the hot loops: a non-negative
    /// integer. Falls back to [`Reader::token`] for anything but fixints.
    #[inline]
    pub(crate) fn token_fast(&mut self, what: &'static str) -> Result<Token<'a>, WireError> {
        match self.buf.get(self.pos) {
            Some(&b) if b <= 0x7f => {
                self.pos += 1;
                Ok(Token::Uint(u64::from(b)))
            }
            _ => self.token(what),
        }
    }
}

#[inline]
fn signed(v: i64) -> Token<'static> {
    if v >= 0 { Token::Uint(v as u64) } else { Token::Neg(v) }
}
