//! A seeded random stream for tests that check a structure against a
//! plain model over long runs of operations (xorshift64: fast, no
//! dependency, and the same sequence on every machine).

/// The xorshift64 stream from `seed` (not 0).
pub(crate) fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
    move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    }
}
