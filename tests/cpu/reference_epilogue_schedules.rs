//! The epilogue's pinned order of the squares as GPU blocks compute it: a block of 256 threads
//! (one 16-byte vector of 8 lanes each, a warp's shuffles, then the 8 warps), and one warp alone
//! (8 lane groups a thread), emulated step by step on the host, give `sum_of_squares`'s bits
//! for every hidden size from 8 to 16,384 that is a multiple of 8.

use prepare::ladder::Dtype;
use prepare::reference::{random_elements, sum_of_squares, to_f32, NORM_LANES};

const WARP: usize = 32;
/// Lanes a thread holds: one 16-byte vector of bf16 or fp16.
const VECTOR: usize = 8;

/// The three in-thread levels: `((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7))`.
fn vector_tree(lanes: [f32; VECTOR]) -> f32 {
    ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]))
}

/// A warp's `shfl_xor` butterfly, offsets 1, 2, 4, 8, 16: every thread ends with the pairwise
/// tree of the 32 values (each step adds the partner's value to its own).
fn butterfly(mut values: [f32; WARP]) -> f32 {
    for offset in [1, 2, 4, 8, 16] {
        values = std::array::from_fn(|thread| values[thread] + values[thread ^ offset]);
    }
    // Addition is commutative, so every thread holds the same bits.
    assert!(values.iter().all(|v| v.to_bits() == values[0].to_bits()) || values[0].is_nan());
    values[0]
}

/// Pairwise tree of a power-of-two count of values.
fn tree(values: &[f32]) -> f32 {
    let mut values = values.to_vec();
    while values.len() > 1 {
        values = values.chunks(2).map(|pair| pair[0] + pair[1]).collect();
    }
    values[0]
}

/// The squares of lane `lane` (of [`NORM_LANES`]) in order, from +0.
fn lane_sum(row: &[f32], lane: usize) -> f32 {
    row.iter()
        .skip(lane)
        .step_by(NORM_LANES)
        .fold(0.0, |sum, value| sum + value * value)
}

/// 256 threads: thread t holds lanes 8t..8t+7 (step s reads elements 2048 s + 8t + j), sums
/// them in order, then its vector's tree; warp w's butterfly; thread 0 the 8 warps' tree.
fn block_of_256(row: &[f32]) -> f32 {
    let threads = NORM_LANES / VECTOR;
    let per_thread: Vec<f32> = (0..threads)
        .map(|thread| vector_tree(std::array::from_fn(|j| lane_sum(row, VECTOR * thread + j))))
        .collect();
    let warps: Vec<f32> = per_thread
        .chunks(WARP)
        .map(|warp| butterfly(warp.try_into().unwrap()))
        .collect();
    tree(&warps)
}

/// One warp: thread t holds the lane groups t + 32k (k = 0..7, so a step's loads are 256
/// contiguous elements), each summed in order and reduced by its vector's tree; a butterfly
/// per k gives the tree of lanes 256k..256k+255; then each thread the tree of its 8 results.
fn one_warp(row: &[f32]) -> f32 {
    let groups = NORM_LANES / VECTOR / WARP;
    let per_group: Vec<f32> = (0..groups)
        .map(|k| {
            let values: [f32; WARP] = std::array::from_fn(|thread| {
                let group = thread + WARP * k;
                vector_tree(std::array::from_fn(|j| lane_sum(row, VECTOR * group + j)))
            });
            butterfly(values)
        })
        .collect();
    tree(&per_group)
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn a_block_and_a_warp_give_the_pinned_sum_at_every_hidden_size() {
    for dtype in [Dtype::Bf16, Dtype::Fp16] {
        let values: Vec<f32> = {
            let bytes = random_elements(dtype, 31, 16_384);
            (0..16_384)
                .map(|index| {
                    let bits = prepare::reference::element(dtype, &bytes, index);
                    // Ordinary values: specials would make most sums infinite or NaN.
                    let value = to_f32(dtype, bits);
                    if value.is_finite() && value.abs() < 1e4 {
                        value
                    } else {
                        0.5
                    }
                })
                .collect()
        };
        for hidden in (8..=16_384).step_by(8) {
            let row = &values[..hidden];
            let pinned = sum_of_squares(row);
            assert!(
                same(block_of_256(row), pinned),
                "{dtype}, hidden {hidden}: block"
            );
            assert!(
                same(one_warp(row), pinned),
                "{dtype}, hidden {hidden}: warp"
            );
        }
    }
}

#[test]
fn the_schedules_keep_special_values() {
    let mut row = vec![1.5_f32; 4096];
    row[7] = f32::from_bits(1);
    row[2049] = -0.0;
    assert!(same(block_of_256(&row), sum_of_squares(&row)));
    row[3000] = f32::INFINITY;
    assert!(same(block_of_256(&row), f32::INFINITY));
    assert!(same(one_warp(&row), f32::INFINITY));
    row[5] = f32::NAN;
    assert!(block_of_256(&row).is_nan() && one_warp(&row).is_nan());
}
