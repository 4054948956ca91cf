//! The reference sum every custom candidate must equal byte for byte, the bit helpers it is
//! made of, and random test data that reaches its corners, for every element type.
//!
//! Per element: `acc = x[0]; acc += x[1]; ...; acc += x[n-1]` in fp32 (rank order, starting
//! from rank 0's value so -0 survives); then bf16 and fp16 are rounded once to nearest even,
//! while fp32 is the sum as it is. Subnormals are kept, overflow gives infinity (fp16 too, as
//! IEEE conversion does), and a NaN result is the type's canonical NaN ([`canonical_nan`]).
//! The kernels implement the same steps in `kernels/prepare_element.cuh`.
//!
//! Per collective ([`reference_outputs`]): the all-reduce gives every rank that sum; the
//! reduce-scatter gives each rank its own rows of it ([`crate::shape`]); the all-gather moves
//! each rank's rows into every rank's output untouched. So the all-gather of a reduce-scatter is
//! the all-reduce, bit for bit. The fused all-reduce + residual add + RMSNorm has its own
//! operands and order ([`reference_epilogue`], module `epilogue`).

use rayon::prelude::*;

mod epilogue;

pub use epilogue::{
    inverse_rms, reference_add_rms_norm, reference_epilogue, sum_of_squares, EpilogueError,
    EpilogueInputs, EpilogueOutputs, NORM_LANES,
};

use crate::ladder::{Collective, Dtype};
use crate::shape::Shape;

/// The bf16 every NaN result becomes (positive, quiet, all mantissa bits set).
pub const CANONICAL_NAN: u16 = 0x7FFF;

/// The bits every NaN result of `dtype` becomes: 0x7FFF for bf16 and fp16, 0x7FFF_FFFF for
/// fp32 (positive, quiet, all mantissa bits set, as the GPU's own conversions give).
pub fn canonical_nan(dtype: Dtype) -> u32 {
    match dtype {
        Dtype::Bf16 | Dtype::Fp16 => 0x7FFF,
        Dtype::Fp32 => 0x7FFF_FFFF,
    }
}

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

/// The fp32 value of an element's bits (exact for every type).
pub fn to_f32(dtype: Dtype, bits: u32) -> f32 {
    match dtype {
        Dtype::Bf16 => bf16_to_f32(bits as u16),
        Dtype::Fp16 => half::f16::from_bits(bits as u16).to_f32(),
        Dtype::Fp32 => f32::from_bits(bits),
    }
}

/// An fp32 sum as the bits of `dtype`: bf16 and fp16 to nearest even (infinity past the
/// largest finite value), fp32 unchanged; NaN becomes [`canonical_nan`].
pub fn from_f32(dtype: Dtype, value: f32) -> u32 {
    if value.is_nan() {
        return canonical_nan(dtype);
    }
    match dtype {
        Dtype::Bf16 => u32::from(f32_to_bf16(value)),
        Dtype::Fp16 => u32::from(half::f16::from_f32(value).to_bits()),
        Dtype::Fp32 => value.to_bits(),
    }
}

/// Element `index` of little-endian `bytes` of `dtype`, as bits.
pub fn element(dtype: Dtype, bytes: &[u8], index: usize) -> u32 {
    let size = dtype.size_bytes() as usize;
    bytes[index * size..][..size]
        .iter()
        .rev()
        .fold(0, |bits, byte| (bits << 8) | u32::from(*byte))
}

fn put_element(dtype: Dtype, bytes: &mut [u8], index: usize, bits: u32) {
    let size = dtype.size_bytes() as usize;
    bytes[index * size..][..size].copy_from_slice(&bits.to_le_bytes()[..size]);
}

/// The element-wise sum of every rank's input of `dtype` (little-endian bytes), `inputs[r]`
/// being rank r's, exactly as the custom kernels compute it.
///
/// Panics when `inputs` is empty, the ranks' lengths differ, or a length is not a whole number
/// of elements.
pub fn reference_sum(dtype: Dtype, inputs: &[&[u8]]) -> Vec<u8> {
    let (first, rest) = inputs
        .split_first()
        .expect("the reference sum needs at least one rank");
    let size = dtype.size_bytes() as usize;
    assert_eq!(
        first.len() % size,
        0,
        "rank 0 has {} bytes, not a whole number of {dtype} elements",
        first.len()
    );
    for (index, input) in rest.iter().enumerate() {
        assert_eq!(
            input.len(),
            first.len(),
            "rank {} has {} elements but rank 0 has {}",
            index + 1,
            input.len() / size,
            first.len() / size
        );
    }
    let mut sums = vec![0_u8; first.len()];
    sums.par_chunks_mut(CHUNK * size)
        .enumerate()
        .for_each(|(chunk, out)| {
            let start = chunk * CHUNK;
            for offset in 0..out.len() / size {
                let index = start + offset;
                let sum = sum_in_rank_order(
                    inputs
                        .iter()
                        .map(|input| to_f32(dtype, element(dtype, input, index))),
                );
                put_element(dtype, out, offset, from_f32(dtype, sum));
            }
        });
    sums
}

/// Why a collective's reference cannot be given for these inputs.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    /// No rank's input was given.
    #[error("the reference of {collective} needs one input per rank; none was given")]
    NoRanks {
        /// The collective.
        collective: Collective,
    },
    /// The collective takes more than every rank's input: the epilogue's residual, weight and
    /// eps ([`reference_epilogue`]).
    #[error("the reference of {collective} takes a residual, a weight and eps beside the inputs")]
    NeedsEpilogue {
        /// The collective.
        collective: Collective,
    },
    /// A rank's input is not as long as the collective takes from it.
    #[error(
        "rank {rank}: {collective} of {rows} x {width} {dtype} on {world} ranks takes \
         {expected} bytes ({what}), but its input holds {bytes}"
    )]
    InputLength {
        /// The collective.
        collective: Collective,
        /// The element type.
        dtype: Dtype,
        /// The rank whose input it is.
        rank: u32,
        /// The full message's rows.
        rows: u64,
        /// Its width.
        width: u64,
        /// Ranks.
        world: u32,
        /// What the rank's input must be (`the whole message`, `its own rows`).
        what: &'static str,
        /// Bytes it must hold.
        expected: u64,
        /// Bytes it holds.
        bytes: u64,
    },
}

/// Every rank's output of `collective` over a message of `shape` of `dtype`, `inputs[r]` being
/// rank r's input (little-endian bytes): for the all-reduce and the reduce-scatter the whole
/// message, for the all-gather that rank's own rows. The all-reduce gives every rank
/// [`reference_sum`]; the reduce-scatter rank r its owned rows of it; the all-gather every rank
/// each rank's rows in rank order, the bytes as given (a NaN's payload included).
pub fn reference_outputs(
    collective: Collective,
    dtype: Dtype,
    shape: Shape,
    inputs: &[&[u8]],
) -> Result<Vec<Vec<u8>>, ReferenceError> {
    if inputs.is_empty() {
        return Err(ReferenceError::NoRanks { collective });
    }
    let world = u32::try_from(inputs.len()).expect("fewer than 2^32 ranks");
    let size = dtype.size_bytes();
    // Byte ranges of the full message: from an element range of it.
    let bytes_of = |elements: std::ops::Range<u64>| {
        (elements.start * size) as usize..(elements.end * size) as usize
    };
    let owned = |rank: u32| {
        shape
            .owned_elements(world, rank)
            .expect("every rank is below the world size")
    };
    let check = |what: &'static str, expected: &dyn Fn(u32) -> u64| {
        for (rank, input) in (0..world).zip(inputs) {
            let expected = expected(rank).saturating_mul(size);
            if input.len() as u64 != expected {
                return Err(ReferenceError::InputLength {
                    collective,
                    dtype,
                    rank,
                    rows: shape.rows(),
                    width: shape.width(),
                    world,
                    what,
                    expected,
                    bytes: input.len() as u64,
                });
            }
        }
        Ok(())
    };
    match collective {
        Collective::AllReduce | Collective::ReduceScatter => {
            check("the whole message", &|_| shape.elements())?;
            let sum = reference_sum(dtype, inputs);
            Ok(if collective == Collective::AllReduce {
                vec![sum; inputs.len()]
            } else {
                (0..world)
                    .map(|rank| sum[bytes_of(owned(rank))].to_vec())
                    .collect()
            })
        }
        Collective::AllGather => {
            check("its own rows", &|rank| {
                let elements = owned(rank);
                elements.end - elements.start
            })?;
            Ok(vec![inputs.concat(); inputs.len()])
        }
        Collective::AllReduceAddRmsNorm => Err(ReferenceError::NeedsEpilogue { collective }),
    }
}

/// The fp32 sum of one element's values in rank order, starting from rank 0's value (not from
/// 0.0, so -0 survives): `acc = x[0]; acc += x[1]; ...`.
fn sum_in_rank_order(mut values: impl Iterator<Item = f32>) -> f32 {
    let first = values
        .next()
        .expect("the reference sum needs at least one rank");
    values.fold(first, |sum, value| sum + value)
}

/// [`reference_sum`] of bf16 inputs given as bits.
///
/// Panics when `inputs` is empty or the ranks' lengths differ.
pub fn reference_sum_bf16(inputs: &[&[u16]]) -> Vec<u16> {
    let bytes: Vec<Vec<u8>> = inputs.iter().map(|input| u16_bytes(input)).collect();
    let views: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
    reference_sum(Dtype::Bf16, &views)
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect()
}

fn u16_bytes(values: &[u16]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|value| value.to_le_bytes())
        .collect()
}

/// Elements per parallel piece of work: large enough to amortise scheduling, small enough to
/// spread a 64 MiB message over every core.
const CHUNK: usize = 1 << 16;

/// A small deterministic generator (SplitMix64): test data needs no cryptographic quality, and
/// a seed makes a failure reproducible.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// The generator that `seed` starts.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
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
    random_elements(Dtype::Bf16, seed, len)
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect()
}

/// The generator of piece `chunk` of the stream `seed`.
fn chunk_generator(seed: u64, chunk: usize) -> SplitMix64 {
    SplitMix64(seed ^ (chunk as u64).wrapping_mul(0xA24B_AED4_963E_E407))
}

/// `len` random elements of `dtype` from `seed`, as little-endian bytes.
pub fn random_elements(dtype: Dtype, seed: u64, len: usize) -> Vec<u8> {
    let size = dtype.size_bytes() as usize;
    let mut bytes = vec![0_u8; len * size];
    // Each piece has its own stream of the seed, so the values do not depend on the threads.
    bytes
        .par_chunks_mut(CHUNK * size)
        .enumerate()
        .for_each(|(chunk, out)| {
            let mut generator = chunk_generator(seed, chunk);
            for offset in 0..out.len() / size {
                put_element(
                    dtype,
                    out,
                    offset,
                    random_value(dtype, generator.next_u64()),
                );
            }
        });
    bytes
}

/// One random element of `dtype` from 64 random bits, with the corners [`random_bf16`]
/// describes, scaled to the type.
fn random_value(dtype: Dtype, draw: u64) -> u32 {
    match dtype {
        Dtype::Bf16 => u32::from(random_half_value(draw, &BF16_DRAW)),
        Dtype::Fp16 => u32::from(random_half_value(draw, &FP16_DRAW)),
        // A bf16 draw with 16 more random mantissa bits; zeros and infinities keep theirs clear.
        Dtype::Fp32 => {
            let high = u32::from(random_half_value(draw, &BF16_DRAW));
            let low = if matches!(high & 0x7FFF, 0 | 0x7F80) {
                0
            } else {
                (draw >> 48) as u32
            };
            (high << 16) | low
        }
    }
}

/// How a random 16-bit float is drawn: its mantissa width, where its exponent's random bits
/// lie in the draw, and the exponent fields of its classes.
struct HalfDraw {
    /// Mantissa bits: 7 for bf16, 10 for fp16.
    mantissa_bits: u32,
    /// The first bit of the draw the exponent is taken from.
    exponent_shift: u32,
    /// The smallest normals, whose differences are subnormal: exponent fields 1 to this.
    smallest: u16,
    /// Near the largest finite value, whose sums overflow: this many fields from the first.
    largest: (u16, u16),
    /// Ordinary magnitudes: this many fields from the first.
    ordinary: (u16, u16),
}

impl HalfDraw {
    /// The fields in their order above.
    const fn new(
        mantissa_bits: u32,
        exponent_shift: u32,
        smallest: u16,
        largest: (u16, u16),
        ordinary: (u16, u16),
    ) -> HalfDraw {
        HalfDraw {
            mantissa_bits,
            exponent_shift,
            smallest,
            largest,
            ordinary,
        }
    }
}

/// bf16: exponent fields 0xF0 to 0xFE up to the largest finite bf16, ordinary ones 112 to 142.
const BF16_DRAW: HalfDraw = HalfDraw::new(7, 24, 8, (0xF0, 15), (112, 31));

/// fp16: exponent fields 27 to 30 up to the largest finite fp16 (65504), ordinary ones 5 to 25
/// (2^-10 to 2^10).
const FP16_DRAW: HalfDraw = HalfDraw::new(10, 32, 4, (27, 4), (5, 21));

fn random_half_value(draw: u64, format: &HalfDraw) -> u16 {
    let bits = format.mantissa_bits;
    let sign = ((draw >> 8) & 1) as u16 * 0x8000;
    let mantissa = ((draw >> 16) & ((1 << bits) - 1)) as u16;
    let exponent_draw = (draw >> format.exponent_shift) as u16;
    let infinity = (0x7FFF >> bits) << bits;
    let normal = |(first, count): (u16, u16)| ((first + exponent_draw % count) << bits) | mantissa;
    let magnitude = match draw & 0xFF {
        // NaN with a nonzero mantissa.
        0 => infinity | mantissa.max(1),
        1 => infinity,
        2..=9 => 0,
        // Subnormal: exponent field 0, nonzero mantissa.
        10..=25 => mantissa.max(1),
        26..=33 => normal((1, format.smallest)),
        34..=49 => normal(format.largest),
        _ => normal(format.ordinary),
    };
    sign | magnitude
}

/// One input of `len` random bf16 values per rank ([`random_bf16`]), each rank from its own
/// stream of `seed`.
pub fn random_inputs(seed: u64, world: usize, len: usize) -> Vec<Vec<u16>> {
    (0..world)
        .map(|rank| random_bf16(rank_stream(seed, rank), len))
        .collect()
}

/// One input of `len` random elements of `dtype` per rank, as bytes, each rank from its own
/// stream of `seed`.
pub fn random_rank_inputs(dtype: Dtype, seed: u64, world: usize, len: usize) -> Vec<Vec<u8>> {
    (0..world)
        .map(|rank| random_elements(dtype, rank_stream(seed, rank), len))
        .collect()
}

/// One rank's share of a checked run: its own input and the reference sum over every rank's,
/// both as little-endian bytes of `dtype`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankDataset {
    /// This rank's input: what [`random_rank_inputs`] gives rank `rank`.
    pub input: Vec<u8>,
    /// [`reference_sum`] of every rank's input.
    pub reference: Vec<u8>,
}

/// Rank `rank`'s input and the reference sum of [`random_rank_inputs`]`(dtype, seed, world,
/// len)`, made piece by piece on every core without holding the other ranks' inputs: the same
/// bytes as generating every input and summing them, in a fraction of the time and memory.
pub fn rank_dataset(dtype: Dtype, seed: u64, world: usize, rank: usize, len: usize) -> RankDataset {
    assert!(
        rank < world,
        "rank {rank} is not below the world size {world}"
    );
    let size = dtype.size_bytes() as usize;
    let streams: Vec<u64> = (0..world).map(|peer| rank_stream(seed, peer)).collect();
    let mut input = vec![0_u8; len * size];
    let mut reference = vec![0_u8; len * size];
    input
        .par_chunks_mut(CHUNK * size)
        .zip(reference.par_chunks_mut(CHUNK * size))
        .enumerate()
        .for_each(|(chunk, (input, reference))| {
            let mut generators: Vec<SplitMix64> = streams
                .iter()
                .map(|&stream| chunk_generator(stream, chunk))
                .collect();
            for offset in 0..input.len() / size {
                let sum = sum_in_rank_order(generators.iter_mut().enumerate().map(
                    |(peer, generator)| {
                        let bits = random_value(dtype, generator.next_u64());
                        if peer == rank {
                            put_element(dtype, input, offset, bits);
                        }
                        to_f32(dtype, bits)
                    },
                ));
                put_element(dtype, reference, offset, from_f32(dtype, sum));
            }
        });
    RankDataset { input, reference }
}

fn rank_stream(seed: u64, rank: usize) -> u64 {
    SplitMix64(seed ^ (rank as u64).wrapping_mul(0xD1B5_4A32_D192_ED03)).next_u64()
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

    fn sum_of(dtype: Dtype, inputs: &[&[u32]]) -> Vec<u32> {
        let bytes: Vec<Vec<u8>> = inputs
            .iter()
            .map(|input| {
                let mut bytes = vec![0; input.len() * dtype.size_bytes() as usize];
                for (index, bits) in input.iter().enumerate() {
                    put_element(dtype, &mut bytes, index, *bits);
                }
                bytes
            })
            .collect();
        let views: Vec<&[u8]> = bytes.iter().map(Vec::as_slice).collect();
        let sum = reference_sum(dtype, &views);
        (0..input_len(inputs))
            .map(|index| element(dtype, &sum, index))
            .collect()
    }

    fn input_len(inputs: &[&[u32]]) -> usize {
        inputs[0].len()
    }

    #[test]
    fn fp16_rounds_once_to_nearest_even_and_keeps_subnormals() {
        let sum = |inputs: &[&[u32]]| sum_of(Dtype::Fp16, inputs);
        // 1 + 2^-11 is halfway between 1 (even) and 1 + 2^-10: down; from 1 + 2^-10: up.
        assert_eq!(sum(&[&[0x3C00], &[0x1000]]), [0x3C00]);
        assert_eq!(sum(&[&[0x3C01], &[0x1000]]), [0x3C02]);
        assert_eq!(sum(&[&[0xBC01], &[0x9000]]), [0xBC02]);
        // Subnormals are kept; the smallest normal minus the smallest subnormal is subnormal.
        assert_eq!(sum(&[&[0x0001], &[0x0001]]), [0x0002]);
        assert_eq!(sum(&[&[0x0400], &[0x8001]]), [0x03FF]);
        // -0 survives; -0 + +0 is +0.
        assert_eq!(sum(&[&[0x8000], &[0x8000]]), [0x8000]);
        assert_eq!(sum(&[&[0x8000], &[0x0000]]), [0x0000]);
        // fp32 sums of fp16s are rounded once: 2^-24 steps that fp32 keeps and fp16 drops.
        assert_eq!(sum(&[&[0x3C00], &[0x0001], &[0x0001]]), [0x3C00]);
    }

    #[test]
    fn fp16_overflow_gives_infinity_and_nan_the_canonical_nan() {
        let sum = |inputs: &[&[u32]]| sum_of(Dtype::Fp16, inputs);
        // 65504 + 16 = 65520 is halfway to 65536 (past the largest): infinity, as IEEE does.
        assert_eq!(sum(&[&[0x7BFF], &[0x4C00]]), [0x7C00]);
        assert_eq!(sum(&[&[0xFBFF], &[0xFBFF]]), [0xFC00]);
        // Just below the halfway point it stays finite.
        assert_eq!(sum(&[&[0x7BFF], &[0x4BFF]]), [0x7BFF]);
        assert_eq!(sum(&[&[0x7E00], &[0x3C00]]), [0x7FFF]);
        assert_eq!(sum(&[&[0x7C00], &[0xFC00]]), [0x7FFF]);
        assert_eq!(canonical_nan(Dtype::Fp16), 0x7FFF);
    }

    #[test]
    fn fp16_bits_survive_the_round_trip_through_fp32() {
        for bits in 0..=u32::from(u16::MAX) {
            let value = to_f32(Dtype::Fp16, bits);
            let expected = if value.is_nan() { 0x7FFF } else { bits };
            assert_eq!(from_f32(Dtype::Fp16, value), expected, "{bits:#06x}");
        }
    }

    #[test]
    fn fp32_is_the_rank_ordered_sum_with_no_rounding_after() {
        let sum = |inputs: &[&[u32]]| sum_of(Dtype::Fp32, inputs);
        let one = 1.0_f32.to_bits();
        let big = 2.0_f32.powi(30).to_bits();
        let minus_big = (-2.0_f32.powi(30)).to_bits();
        assert_eq!(sum(&[&[big], &[minus_big], &[one]]), [one]);
        assert_eq!(sum(&[&[one], &[big], &[minus_big]]), [0]);
        // 1 + 2^-24 ties to 1 in fp32.
        assert_eq!(sum(&[&[one], &[2.0_f32.powi(-24).to_bits()]]), [one]);
        assert_eq!(sum(&[&[0x8000_0000], &[0x8000_0000]]), [0x8000_0000]);
        assert_eq!(sum(&[&[1], &[1]]), [2], "subnormals kept");
        assert_eq!(sum(&[&[0x7F7F_FFFF], &[0x7F7F_FFFF]]), [0x7F80_0000]);
        assert_eq!(sum(&[&[0x7FC0_0001], &[one]]), [0x7FFF_FFFF]);
        assert_eq!(sum(&[&[0xFF80_0000], &[0x7F80_0000]]), [0x7FFF_FFFF]);
    }

    #[test]
    fn a_rank_dataset_is_that_rank_s_input_and_the_reference_sum() {
        for dtype in Dtype::ALL {
            for world in [1, 2, 3, 8] {
                // Over two pieces, the second one partial.
                let len = CHUNK + 1001;
                let inputs = random_rank_inputs(dtype, 77, world, len);
                let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                let expected = reference_sum(dtype, &views);
                for (rank, input) in inputs.iter().enumerate() {
                    let dataset = rank_dataset(dtype, 77, world, rank, len);
                    assert!(
                        dataset.input == *input,
                        "{dtype}, world {world}, rank {rank}"
                    );
                    assert!(
                        dataset.reference == expected,
                        "{dtype}, world {world}, rank {rank}"
                    );
                }
            }
        }
    }

    #[test]
    fn random_data_of_every_type_reaches_its_corners() {
        for dtype in [Dtype::Fp16, Dtype::Fp32] {
            let bytes = random_elements(dtype, 11, 1 << 16);
            let values: Vec<f32> = (0..1 << 16)
                .map(|index| to_f32(dtype, element(dtype, &bytes, index)))
                .collect();
            let count =
                |predicate: &dyn Fn(f32) -> bool| values.iter().filter(|v| predicate(**v)).count();
            assert!(
                count(&|v| v == 0.0 && v.is_sign_negative()) > 0,
                "{dtype}: -0"
            );
            assert!(
                count(
                    &|v| v.is_subnormal() || (dtype == Dtype::Fp16 && v != 0.0 && v.abs() < 6.1e-5)
                ) > 0,
                "{dtype}: subnormal"
            );
            assert!(count(&f32::is_nan) > 0, "{dtype}: NaN");
            assert!(count(&f32::is_infinite) > 0, "{dtype}: infinity");
            assert!(
                count(&|v: f32| v.is_finite() && v.abs() > 30000.0) > 0,
                "{dtype}: large"
            );
            assert_eq!(bytes, random_elements(dtype, 11, 1 << 16));
        }
        let inputs = random_rank_inputs(Dtype::Fp32, 3, 2, 10);
        assert_eq!(inputs[0].len(), 40);
        assert_ne!(inputs[0], inputs[1]);
    }
}
