//! Properties of the reference sum against an independent model: fp32 accumulation in rank
//! order, then rounding to bf16 decided by comparing distances in f64.

use prepare::reference::{
    bf16_to_f32, f32_to_bf16, random_inputs, reference_sum_bf16, CANONICAL_NAN,
};
use proptest::prelude::*;

/// Round to nearest even by comparing the two bf16 neighbours' distances in f64 (exact for
/// these values), with infinity standing for 2^128 as IEEE overflow rounding requires.
fn round_by_distance(value: f32) -> u16 {
    if value.is_nan() {
        return CANONICAL_NAN;
    }
    if value.is_infinite() {
        return (value.to_bits() >> 16) as u16;
    }
    let toward_zero = (value.to_bits() >> 16) as u16;
    let away = toward_zero + 1;
    let magnitude = |bits: u16| -> f64 {
        if bits & 0x7FFF == 0x7F80 {
            2f64.powi(128)
        } else {
            f64::from(bf16_to_f32(bits & 0x7FFF))
        }
    };
    let exact = f64::from(value.abs());
    let below = exact - magnitude(toward_zero);
    let above = magnitude(away) - exact;
    // Exact comparison is the point: a tie is an exact tie.
    #[allow(clippy::float_cmp)]
    let tie = below == above;
    if below < above || (tie && toward_zero & 1 == 0) {
        toward_zero
    } else {
        away
    }
}

fn model_sum(inputs: &[Vec<u16>]) -> Vec<u16> {
    (0..inputs[0].len())
        .map(|element| {
            let mut sum = bf16_to_f32(inputs[0][element]);
            for input in &inputs[1..] {
                sum += bf16_to_f32(input[element]);
            }
            round_by_distance(sum)
        })
        .collect()
}

fn views(inputs: &[Vec<u16>]) -> Vec<&[u16]> {
    inputs.iter().map(Vec::as_slice).collect()
}

proptest! {
    #[test]
    fn rounding_matches_the_distance_model(bits in any::<u32>()) {
        let value = f32::from_bits(bits);
        prop_assert_eq!(f32_to_bf16(value), round_by_distance(value), "{:#010x}", bits);
    }

    #[test]
    fn sums_match_the_model(
        world in 1usize..=8,
        inputs in proptest::collection::vec(proptest::collection::vec(any::<u16>(), 32), 8),
    ) {
        let inputs = &inputs[..world];
        prop_assert_eq!(reference_sum_bf16(&views(inputs)), model_sum(inputs));
    }

    #[test]
    fn random_test_data_sums_match_the_model(seed in any::<u64>(), world in 2usize..=8) {
        let inputs = random_inputs(seed, world, 256);
        prop_assert_eq!(reference_sum_bf16(&views(&inputs)), model_sum(&inputs));
    }

    #[test]
    fn one_rank_gives_its_input_with_nans_made_canonical(input in proptest::collection::vec(any::<u16>(), 64)) {
        let expected: Vec<u16> = input
            .iter()
            .map(|&bits| if bf16_to_f32(bits).is_nan() { CANONICAL_NAN } else { bits })
            .collect();
        prop_assert_eq!(reference_sum_bf16(&[&input]), expected);
    }

    #[test]
    fn two_ranks_commute(a in proptest::collection::vec(any::<u16>(), 64), b in proptest::collection::vec(any::<u16>(), 64)) {
        prop_assert_eq!(reference_sum_bf16(&[&a, &b]), reference_sum_bf16(&[&b, &a]));
    }

    #[test]
    fn negative_zeros_sum_to_negative_zero(world in 1usize..=8, len in 0usize..64) {
        let inputs = vec![vec![0x8000u16; len]; world];
        prop_assert_eq!(reference_sum_bf16(&views(&inputs)), vec![0x8000u16; len]);
    }

    #[test]
    fn subnormals_add_exactly(mantissas in proptest::collection::vec(1u16..16, 1..=8), negative in any::<bool>()) {
        // At most 8 x 15 < 128: the exact sum is still subnormal, so nothing rounds.
        let sign = if negative { 0x8000 } else { 0 };
        let inputs: Vec<Vec<u16>> = mantissas.iter().map(|&m| vec![sign | m]).collect();
        let total: u16 = mantissas.iter().sum();
        prop_assert_eq!(reference_sum_bf16(&views(&inputs)), vec![sign | total]);
    }
}
