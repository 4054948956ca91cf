//! The reference per collective: the all-gather of the reduce-scatter is the all-reduce, bit for
//! bit, for every dtype and the shapes the kernels are checked at; the all-gather moves bytes
//! untouched; bad inputs are refused by rank.

use prepare::ladder::{Collective, Dtype};
use prepare::reference::{random_rank_inputs, reference_outputs, reference_sum, ReferenceError};
use prepare::shape::Shape;

fn views(inputs: &[Vec<u8>]) -> Vec<&[u8]> {
    inputs.iter().map(Vec::as_slice).collect()
}

/// Reduce-scatters random inputs of `rows` x `width` on `world` ranks, all-gathers the result,
/// and checks that every rank ends with the all-reduce's bytes, which are the reference sum.
fn check_identity(dtype: Dtype, world: usize, rows: u64, width: u64) {
    let shape = Shape::new(rows, width).expect("a valid shape");
    let what = format!("{dtype}, {world} ranks, {rows} x {width}");
    let seed = rows ^ (width << 20) ^ ((world as u64) << 40);
    let inputs = random_rank_inputs(dtype, seed, world, shape.elements() as usize);
    let inputs = views(&inputs);
    let all_reduce = reference_outputs(Collective::AllReduce, dtype, shape, &inputs)
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    let sum = reference_sum(dtype, &inputs);
    assert_eq!(all_reduce.len(), world, "{what}");
    assert!(all_reduce.iter().all(|output| *output == sum), "{what}");
    let scattered = reference_outputs(Collective::ReduceScatter, dtype, shape, &inputs)
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    let size = dtype.size_bytes();
    for (rank, output) in (0..).zip(&scattered) {
        let owned = shape.owned_rows(world as u32, rank).expect("a rank");
        assert_eq!(
            output.len() as u64,
            (owned.end - owned.start) * width * size,
            "{what}: rank {rank}'s rows"
        );
    }
    let gathered = reference_outputs(Collective::AllGather, dtype, shape, &views(&scattered))
        .unwrap_or_else(|error| panic!("{what}: {error}"));
    assert_eq!(gathered.len(), world, "{what}");
    for (rank, output) in gathered.iter().enumerate() {
        assert!(
            *output == all_reduce[rank],
            "{what}: rank {rank}'s all-gather of the reduce-scatter is not the all-reduce"
        );
    }
}

#[test]
fn the_all_gather_of_the_reduce_scatter_is_the_all_reduce_bit_for_bit() {
    for dtype in Dtype::ALL {
        for world in 2..=8_usize {
            let w = world as u64;
            for rows in [0, 1, w - 1, w + 1, 2047, 2048] {
                for width in [1, 7, 4096] {
                    // 2047 and 2048 rows of 4096 once, below.
                    if rows * width <= 1 << 16 {
                        check_identity(dtype, world, rows, width);
                    }
                }
            }
        }
    }
}

/// The largest shape, uneven over three ranks, once: a full message of 8 Mi elements per rank
/// is slow to sum in a debug build.
#[test]
fn the_all_gather_of_the_reduce_scatter_is_the_all_reduce_at_2047_rows_of_4096() {
    check_identity(Dtype::Bf16, 3, 2047, 4096);
}

/// The all-gather copies each rank's rows as they are: a NaN keeps its payload and -0 its sign,
/// where a sum would make the NaN canonical.
#[test]
fn the_all_gather_moves_each_rank_s_bytes_untouched() {
    let shape = Shape::new(5, 2).expect("a valid shape");
    // Rows 0..3 on rank 0 (6 elements), rows 3..5 on rank 1 (4 elements).
    let cases: [(Dtype, u32); 3] = [
        (Dtype::Bf16, 0x7FC1),
        (Dtype::Fp16, 0x7E01),
        (Dtype::Fp32, 0x7FC0_0001),
    ];
    for (dtype, nan) in cases {
        let size = dtype.size_bytes() as usize;
        let element = |bits: u32| bits.to_le_bytes()[..size].to_vec();
        let rank =
            |values: &[u32]| -> Vec<u8> { values.iter().flat_map(|&bits| element(bits)).collect() };
        let negative_zero = if size == 2 { 0x8000 } else { 0x8000_0000 };
        let first = rank(&[nan, 1, 2, negative_zero, 3, 4]);
        let second = rank(&[5, nan, negative_zero, 6]);
        let gathered = reference_outputs(Collective::AllGather, dtype, shape, &[&first, &second])
            .expect("the rows of both ranks");
        let expected = [first.clone(), second.clone()].concat();
        assert_eq!(gathered, [expected.clone(), expected], "{dtype}");
        assert_ne!(
            reference_sum(dtype, &[&first]),
            first,
            "{dtype}: a sum makes NaN canonical"
        );
    }
}

#[test]
fn an_input_of_the_wrong_length_no_rank_or_the_fused_collective_is_refused() {
    let shape = Shape::new(5, 3).expect("a valid shape");
    let whole = vec![0_u8; 15 * 2];
    let short = vec![0_u8; 14 * 2];
    let refused = reference_outputs(
        Collective::ReduceScatter,
        Dtype::Bf16,
        shape,
        &[&whole, &short],
    )
    .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "rank 1: reduce_scatter of 5 x 3 bf16 on 2 ranks takes 30 bytes (the whole message), \
         but its input holds 28"
    );
    assert!(
        reference_outputs(Collective::AllReduce, Dtype::Bf16, shape, &[&whole, &whole]).is_ok()
    );
    // An all-gather takes each rank's own rows: 3 and 2 of width 3 in fp32.
    let (first, second) = (vec![0_u8; 36], vec![0_u8; 24]);
    assert!(reference_outputs(
        Collective::AllGather,
        Dtype::Fp32,
        shape,
        &[&first, &second]
    )
    .is_ok());
    let refused = reference_outputs(
        Collective::AllGather,
        Dtype::Fp32,
        shape,
        &[&second, &first],
    )
    .unwrap_err();
    assert_eq!(
        refused.to_string(),
        "rank 0: all_gather of 5 x 3 fp32 on 2 ranks takes 36 bytes (its own rows), but its \
         input holds 24"
    );
    assert_eq!(
        reference_outputs(Collective::AllReduce, Dtype::Bf16, shape, &[]),
        Err(ReferenceError::NoRanks {
            collective: Collective::AllReduce
        })
    );
    assert_eq!(
        reference_outputs(
            Collective::AllReduceAddRmsNorm,
            Dtype::Bf16,
            shape,
            &[&whole]
        ),
        Err(ReferenceError::NeedsEpilogue {
            collective: Collective::AllReduceAddRmsNorm
        })
    );
}
