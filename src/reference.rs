//! The reference sum every custom candidate must equal byte for byte, the bf16 bit helpers it
//! is made of, and random test data that reaches its corners.
//!
//! Per element: `acc = x[0]; acc += x[1]; ...; acc += x[n-1]` in fp32 (rank order, starting
//! from rank 0's value so -0 survives), then one round to nearest even to bf16; subnormals are
//! kept, overflow gives infinity, and a NaN result is the canonical [`CANONICAL_NAN`]. The
//! kernels implement the same steps in `kernels/prepare_bf16.cuh`.

use rayon::prelude::*;

/// The bf16 every NaN result becomes (positive, quiet, all mantissa bits set).
pub const CANONICAL_NAN: u16 = 0x7FFF;

/// The fp32 value of a bf16 (exact: bf16 is fp32's upper half).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// The bf16 nearest `value`, ties to even; infinity past the largest bf16; NaN becomes
/// [`CANONICAL_NAN`].
pub fn f32_to_bf16(value: f32) -> u16 {
    if value.is_nan() {
        return CANONICAL_NAN;
    }
    let bits = value.to_bits();
    // Adding just under half an ulp, plus one when the kept part is odd, carries into the kept
    // half exactly when rounding to nearest even goes up; it cannot overflow 32 bits for a
    // non-NaN.
    ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) as u16
}

/// The element-wise sum of every rank's bf16 input, `inputs[r]` being rank r's, exactly as
/// the custom kernels compute it.
///
/// Panics when `inputs` is empty or the ranks' lengths differ.
pub fn reference_sum_bf16(inputs: &[&[u16]]) -> Vec<u16> {
    let (first, rest) = inputs
        .split_first()
        .expect("the reference sum needs at least one rank");
    for (index, input) in rest.iter().enumerate() {
        assert_eq!(
            input.len(),
            first.len(),
            "rank {} has {} elements but rank 0 has {}",
            index + 1,
            input.len(),
            first.len()
        );
    }
    let mut sums = vec![0_u16; first.len()];
    sums.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(chunk, out)| {
            let start = chunk * CHUNK;
            for (offset, sum_bits) in out.iter_mut().enumerate() {
                let element = start + offset;
                let mut sum = bf16_to_f32(first[element]);
                for input in rest {
                    sum += bf16_to_f32(input[element]);
                }
                *sum_bits = f32_to_bf16(sum);
            }
        });
    sums
}

/// Elements per parallel piece of work: large enough to amortise scheduling, small enough to
/// spread a 64 MiB message over every core.
const CHUNK: usize = 1 << 16;

/// A small deterministic generator (SplitMix64): test data needs no cryptographic quality, and
/// a seed makes a failure reproducible.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// `len` random bf16 values from `seed`: mostly ordinary magnitudes (2^-15 to 2^16), with
/// zeros of both signs, subnormals, the smallest normals, magnitudes near the largest bf16
/// (whose sums overflow), infinities and NaNs mixed in, so a comparison with
/// [`reference_sum_bf16`] exercises signed zeros, no flush to zero, rounding, overflow and NaN.
pub fn random_bf16(seed: u64, len: usize) -> Vec<u16> {
    let mut values = vec![0_u16; len];
    // Each piece has its own stream of the seed, so the values do not depend on the threads.
    values
        .par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(chunk, out)| {
            let mut generator =
                SplitMix64(seed ^ (chunk as u64).wrapping_mul(0xA24B_AED4_963E_E407));
            for value in out {
                *value = random_value(generator.next());
            }
        });
    values
}

/// One random bf16 from 64 random bits (see [`random_bf16`]).
fn random_value(draw: u64) -> u16 {
    let sign = ((draw >> 8) & 1) as u16 * 0x8000;
    let mantissa = ((draw >> 16) & 0x7F) as u16;
    let exponent_draw = (draw >> 24) as u16;
    let magnitude = match draw & 0xFF {
        // NaN with a nonzero mantissa.
        0 => 0x7F80 | mantissa.max(1),
        1 => 0x7F80,
        2..=9 => 0,
        // Subnormal: exponent field 0, nonzero mantissa.
        10..=25 => mantissa.max(1),
        // The smallest normals, whose differences are subnormal.
        26..=33 => ((1 + exponent_draw % 8) << 7) | mantissa,
        // Exponent fields 0xF0..=0xFE: up to the largest finite bf16.
        34..=49 => ((0xF0 + exponent_draw % 15) << 7) | mantissa,
        // Exponent fields 112..=142.
        _ => ((112 + exponent_draw % 31) << 7) | mantissa,
    };
    sign | magnitude
}

/// One input of `len` random values per rank ([`random_bf16`]), each rank from its own
/// stream of `seed`.
pub fn random_inputs(seed: u64, world: usize, len: usize) -> Vec<Vec<u16>> {
    (0..world)
        .map(|rank| {
            let stream =
                SplitMix64(seed ^ (rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)).next();
            random_bf16(stream, len)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(inputs: &[&[u16]]) -> Vec<u16> {
        reference_sum_bf16(inputs)
    }

    #[test]
    fn negative_zero_survives_at_every_world_size() {
        for world in 1..=8 {
            let input = [0x8000u16];
            let inputs: Vec<&[u16]> = vec![&input; world];
            assert_eq!(sum(&inputs), [0x8000], "world {world}");
        }
        // -0 + +0 is +0 in either order.
        assert_eq!(sum(&[&[0x8000], &[0x0000]]), [0x0000]);
        assert_eq!(sum(&[&[0x0000], &[0x8000]]), [0x0000]);
    }

    #[test]
    fn subnormals_are_kept_not_flushed() {
        assert_eq!(sum(&[&[0x0001], &[0x0001]]), [0x0002]);
        let smallest: &[u16] = &[0x0001];
        assert_eq!(sum(&[smallest; 8]), [0x0008]);
        // The smallest normal minus the smallest subnormal is subnormal (FTZ/DAZ give 0x0080).
        assert_eq!(sum(&[&[0x0080], &[0x8001]]), [0x007F]);
        assert_eq!(sum(&[&[0x8001], &[0x0001]]), [0x0000]);
    }

    #[test]
    fn ties_round_to_even() {
        // 1 + 2^-8 is halfway between 1 (even) and 1 + 2^-7 (odd): down to 1.
        assert_eq!(sum(&[&[0x3F80], &[0x3B80]]), [0x3F80]);
        // (1 + 2^-7) + 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
        assert_eq!(sum(&[&[0x3F81], &[0x3B80]]), [0x3F82]);
        // Negative ties mirror positive ones.
        assert_eq!(sum(&[&[0xBF81], &[0xBB80]]), [0xBF82]);
    }

    #[test]
    fn overflow_gives_infinity() {
        assert_eq!(sum(&[&[0x7F7F], &[0x7F7F]]), [0x7F80]);
        assert_eq!(sum(&[&[0xFF7F], &[0xFF7F]]), [0xFF80]);
        // A finite fp32 sum halfway above the largest bf16 (odd) rounds to infinity.
        assert_eq!(sum(&[&[0x7F7F], &[0x7B00]]), [0x7F80]);
    }

    #[test]
    fn every_nan_becomes_the_canonical_nan() {
        assert_eq!(sum(&[&[0x7FC0], &[0x3F80]]), [CANONICAL_NAN]);
        assert_eq!(sum(&[&[0x0000], &[0xFFC1]]), [CANONICAL_NAN]);
        assert_eq!(sum(&[&[0x7F81]]), [CANONICAL_NAN]);
        assert_eq!(sum(&[&[0x7F80], &[0xFF80]]), [CANONICAL_NAN]);
    }

    #[test]
    fn rank_order_matters() {
        // 2^30 - 2^30 + 1 = 1, but 1 + 2^30 rounds to 2^30 in fp32, so - 2^30 leaves 0.
        assert_eq!(sum(&[&[0x4E80], &[0xCE80], &[0x3F80]]), [0x3F80]);
        assert_eq!(sum(&[&[0x3F80], &[0x4E80], &[0xCE80]]), [0x0000]);
    }

    #[test]
    #[should_panic(expected = "rank 2 has 1 elements but rank 0 has 2")]
    fn ranks_of_different_lengths_are_refused() {
        sum(&[&[0, 0], &[0, 0], &[0]]);
    }

    #[test]
    fn random_data_reaches_every_corner_and_follows_its_seed() {
        let data = random_bf16(7, 1 << 16);
        let exponent = |bits: u16| (bits >> 7) & 0xFF;
        let count =
            |predicate: &dyn Fn(u16) -> bool| data.iter().filter(|&&b| predicate(b)).count();
        assert!(count(&|b| b == 0x8000) > 0, "negative zero");
        assert!(count(&|b| b == 0x0000) > 0, "positive zero");
        assert!(
            count(&|b| exponent(b) == 0 && b & 0x7F != 0) > 0,
            "subnormal"
        );
        assert!(
            count(&|b| exponent(b) >= 0xF0 && exponent(b) < 0xFF) > 0,
            "large"
        );
        assert!(count(&|b| exponent(b) == 0xFF && b & 0x7F != 0) > 0, "NaN");
        assert!(count(&|b| b & 0x7FFF == 0x7F80) > 0, "infinity");
        assert!(count(&|b| b & 0x8000 != 0) > data.len() / 3, "both signs");
        assert_eq!(data, random_bf16(7, 1 << 16));
        assert_ne!(data, random_bf16(8, 1 << 16));
        let inputs = random_inputs(7, 4, 64);
        assert_eq!(inputs.len(), 4);
        assert!(inputs.iter().all(|input| input.len() == 64));
        assert_ne!(inputs[0], inputs[1]);
    }
}
