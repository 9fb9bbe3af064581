//! The generator of the seeded tests (xorshift64*): small, deterministic, and the same in every
//! crate's tests, so that a seed a failing run printed replays it.

/// A deterministic generator from a seed.
#[derive(Clone, Debug)]
pub struct SeededRng(u64);

impl SeededRng {
    /// The generator for `seed` (any value; zero is moved off the one state xorshift cannot
    /// leave).
    pub fn new(seed: u64) -> SeededRng {
        SeededRng(seed | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..bound` (0 when `bound` is 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        self.next_u64() % bound.max(1)
    }
}
