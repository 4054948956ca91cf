//! The fused all-reduce + residual add + RMSNorm reference: hand-checked rows, special values
//! as IEEE gives them, the pinned order of the squares, batch invariance, planted mutations
//! the test data catches, closeness to an f64 RMSNorm, and bad operands refused by name.

use prepare::ladder::{Collective, Dtype};
use prepare::reference::{
    element, from_f32, inverse_rms, random_elements, random_rank_inputs, reference_add_rms_norm,
    reference_epilogue, reference_outputs, reference_sum, sum_of_squares, to_f32, EpilogueError,
    EpilogueInputs, EpilogueOutputs, ReferenceError, SplitMix64, NORM_LANES,
};
use prepare::shape::Shape;

fn bytes_of(dtype: Dtype, bits: &[u32]) -> Vec<u8> {
    let size = dtype.size_bytes() as usize;
    bits.iter()
        .flat_map(|bits| bits.to_le_bytes()[..size].to_vec())
        .collect()
}

fn bits_of(dtype: Dtype, bytes: &[u8]) -> Vec<u32> {
    (0..bytes.len() / dtype.size_bytes() as usize)
        .map(|index| element(dtype, bytes, index))
        .collect()
}

fn values_to_bytes(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    let bits: Vec<u32> = values.iter().map(|&value| from_f32(dtype, value)).collect();
    bytes_of(dtype, &bits)
}

fn views(inputs: &[Vec<u8>]) -> Vec<&[u8]> {
    inputs.iter().map(Vec::as_slice).collect()
}

/// The reference on one rank whose `x` is `row` (so the sum is `row`), bf16 bits out.
fn one_rank(
    dtype: Dtype,
    x: &[f32],
    residual: Option<&[f32]>,
    weight: &[f32],
    eps: f32,
) -> (Vec<u32>, Vec<u32>) {
    let shape = Shape::new(1, x.len() as u64).unwrap();
    let x = values_to_bytes(dtype, x);
    let residual = residual.map(|residual| values_to_bytes(dtype, residual));
    let weight = values_to_bytes(dtype, weight);
    let epilogue = EpilogueInputs {
        residual: residual.as_deref(),
        weight: &weight,
        eps,
    };
    let outputs = reference_epilogue(dtype, shape, &[&x], &epilogue).unwrap();
    (
        bits_of(dtype, &outputs[0].normed),
        bits_of(dtype, &outputs[0].residual_out),
    )
}

#[test]
fn a_row_of_zeros_gives_zeros_with_eps_and_nan_without() {
    let weight = [1.0_f32; 8];
    for dtype in Dtype::ALL {
        let (normed, residual_out) = one_rank(dtype, &[0.0; 8], None, &weight, 1e-6);
        assert_eq!(normed, [0; 8], "{dtype}");
        assert_eq!(residual_out, [0; 8], "{dtype}");
        // -0 rows keep their sign: -0 * inv * 1 is -0.
        let (normed, _) = one_rank(dtype, &[-0.0; 8], None, &weight, 1e-6);
        let negative_zero = from_f32(dtype, -0.0);
        assert_eq!(normed, [negative_zero; 8], "{dtype}");
        // eps 0: 1 / sqrt(0) is +inf and 0 * inf is NaN, as IEEE says.
        let nan = prepare::reference::canonical_nan(dtype);
        let (normed, _) = one_rank(dtype, &[0.0; 8], None, &weight, 0.0);
        assert_eq!(normed, [nan; 8], "{dtype}");
    }
}

#[test]
fn special_values_propagate_as_ieee_says() {
    let dtype = Dtype::Bf16;
    let nan = prepare::reference::canonical_nan(dtype);
    let weight = [1.0, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0, 1.0];
    let row = [1.0, -0.0, -0.0, 2.0, 0.0, 0.0, 0.0, 0.0];
    // ss = 5, mean 0.625, inv = 1/sqrt(0.625) = 1.2649111 -> bf16 0x3FA2 (1.265625); -0
    // times a positive weight stays -0, times a negative one is +0.
    let (normed, _) = one_rank(dtype, &row, None, &weight, 0.0);
    assert_eq!(normed[..4], [0x3FA2, 0x8000, 0x0000, 0x4022]);
    // A NaN makes the sum of squares NaN: the whole row is NaN; residual_out only there.
    let mut with_nan = row;
    with_nan[5] = f32::NAN;
    let (normed, residual_out) = one_rank(dtype, &with_nan, None, &weight, 1e-6);
    assert_eq!(normed, [nan; 8]);
    assert_eq!(residual_out[5], nan);
    assert_eq!(residual_out[0], 0x3F80);
    // An infinity makes the sum +inf and inv 0: finite elements become zeros of their sign,
    // the infinity inf * 0 = NaN.
    for infinity in [f32::INFINITY, f32::NEG_INFINITY] {
        let mut with_infinity = row;
        with_infinity[7] = infinity;
        let (normed, _) = one_rank(dtype, &with_infinity, None, &weight, 1e-6);
        assert_eq!(
            normed,
            [0x0000, 0x8000, 0x0000, 0x0000, 0, 0, 0, nan],
            "{infinity}"
        );
    }
    // Subnormals are kept, not flushed: the smallest bf16 subnormal (2^-133) squares to 0 in
    // fp32, then times inv = 2.8284271 (row 1, 2^-133, 0, ...: ss 1, mean 1/8) is 2.83 units
    // of 2^-133, which rounds to 3 units; 1.0 becomes 2.828125 (0x4035).
    let mut subnormal = [0.0_f32; 8];
    subnormal[0] = 1.0;
    subnormal[1] = f32::from_bits(0x0001_0000);
    let (normed, _) = one_rank(dtype, &subnormal, None, &[1.0; 8], 0.0);
    assert_eq!(normed[..3], [0x4035, 0x0003, 0x0000]);
    // fp32 keeps the subnormal product exactly as fp32 rounds it.
    let tiny = f32::from_bits(1 << 16);
    let (normed, _) = one_rank(Dtype::Fp32, &subnormal, None, &[1.0; 8], 0.0);
    let inv = 1.0_f32 / (1.0_f32 / 8.0).sqrt();
    assert_eq!(normed[1], (tiny * inv).to_bits());
    assert!(f32::from_bits(normed[1]).is_subnormal());
    // A residual of -0 added to a sum of -0 stays -0; to +0 it is +0.
    let (_, residual_out) = one_rank(dtype, &[-0.0; 8], Some(&[-0.0; 8]), &[1.0; 8], 1e-6);
    assert_eq!(residual_out, [0x8000; 8]);
    let (_, residual_out) = one_rank(dtype, &[-0.0; 8], Some(&[0.0; 8]), &[1.0; 8], 1e-6);
    assert_eq!(residual_out, [0x0000; 8]);
}

/// Squares summed left to right in fp32: the order the reference does not use.
fn left_to_right(row: &[f32]) -> f32 {
    row.iter().fold(0.0, |sum, value| sum + value * value)
}

#[test]
fn the_order_of_the_squares_is_pinned() {
    // bf16 4096 (squared 2^24) then 2047 ones: left to right every 1 ties away into 2^24;
    // the pinned tree adds the ones to each other first and keeps 2046 of them (lane 0 and
    // lane 1 meet 2^24 first and the tie loses that 1).
    let hidden = 2048;
    let mut row = vec![1.0_f32; hidden];
    row[0] = 4096.0;
    assert_eq!(left_to_right(&row).to_bits(), 16_777_216.0_f32.to_bits());
    assert_eq!(sum_of_squares(&row).to_bits(), 16_779_262.0_f32.to_bits());
    // So the outputs differ: weights across every bf16 mantissa of [1, 2) meet both roundings.
    let weight: Vec<f32> = (0..hidden)
        .map(|index| to_f32(Dtype::Bf16, 0x3F80 + (index as u32 % 128)))
        .collect();
    let (normed, _) = one_rank(Dtype::Bf16, &row, None, &weight, 0.0);
    // inv = 1/sqrt(16779262 / 2048) = 1/sqrt(8192.999) = 0.011048...; 4096 * inv = 45.2522 ->
    // bf16 45.25 (0x4235).
    assert_eq!(normed[0], 0x4235);
    let other_inv = inverse_rms(left_to_right(&row), hidden as u64, 0.0);
    let other: Vec<u32> = row
        .iter()
        .zip(&weight)
        .map(|(&value, &weight)| from_f32(Dtype::Bf16, (value * other_inv) * weight))
        .collect();
    assert_ne!(
        normed, other,
        "the left-to-right order gives the same bf16 outputs"
    );
}

#[test]
fn a_row_s_outputs_do_not_depend_on_the_other_rows_or_their_number() {
    for dtype in Dtype::ALL {
        let hidden = 264_usize;
        let world = 3;
        let rows = 9_usize;
        let elements = rows * hidden;
        let inputs = random_rank_inputs(dtype, 5, world, elements);
        let residual = random_elements(dtype, 6, elements);
        let weight = random_elements(dtype, 7, hidden);
        let size = dtype.size_bytes() as usize;
        let all = reference_epilogue(
            dtype,
            Shape::new(rows as u64, hidden as u64).unwrap(),
            &views(&inputs),
            &EpilogueInputs {
                residual: Some(&residual),
                weight: &weight,
                eps: 1e-5,
            },
        )
        .unwrap();
        let row_bytes = hidden * size;
        for row in 0..rows {
            // The row alone, and the row among other random rows at another position.
            let alone: Vec<Vec<u8>> = inputs
                .iter()
                .map(|input| input[row * row_bytes..][..row_bytes].to_vec())
                .collect();
            let shape = Shape::new(1, hidden as u64).unwrap();
            let single = reference_epilogue(
                dtype,
                shape,
                &views(&alone),
                &EpilogueInputs {
                    residual: Some(&residual[row * row_bytes..][..row_bytes]),
                    weight: &weight,
                    eps: 1e-5,
                },
            )
            .unwrap();
            let others = random_rank_inputs(dtype, 100 + row as u64, world, 2 * hidden);
            let among: Vec<Vec<u8>> = others
                .iter()
                .zip(&alone)
                .map(|(other, mine)| [&other[..row_bytes], mine, &other[row_bytes..]].concat())
                .collect();
            let other_residual = random_elements(dtype, 200 + row as u64, 2 * hidden);
            let residual_among = [
                &other_residual[..row_bytes],
                &residual[row * row_bytes..][..row_bytes],
                &other_residual[row_bytes..],
            ]
            .concat();
            let mixed = reference_epilogue(
                dtype,
                Shape::new(3, hidden as u64).unwrap(),
                &views(&among),
                &EpilogueInputs {
                    residual: Some(&residual_among),
                    weight: &weight,
                    eps: 1e-5,
                },
            )
            .unwrap();
            let expected = |outputs: &EpilogueOutputs, at: usize| {
                (
                    outputs.normed[at * row_bytes..][..row_bytes].to_vec(),
                    outputs.residual_out[at * row_bytes..][..row_bytes].to_vec(),
                )
            };
            assert_eq!(expected(&all[0], row), expected(&single[0], 0), "{dtype}");
            assert_eq!(expected(&all[0], row), expected(&mixed[0], 1), "{dtype}");
        }
    }
}

/// A planted bug of an epilogue kernel, as the test data must catch it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mutation {
    /// None: the reference itself, written again.
    Faithful,
    /// The squares summed left to right.
    SquaresLeftToRight,
    /// The squares in 256 lanes (a warp's vectors) instead of the pinned lanes.
    SquaresIn256Lanes,
    /// eps left out.
    NoEps,
    /// The residual added to the fp32 sum before it is rounded to the dtype.
    ResidualBeforeRounding,
    /// The weight's last element skipped (that element not multiplied by it).
    WeightSkipped,
}

/// The squares in `lanes` lanes, each from +0 in increasing order, then the pairwise tree.
fn squares_in_lanes(row: &[f32], lanes: usize) -> f32 {
    let mut sums = vec![0.0_f32; lanes];
    for (index, value) in row.iter().enumerate() {
        sums[index % lanes] += value * value;
    }
    while sums.len() > 1 {
        sums = sums.chunks(2).map(|pair| pair[0] + pair[1]).collect();
    }
    sums[0]
}

/// An independent model of the epilogue, with `mutation` planted.
fn model(
    mutation: Mutation,
    dtype: Dtype,
    hidden: usize,
    inputs: &[&[u8]],
    residual: &[u8],
    weight: &[u8],
    eps: f32,
) -> EpilogueOutputs {
    let size = dtype.size_bytes() as usize;
    let elements = inputs[0].len() / size;
    let value = |bytes: &[u8], index: usize| to_f32(dtype, element(dtype, bytes, index));
    let residual_out: Vec<u32> = (0..elements)
        .map(|index| {
            let mut sum = value(inputs[0], index);
            for input in &inputs[1..] {
                sum += value(input, index);
            }
            let residual = value(residual, index);
            if mutation == Mutation::ResidualBeforeRounding {
                from_f32(dtype, sum + residual)
            } else {
                from_f32(dtype, to_f32(dtype, from_f32(dtype, sum)) + residual)
            }
        })
        .collect();
    let mut normed = Vec::with_capacity(elements);
    for row in residual_out.chunks(hidden) {
        let row: Vec<f32> = row.iter().map(|&bits| to_f32(dtype, bits)).collect();
        let squares = match mutation {
            Mutation::SquaresLeftToRight => left_to_right(&row),
            Mutation::SquaresIn256Lanes => squares_in_lanes(&row, 256),
            _ => squares_in_lanes(&row, NORM_LANES),
        };
        let eps = if mutation == Mutation::NoEps {
            0.0
        } else {
            eps
        };
        let inv = 1.0 / (squares / hidden as f32 + eps).sqrt();
        for (index, r) in row.iter().enumerate() {
            let scaled = r * inv;
            let out = if mutation == Mutation::WeightSkipped && index == hidden - 1 {
                scaled
            } else {
                scaled * value(weight, index)
            };
            normed.push(from_f32(dtype, out));
        }
    }
    EpilogueOutputs {
        normed: bytes_of(dtype, &normed),
        residual_out: bytes_of(dtype, &residual_out),
    }
}

/// Ordinary values drawn from the reference's generator.
struct Draws(SplitMix64);

impl Draws {
    fn new(seed: u64) -> Draws {
        Draws(SplitMix64::new(seed))
    }

    fn next(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [-scale, scale).
    fn uniform(&mut self, scale: f32) -> f32 {
        let unit = (self.next() >> 40) as f32 / (1_u64 << 24) as f32;
        (2.0 * unit - 1.0) * scale
    }

    /// Uniform in [-scale, scale) times 2^-6 to 2^6, so a row's squares span 2^24 and their
    /// sums round at almost every step.
    fn spread(&mut self, scale: f32) -> f32 {
        let exponent = (self.next() % 13) as i32 - 6;
        self.uniform(scale) * 2.0_f32.powi(exponent)
    }
}

/// Test data of `rows` x `hidden` on `world` ranks: a row of zeros, two rows of random bits
/// with every special value ([`random_rank_inputs`]), the rest ordinary values of magnitudes
/// 2^-12 to 2^4 (small rows are where eps matters); residual alike; weights around 1.
fn mixed_data(
    dtype: Dtype,
    seed: u64,
    world: usize,
    rows: usize,
    hidden: usize,
) -> (Vec<Vec<u8>>, Vec<u8>, Vec<u8>) {
    let size = dtype.size_bytes() as usize;
    let special = random_rank_inputs(dtype, seed, world + 1, 2 * hidden);
    let mut draws = Draws::new(seed);
    let mut ranks = vec![Vec::new(); world + 1];
    for row in 0..rows {
        let scale = 2.0_f32.powi(i32::try_from(row % 17).unwrap() - 12);
        for (rank, out) in ranks.iter_mut().enumerate() {
            match row {
                0 => out.extend(vec![0_u8; hidden * size]),
                1 | 2 => out.extend(&special[rank][(row - 1) * hidden * size..][..hidden * size]),
                _ => {
                    let values: Vec<f32> = (0..hidden).map(|_| draws.spread(scale)).collect();
                    out.extend(values_to_bytes(dtype, &values));
                }
            }
        }
    }
    let residual = ranks.pop().unwrap();
    let weight: Vec<f32> = (0..hidden).map(|_| 1.0 + draws.uniform(0.5)).collect();
    (ranks, residual, values_to_bytes(dtype, &weight))
}

#[test]
fn planted_mutations_each_change_some_output_of_the_test_data() {
    let mutations = [
        Mutation::SquaresLeftToRight,
        Mutation::SquaresIn256Lanes,
        Mutation::NoEps,
        Mutation::ResidualBeforeRounding,
        Mutation::WeightSkipped,
    ];
    for dtype in Dtype::ALL {
        // Another order of the squares moves `inv` by a few fp32 ulps, which a 16-bit output
        // shows only now and then: the data set of a dtype is every shape's data together.
        let mut caught = Vec::new();
        for (world, hidden) in [(2, 8), (3, 264), (4, NORM_LANES + 64), (8, 7168)] {
            let rows = if hidden > 1000 { 16 } else { 24 };
            let (inputs, residual, weight) = mixed_data(dtype, hidden as u64, world, rows, hidden);
            let inputs = views(&inputs);
            let shape = Shape::new(rows as u64, hidden as u64).unwrap();
            let eps = 1e-5;
            let reference = reference_epilogue(
                dtype,
                shape,
                &inputs,
                &EpilogueInputs {
                    residual: Some(&residual),
                    weight: &weight,
                    eps,
                },
            )
            .unwrap();
            let what = format!("{dtype}, {world} ranks, hidden {hidden}");
            assert_eq!(reference.len(), world, "{what}");
            assert!(reference.iter().all(|o| *o == reference[0]), "{what}");
            let run = |mutation| model(mutation, dtype, hidden, &inputs, &residual, &weight, eps);
            assert!(run(Mutation::Faithful) == reference[0], "{what}: the model");
            for mutation in mutations {
                if run(mutation) != reference[0] {
                    caught.push(mutation);
                }
            }
            // eps and the weight show in every shape's outputs.
            assert!(caught.contains(&Mutation::NoEps), "{what}");
            assert!(caught.contains(&Mutation::WeightSkipped), "{what}");
        }
        for mutation in mutations {
            // The fp32 sum is not rounded, so adding the residual before or after is the same.
            if mutation == Mutation::ResidualBeforeRounding && dtype == Dtype::Fp32 {
                assert!(!caught.contains(&mutation));
                continue;
            }
            assert!(
                caught.contains(&mutation),
                "{dtype}: {mutation:?} gives the reference's bits on all the test data; caught {caught:?}"
            );
        }
    }
}

#[test]
fn the_fp32_formulas_are_near_an_f64_rms_norm() {
    for dtype in Dtype::ALL {
        for hidden in [8, 264, NORM_LANES + 64, 16_384] {
            let rows = 4;
            let mut draws = Draws::new(hidden as u64);
            let values: Vec<f32> = (0..rows * hidden).map(|_| draws.uniform(4.0)).collect();
            let x = values_to_bytes(dtype, &values);
            let weight: Vec<f32> = (0..hidden).map(|_| 1.0 + draws.uniform(0.5)).collect();
            let weight = values_to_bytes(dtype, &weight);
            let eps = 1e-6;
            let shape = Shape::new(rows as u64, hidden as u64).unwrap();
            let epilogue = EpilogueInputs {
                residual: None,
                weight: &weight,
                eps,
            };
            let out = reference_add_rms_norm(dtype, shape, &x, &epilogue).unwrap();
            // Without a residual, residual_out is the sum as given.
            assert_eq!(out.residual_out, x);
            let r = bits_of(dtype, &x);
            let w = bits_of(dtype, &weight);
            let normed = bits_of(dtype, &out.normed);
            // One rounding to the dtype, plus a few fp32 ulps from the sum and the inverse.
            let ulp = match dtype {
                Dtype::Bf16 => 2.0_f64.powi(-8),
                Dtype::Fp16 => 2.0_f64.powi(-11),
                Dtype::Fp32 => 0.0,
            };
            for row in 0..rows {
                let r: Vec<f64> = r[row * hidden..][..hidden]
                    .iter()
                    .map(|&bits| f64::from(to_f32(dtype, bits)))
                    .collect();
                let squares: f64 = r.iter().map(|v| v * v).sum();
                let row_f32: Vec<f32> = r.iter().map(|&v| v as f32).collect();
                let got = f64::from(sum_of_squares(&row_f32));
                assert!(
                    (got - squares).abs() <= 1e-5 * squares,
                    "{dtype}, hidden {hidden}: {got} against {squares}"
                );
                let inv = 1.0 / (squares / hidden as f64 + f64::from(eps)).sqrt();
                for index in 0..hidden {
                    let exact = r[index] * inv * f64::from(to_f32(dtype, w[index]));
                    let got = f64::from(to_f32(dtype, normed[row * hidden + index]));
                    assert!(
                        (got - exact).abs() <= (ulp + 1e-5) * exact.abs() + 1e-7,
                        "{dtype}, hidden {hidden}, row {row}, element {index}: {got} against \
                         {exact}"
                    );
                }
            }
        }
    }
}

#[test]
fn bad_operands_are_refused_naming_what_is_wrong() {
    let dtype = Dtype::Bf16;
    let shape = Shape::new(2, 8).unwrap();
    let x = vec![0_u8; 32];
    let weight = vec![0_u8; 16];
    let residual = vec![0_u8; 32];
    let run = |inputs: &[&[u8]], residual: Option<&[u8]>, weight: &[u8], eps: f32| {
        reference_epilogue(
            dtype,
            shape,
            inputs,
            &EpilogueInputs {
                residual,
                weight,
                eps,
            },
        )
        .unwrap_err()
    };
    let error = run(&[&x], Some(&residual), &weight[..14], 1e-6);
    assert!(matches!(error, EpilogueError::WeightLength { .. }));
    assert_eq!(
        error.to_string(),
        "the weight holds 14 bytes, but RMSNorm over a hidden size of 8 bf16 takes 16 \
         (8 elements)"
    );
    let error = run(&[&x], Some(&residual[..30]), &weight, 1e-6);
    assert_eq!(
        error.to_string(),
        "the residual holds 30 bytes, but a message of 2 x 8 bf16 takes 32"
    );
    for eps in [-1e-6, f32::NAN, f32::NEG_INFINITY] {
        let error = run(&[&x], Some(&residual), &weight, eps);
        assert!(
            matches!(error, EpilogueError::Eps { eps: got } if got.to_bits() == eps.to_bits()),
            "{error}"
        );
        assert!(error.to_string().starts_with("eps is "), "{error}");
    }
    // -0 and 0 are not negative.
    for eps in [0.0, -0.0] {
        let ok = reference_epilogue(
            dtype,
            shape,
            &[&x],
            &EpilogueInputs {
                residual: None,
                weight: &weight,
                eps,
            },
        );
        assert!(ok.is_ok(), "eps {eps}");
    }
    let error = run(&[&x, &x[..30]], None, &weight, 1e-6);
    assert!(
        matches!(
            error,
            EpilogueError::Sum(ReferenceError::InputLength { rank: 1, .. })
        ),
        "{error}"
    );
    // A hidden size of 0 is no shape at all.
    assert!(Shape::new(2, 0).is_err());
    let wide = Shape::new(0, (1 << 24) + 8).unwrap();
    let error = reference_add_rms_norm(
        dtype,
        wide,
        &[],
        &EpilogueInputs {
            residual: None,
            weight: &[],
            eps: 0.0,
        },
    )
    .unwrap_err();
    assert_eq!(
        error.to_string(),
        "a hidden size of 16777224 is above 2^24, the largest an f32 holds exactly"
    );
    // The per-collective reference names the operands it lacks.
    let error =
        reference_outputs(Collective::AllReduceAddRmsNorm, dtype, shape, &[&x]).unwrap_err();
    assert_eq!(
        error.to_string(),
        "the reference of all_reduce_add_rms_norm takes a residual, a weight and eps beside \
         the inputs"
    );
}

#[test]
fn without_a_residual_residual_out_is_the_all_reduce_s_sum() {
    let dtype = Dtype::Fp16;
    let hidden = 64;
    let inputs = random_rank_inputs(dtype, 9, 4, 3 * hidden);
    let weight = random_elements(dtype, 10, hidden);
    let shape = Shape::new(3, hidden as u64).unwrap();
    let outputs = reference_epilogue(
        dtype,
        shape,
        &views(&inputs),
        &EpilogueInputs {
            residual: None,
            weight: &weight,
            eps: 1e-5,
        },
    )
    .unwrap();
    let sum = reference_sum(dtype, &views(&inputs));
    assert_eq!(outputs.len(), 4);
    for output in &outputs {
        assert!(output.residual_out == sum);
        assert!(*output == outputs[0]);
    }
}
