//! The reference of the fused all-reduce + residual add + RMSNorm: the bits every candidate of
//! `all_reduce_add_rms_norm`, fused or not, must give on every rank.
//!
//! Every step is an IEEE fp32 operation rounded to nearest even, none fused with another (no
//! FMA), no flush to zero; a NaN result is the type's canonical NaN. For a message of rows x
//! `hidden`:
//!
//! 1. `sum`: the all-reduce's [`reference_sum`] of `x` (fp32 in rank order, rounded once to
//!    the dtype).
//! 2. `residual_out = round(f32(sum) + f32(residual))`, one fp32 addition rounded once to the
//!    dtype; without a residual, `residual_out = sum`.
//! 3. Per row, with `r[i] = f32(residual_out[i])`: lane `l` of [`NORM_LANES`] (2048) sums, from
//!    +0, the squares `r[i] * r[i]` of `i = l, l + 2048, l + 4096, ...` in increasing order
//!    (each square and each addition rounded); then a pairwise tree over the 2048 lanes:
//!    `s[i] = s[2i] + s[2i + 1]` for 1024 pairs, then 512, ..., 1 ([`sum_of_squares`]). A lane
//!    past the row's end is +0, and squares are never -0, so lanes and tree levels a kernel
//!    knows to be empty may be skipped without changing a bit.
//! 4. `inv = 1.0f / sqrtf(ss / (float)hidden + eps)`: a division, an addition, a correctly
//!    rounded square root and a division ([`inverse_rms`]).
//! 5. `normed[i] = round((r[i] * inv) * f32(weight[i]))`: two multiplications, rounded once to
//!    the dtype.
//!
//! The order depends on `hidden` alone, never on rows, blocks or threads, so a row's outputs
//! depend only on that row's inputs. Kernels implement it compiled with `--fmad=false
//! --prec-div=true --prec-sqrt=true --ftz=false` (`prepare::compile`), and with explicitly
//! rounded `.rn` operations, which no compiler contracts into an FMA.

use rayon::prelude::*;

use super::{from_f32, to_f32, ReferenceError};
pub use crate::abi::NORM_LANES;
use crate::ladder::{Collective, Dtype};
use crate::shape::Shape;

/// The epilogue's operands beside every rank's `x`, as little-endian bytes of the dtype.
#[derive(Debug, Clone, Copy)]
pub struct EpilogueInputs<'a> {
    /// rows x hidden, added to the sum; `None` for all-reduce then RMSNorm (a first layer).
    pub residual: Option<&'a [u8]>,
    /// `hidden` elements: RMSNorm's weight.
    pub weight: &'a [u8],
    /// Added to the mean of squares: 0 or more.
    pub eps: f32,
}

/// One rank's outputs of the epilogue, little-endian bytes of the dtype, rows x hidden each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpilogueOutputs {
    /// RMSNorm of `residual_out` times the weight.
    pub normed: Vec<u8>,
    /// The sum plus the residual (what the residual is overwritten with).
    pub residual_out: Vec<u8>,
}

/// Why the epilogue's reference cannot be given for these operands.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EpilogueError {
    /// The ranks' `x` do not fit the message.
    #[error(transparent)]
    Sum(#[from] ReferenceError),
    /// The weight is not `hidden` elements.
    #[error(
        "the weight holds {bytes} bytes, but RMSNorm over a hidden size of {hidden} {dtype} \
         takes {expected} ({hidden} elements)"
    )]
    WeightLength {
        /// The element type.
        dtype: Dtype,
        /// The hidden size (the message's width).
        hidden: u64,
        /// Bytes it must hold.
        expected: u64,
        /// Bytes it holds.
        bytes: u64,
    },
    /// The residual is not rows x hidden elements.
    #[error(
        "the residual holds {bytes} bytes, but a message of {rows} x {hidden} {dtype} takes \
         {expected}"
    )]
    ResidualLength {
        /// The element type.
        dtype: Dtype,
        /// The message's rows.
        rows: u64,
        /// The hidden size.
        hidden: u64,
        /// Bytes it must hold.
        expected: u64,
        /// Bytes it holds.
        bytes: u64,
    },
    /// eps is negative or NaN.
    #[error("eps is {eps}; it must be 0 or more (not negative, not NaN)")]
    Eps {
        /// The eps given.
        eps: f32,
    },
    /// The hidden size is not an f32 exactly, so `ss / hidden` would not be the division the
    /// kernels do.
    #[error("a hidden size of {hidden} is above 2^24, the largest an f32 holds exactly")]
    HiddenTooLarge {
        /// The hidden size.
        hidden: u64,
    },
}

/// The largest hidden size whose conversion to f32 is exact.
const MAX_HIDDEN: u64 = 1 << 24;

/// A row's sum of squares in the pinned order: lane `l` of [`NORM_LANES`] sums, from +0,
/// `r[l]^2, r[l + NORM_LANES]^2, ...` in increasing order; then the pairwise tree
/// `s[i] = s[2i] + s[2i + 1]` over 1024 pairs, 512, ..., 1. Every square and addition is
/// rounded to fp32 on its own (no FMA).
pub fn sum_of_squares(row: &[f32]) -> f32 {
    let mut lanes = [0.0_f32; NORM_LANES];
    for (index, &value) in row.iter().enumerate() {
        let square = value * value;
        lanes[index % NORM_LANES] += square;
    }
    let mut width = NORM_LANES;
    while width > 1 {
        width /= 2;
        for lane in 0..width {
            lanes[lane] = lanes[2 * lane] + lanes[2 * lane + 1];
        }
    }
    lanes[0]
}

/// `1.0f / sqrtf(sum_of_squares / (float)hidden + eps)`, each operation rounded on its own.
/// `hidden` must be at most 2^24 (exact as an f32).
pub fn inverse_rms(sum_of_squares: f32, hidden: u64, eps: f32) -> f32 {
    debug_assert!(hidden <= MAX_HIDDEN, "hidden {hidden} is not an exact f32");
    #[allow(clippy::cast_precision_loss)] // exact up to 2^24, which the callers check
    let hidden = hidden as f32;
    let mean = sum_of_squares / hidden;
    1.0 / (mean + eps).sqrt()
}

/// Every rank's outputs of `all_reduce_add_rms_norm` over a message of `shape` (rows x
/// hidden) of `dtype`, `inputs[r]` being rank r's `x`: the same [`EpilogueOutputs`] on every
/// rank, [`reference_add_rms_norm`] of the all-reduce's [`reference_sum`].
pub fn reference_epilogue(
    dtype: Dtype,
    shape: Shape,
    inputs: &[&[u8]],
    epilogue: &EpilogueInputs<'_>,
) -> Result<Vec<EpilogueOutputs>, EpilogueError> {
    // The all-reduce's checks of the ranks' inputs, and its sum.
    let sums = super::reference_outputs(Collective::AllReduce, dtype, shape, inputs)?;
    let outputs = reference_add_rms_norm(dtype, shape, &sums[0], epilogue)?;
    Ok(vec![outputs; inputs.len()])
}

/// The epilogue after the sum: residual add and RMSNorm of `sum`, the all-reduce's output
/// (rows x hidden of `dtype`), as prepare's unfused add + RMSNorm kernel gives it.
pub fn reference_add_rms_norm(
    dtype: Dtype,
    shape: Shape,
    sum: &[u8],
    epilogue: &EpilogueInputs<'_>,
) -> Result<EpilogueOutputs, EpilogueError> {
    let size = dtype.size_bytes();
    let hidden = shape.width();
    let expected = shape.elements().saturating_mul(size);
    if sum.len() as u64 != expected {
        return Err(ReferenceError::InputLength {
            collective: Collective::AllReduceAddRmsNorm,
            dtype,
            rank: 0,
            rows: shape.rows(),
            width: hidden,
            world: 1,
            what: "the whole message",
            expected,
            bytes: sum.len() as u64,
        }
        .into());
    }
    if hidden > MAX_HIDDEN {
        return Err(EpilogueError::HiddenTooLarge { hidden });
    }
    if epilogue.weight.len() as u64 != hidden * size {
        return Err(EpilogueError::WeightLength {
            dtype,
            hidden,
            expected: hidden * size,
            bytes: epilogue.weight.len() as u64,
        });
    }
    if let Some(residual) = epilogue.residual {
        if residual.len() as u64 != expected {
            return Err(EpilogueError::ResidualLength {
                dtype,
                rows: shape.rows(),
                hidden,
                expected,
                bytes: residual.len() as u64,
            });
        }
    }
    if epilogue.eps.is_nan() || epilogue.eps < 0.0 {
        return Err(EpilogueError::Eps { eps: epilogue.eps });
    }
    let residual_out = match epilogue.residual {
        None => sum.to_vec(),
        Some(residual) => {
            let mut out = vec![0_u8; sum.len()];
            out.par_chunks_mut(ROW_CHUNK_BYTES)
                .enumerate()
                .for_each(|(chunk, out)| {
                    let start = chunk * ROW_CHUNK_BYTES / size as usize;
                    for offset in 0..out.len() / size as usize {
                        let index = start + offset;
                        let value = to_f32(dtype, super::element(dtype, sum, index))
                            + to_f32(dtype, super::element(dtype, residual, index));
                        super::put_element(dtype, out, offset, from_f32(dtype, value));
                    }
                });
            out
        }
    };
    let weight: Vec<f32> = (0..hidden as usize)
        .map(|index| to_f32(dtype, super::element(dtype, epilogue.weight, index)))
        .collect();
    let row_bytes = (hidden * size) as usize;
    let mut normed = vec![0_u8; residual_out.len()];
    normed
        .par_chunks_mut(row_bytes)
        .zip(residual_out.par_chunks(row_bytes))
        .for_each(|(out, row)| {
            let values: Vec<f32> = (0..hidden as usize)
                .map(|index| to_f32(dtype, super::element(dtype, row, index)))
                .collect();
            let inv = inverse_rms(sum_of_squares(&values), hidden, epilogue.eps);
            for (index, (&value, &weight)) in values.iter().zip(&weight).enumerate() {
                super::put_element(dtype, out, index, from_f32(dtype, (value * inv) * weight));
            }
        });
    Ok(EpilogueOutputs {
        normed,
        residual_out,
    })
}

/// Bytes per parallel piece of the residual add (a multiple of every element size).
const ROW_CHUNK_BYTES: usize = 1 << 18;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_pairs_neighbouring_lanes_first() {
        // Lane 0 holds 2^24, lanes 1..8 hold 1 each: (2^24 + 1) ties to 2^24, then the other
        // pairs' 2 + 4 survive; a left-to-right sum would lose every 1.
        let mut row = vec![1.0_f32; 8];
        row[0] = 4096.0;
        assert_eq!(sum_of_squares(&row).to_bits(), 16_777_222.0_f32.to_bits());
        // Element 2048 shares lane 0 with element 0 and is lost in it (a tie to 2^24) before
        // the tree adds lanes 2 and 3: 2^24 + 2. A tree over the elements would keep it
        // for last, 2^24 + 3, a tie that goes to 2^24 + 4.
        let mut row = vec![0.0_f32; NORM_LANES + 1];
        row[0] = 4096.0;
        row[2] = 1.0;
        row[3] = 1.0;
        row[NORM_LANES] = 1.0;
        assert_eq!(sum_of_squares(&row).to_bits(), 16_777_218.0_f32.to_bits());
    }

    #[test]
    fn the_inverse_is_a_correctly_rounded_square_root_then_a_division() {
        assert_eq!(inverse_rms(4.0, 1, 0.0).to_bits(), 0.5_f32.to_bits());
        assert_eq!(inverse_rms(0.0, 8, 0.0).to_bits(), f32::INFINITY.to_bits());
        assert_eq!(
            inverse_rms(f32::INFINITY, 8, 1e-6).to_bits(),
            0.0_f32.to_bits()
        );
    }
}
