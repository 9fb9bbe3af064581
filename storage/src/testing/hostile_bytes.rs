//! Inputs a decoder of outside bytes (from disk, peers or plugins) must survive: it may refuse
//! them, never panic, abort on a huge allocation or loop.

use super::SeededRng;

/// `random_count` random byte strings (0–300 bytes, some all 0xFF), and every `valid` encoding
/// truncated at each length, with one random bit flipped (many times), with bytes appended,
/// and with each 4- and 8-byte window set to 0xFF (a length or count far past the input).
pub fn hostile_inputs(valid: &[Vec<u8>], seed: u64, random_count: usize) -> Vec<Vec<u8>> {
    let mut rng = SeededRng::new(seed);
    let mut inputs = Vec::new();
    for _ in 0..random_count {
        let len = rng.below(301) as usize;
        let fill_ff = rng.below(8) == 0;
        inputs.push(
            (0..len)
                .map(|_| if fill_ff { 0xFF } else { rng.next_u64() as u8 })
                .collect(),
        );
    }
    for encoding in valid {
        for len in 0..encoding.len() {
            inputs.push(encoding[..len].to_vec());
        }
        for _ in 0..(8 * encoding.len()).min(2_000) {
            let mut flipped = encoding.clone();
            if !flipped.is_empty() {
                let bit = rng.below(flipped.len() as u64 * 8) as usize;
                flipped[bit / 8] ^= 1 << (bit % 8);
            }
            inputs.push(flipped);
        }
        let mut longer = encoding.clone();
        longer.extend((0..1 + rng.below(16)).map(|_| rng.next_u64() as u8));
        inputs.push(longer);
        for width in [4, 8] {
            for at in 0..encoding.len().saturating_sub(width - 1) {
                let mut huge = encoding.clone();
                huge[at..at + width].fill(0xFF);
                inputs.push(huge);
            }
        }
    }
    inputs
}
