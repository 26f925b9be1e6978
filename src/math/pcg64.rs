//! numpy's default bit generator, reproduced exactly: `SeedSequence` seeding and PCG64
//! (128-bit LCG, XSL-RR output), plus the parts of `Generator` the turbo KV sign arrays need
//! (`integers` via Lemire's bounded method, `choice` with replacement).
//!
//! Facts used (numpy 2.x, `numpy/random/bit_generator.pyx`, `_pcg64.pyx`, `pcg64.h`,
//! `distributions.c`; checked against dumped numpy outputs in `tests/rotation.rs`):
//! - SeedSequence: the integer entropy is split into little-endian u32 words, hashed into a pool of
//!   4 u32 words with the multiply–xorshift hash (INIT_A = 0x43b0d7e5, MULT_A = 0x931e8875,
//!   mix multipliers 0xca01f9dd / 0x4973f715, shift 16), then expanded by `generate_state`
//!   (INIT_B = 0x8b51f9dd, MULT_B = 0x58f38ded); u64 words are pairs of u32 words, low first.
//! - PCG64 seeding: from 4 u64 words w, `initstate = w0·2^64 + w1`, `initseq = w2·2^64 + w3`;
//!   `inc = 2·initseq + 1`, `state = 0; step; state += initstate; step`.
//! - step: `state = state · 0x2360ed051fc65da44385df649fccf645 + inc (mod 2^128)`; each output
//!   steps first, then returns `rotr64(hi ^ lo, state >> 122)`.
//! - 32-bit draws use the low half of a 64-bit output first, then buffer the high half.
//! - `integers(0, n)` for n - 1 < 2^32 uses 32-bit draws with Lemire's multiply-shift rejection;
//!   larger ranges use the 64-bit version.

const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL_SIZE: usize = 4;

/// PCG64's 128-bit multiplier.
pub const PCG64_MULT: u128 = 0x2360_ed05_1fc6_5da4_4385_df64_9fcc_f645;

fn hashmix(value: u32, hash_const: &mut u32) -> u32 {
    let mut v = value ^ *hash_const;
    *hash_const = hash_const.wrapping_mul(MULT_A);
    v = v.wrapping_mul(*hash_const);
    v ^ (v >> XSHIFT)
}

fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L
        .wrapping_mul(x)
        .wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

/// numpy's `SeedSequence` (no spawn key, pool size 4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SeedSequence {
    pub pool: [u32; POOL_SIZE],
}

impl SeedSequence {
    /// `SeedSequence(entropy)` for a non-negative integer entropy.
    pub fn new(entropy: u128) -> SeedSequence {
        let mut words = Vec::new();
        let mut e = entropy;
        if e == 0 {
            words.push(0);
        }
        while e > 0 {
            words.push(e as u32);
            e >>= 32;
        }
        SeedSequence::from_words(&words)
    }

    /// From the assembled entropy words (what numpy's `_get_assembled_entropy` returns).
    pub fn from_words(entropy: &[u32]) -> SeedSequence {
        let mut hc = INIT_A;
        let mut pool = [0u32; POOL_SIZE];
        for (i, p) in pool.iter_mut().enumerate() {
            *p = hashmix(entropy.get(i).copied().unwrap_or(0), &mut hc);
        }
        for src in 0..POOL_SIZE {
            for dst in 0..POOL_SIZE {
                if src != dst {
                    let h = hashmix(pool[src], &mut hc);
                    pool[dst] = mix(pool[dst], h);
                }
            }
        }
        for &e in entropy.iter().skip(POOL_SIZE) {
            for p in pool.iter_mut() {
                let h = hashmix(e, &mut hc);
                *p = mix(*p, h);
            }
        }
        SeedSequence { pool }
    }

    /// `generate_state(n, np.uint32)`.
    pub fn generate_state_u32(&self, n: usize) -> Vec<u32> {
        let mut hc = INIT_B;
        (0..n)
            .map(|i| {
                let mut v = self.pool[i % POOL_SIZE] ^ hc;
                hc = hc.wrapping_mul(MULT_B);
                v = v.wrapping_mul(hc);
                v ^ (v >> XSHIFT)
            })
            .collect()
    }

    /// `generate_state(n, np.uint64)`: pairs of u32 words, low word first.
    pub fn generate_state_u64(&self, n: usize) -> Vec<u64> {
        let w = self.generate_state_u32(2 * n);
        w.chunks_exact(2)
            .map(|c| c[0] as u64 | (c[1] as u64) << 32)
            .collect()
    }
}

/// numpy's PCG64 bit generator with its 32-bit buffer.
#[derive(Clone, Debug)]
pub struct Pcg64 {
    pub state: u128,
    pub inc: u128,
    has_u32: bool,
    u32_buf: u32,
}

impl Pcg64 {
    /// `PCG64(SeedSequence(seed))`, i.e. the generator of `numpy.random.default_rng(seed)`.
    pub fn new(seed: u128) -> Pcg64 {
        Pcg64::from_seed_sequence(&SeedSequence::new(seed))
    }

    pub fn from_seed_sequence(ss: &SeedSequence) -> Pcg64 {
        let w = ss.generate_state_u64(4);
        let initstate = (w[0] as u128) << 64 | w[1] as u128;
        let initseq = (w[2] as u128) << 64 | w[3] as u128;
        let mut g = Pcg64 {
            state: 0,
            inc: (initseq << 1) | 1,
            has_u32: false,
            u32_buf: 0,
        };
        g.step();
        g.state = g.state.wrapping_add(initstate);
        g.step();
        g
    }

    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG64_MULT).wrapping_add(self.inc);
    }

    /// One raw 64-bit output (`bit_generator.random_raw()`).
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let s = self.state;
        let x = ((s >> 64) as u64) ^ (s as u64);
        x.rotate_right((s >> 122) as u32)
    }

    /// numpy's `next_uint32`: low half of a fresh 64-bit output, then the buffered high half.
    pub fn next_u32(&mut self) -> u32 {
        if self.has_u32 {
            self.has_u32 = false;
            return self.u32_buf;
        }
        let v = self.next_u64();
        self.has_u32 = true;
        self.u32_buf = (v >> 32) as u32;
        v as u32
    }

    /// `Generator.integers(0, n)` (n >= 1) for one value.
    pub fn integers_below(&mut self, n: u64) -> u64 {
        assert!(n >= 1);
        let rng = n - 1;
        if rng == 0 {
            return 0;
        }
        if rng <= 0xFFFF_FFFF {
            if rng == 0xFFFF_FFFF {
                return self.next_u32() as u64;
            }
            let excl = rng as u32 + 1;
            let mut m = self.next_u32() as u64 * excl as u64;
            let mut left = m as u32;
            if left < excl {
                let threshold = (u32::MAX - rng as u32) % excl;
                while left < threshold {
                    m = self.next_u32() as u64 * excl as u64;
                    left = m as u32;
                }
            }
            m >> 32
        } else {
            if rng == u64::MAX {
                return self.next_u64();
            }
            let excl = rng + 1;
            let mut m = self.next_u64() as u128 * excl as u128;
            let mut left = m as u64;
            if left < excl {
                let threshold = (u64::MAX - rng) % excl;
                while left < threshold {
                    m = self.next_u64() as u128 * excl as u128;
                    left = m as u64;
                }
            }
            (m >> 64) as u64
        }
    }

    /// `Generator.choice([-1.0, 1.0], size)` as signs.
    pub fn choice_pm1(&mut self, size: usize) -> Vec<i8> {
        (0..size)
            .map(|_| if self.integers_below(2) == 0 { -1 } else { 1 })
            .collect()
    }
}

/// The two turbo KV sign arrays regenerated from the generator:
/// `rng = default_rng(42); (rng.choice([-1., 1.], 128), rng.choice([-1., 1.], 128))`.
pub fn turbo_signs() -> ([i8; 128], [i8; 128]) {
    let mut g = Pcg64::new(42);
    let a = g.choice_pm1(128);
    let b = g.choice_pm1(128);
    (a.try_into().unwrap(), b.try_into().unwrap())
}

/// tq's own sign stream for full-row rotations: sign `i` is bit `i % 64` of raw output `i / 64`
/// of `default_rng(seed)` (bit set → -1). Reproducible in numpy with
/// `np.unpackbits(default_rng(seed).bit_generator.random_raw(k).view(np.uint8), bitorder="little")`.
pub fn row_signs(seed: u64, n: usize) -> Vec<f32> {
    let mut g = Pcg64::new(seed as u128);
    let mut out = Vec::with_capacity(n);
    let mut word = 0u64;
    for i in 0..n {
        if i % 64 == 0 {
            word = g.next_u64();
        }
        out.push(if (word >> (i % 64)) & 1 == 1 {
            -1.0
        } else {
            1.0
        });
    }
    out
}

/// Default seed of tq's full-row rotations (ASCII "tq").
pub const DEFAULT_ROW_SEED: u64 = 0x7471;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::math::signs::{TURBO_S1, TURBO_S2};

    #[test]
    fn turbo_arrays_from_generator() {
        let (a, b) = turbo_signs();
        assert_eq!(a, TURBO_S1);
        assert_eq!(b, TURBO_S2);
    }

    #[test]
    fn seed_sequence_zero_entropy_is_one_word() {
        assert_eq!(SeedSequence::new(0), SeedSequence::from_words(&[0]));
        assert_ne!(SeedSequence::new(1 << 32), SeedSequence::new(1));
    }

    #[test]
    fn row_signs_are_balanced_and_seeded() {
        let s = row_signs(DEFAULT_ROW_SEED, 4096);
        let pos = s.iter().filter(|&&x| x > 0.0).count();
        assert!((1800..2300).contains(&pos));
        assert_eq!(s[..100], row_signs(DEFAULT_ROW_SEED, 100)[..]);
        assert_ne!(s[..64], row_signs(DEFAULT_ROW_SEED + 1, 64)[..]);
    }
}
