//! The host mirror of the RSAG's slices (kernels/prepare_layout.cuh `slice_of` and
//! `slot_bytes`): how a message is cut into one contiguous slice of whole 16-byte vectors per
//! rank, the last slice owning the tail. The exact NCCL all-reduce sends, sums and gathers by
//! these slices, so the host and the kernel must cut alike.

use crate::abi::ALIGNMENT_BYTES;
use crate::ladder::Dtype;

/// One slice: whole vectors `[begin_vector, end_vector)`, then elements
/// `[tail_begin, tail_end)` (only the last slice has a tail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// The first whole vector.
    pub begin_vector: u64,
    /// One past the last whole vector.
    pub end_vector: u64,
    /// The first tail element (0 when the slice has no tail).
    pub tail_begin: u64,
    /// One past the last tail element (0 when the slice has no tail).
    pub tail_end: u64,
}

impl Slice {
    /// The slice's first element.
    pub fn first_element(&self, dtype: Dtype) -> u64 {
        self.begin_vector * dtype.per_vector()
    }

    /// Elements in the slice, tail included.
    pub fn elements(&self, dtype: Dtype) -> u64 {
        (self.end_vector - self.begin_vector) * dtype.per_vector() + self.tail_end - self.tail_begin
    }

    /// Bytes of the slice, tail included.
    pub fn bytes(&self, dtype: Dtype) -> u64 {
        self.elements(dtype) * dtype.size_bytes()
    }
}

/// Whole vectors of a slice before the last (`slice_vectors`): ceil(vectors / world).
fn slice_vectors(elements: u64, dtype: Dtype, world: u64) -> u64 {
    (elements / dtype.per_vector()).div_ceil(world)
}

/// Slice `slice` of `world` of a message of `elements`: vectors
/// `[min(slice * P, V), min((slice + 1) * P, V))` with `P = ceil(V / world)`, the last slice
/// to `V` and its tail. Panics when `slice` is not below `world`.
pub fn slice_of(slice: u32, elements: u64, dtype: Dtype, world: u32) -> Slice {
    assert!(slice < world, "slice {slice} of {world}");
    let vectors = elements / dtype.per_vector();
    let per_slice = slice_vectors(elements, dtype, u64::from(world));
    let last = slice == world - 1;
    let slice = u64::from(slice);
    Slice {
        begin_vector: (slice * per_slice).min(vectors),
        end_vector: if last {
            vectors
        } else {
            ((slice + 1) * per_slice).min(vectors)
        },
        tail_begin: if last {
            vectors * dtype.per_vector()
        } else {
            0
        },
        tail_end: if last { elements } else { 0 },
    }
}

/// Bytes of a slot that holds any slice of a message of `elements`, tail included
/// (`slot_bytes`): one vector more than a slice before the last.
pub fn slot_bytes(elements: u64, dtype: Dtype, world: u32) -> u64 {
    (slice_vectors(elements, dtype, u64::from(world)) + 1) * ALIGNMENT_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_with_a_tail_is_cut_as_the_header_says() {
        // 4 ranks, bf16, 8 * 10 + 3 elements: 10 vectors, 3 a slice, the last one 1 and the tail.
        let slices: Vec<Slice> = (0..4).map(|s| slice_of(s, 83, Dtype::Bf16, 4)).collect();
        let ranges: Vec<(u64, u64, u64, u64)> = slices
            .iter()
            .map(|s| (s.begin_vector, s.end_vector, s.tail_begin, s.tail_end))
            .collect();
        assert_eq!(
            ranges,
            [(0, 3, 0, 0), (3, 6, 0, 0), (6, 9, 0, 0), (9, 10, 80, 83)]
        );
        assert_eq!(slices[3].elements(Dtype::Bf16), 11);
        assert_eq!(slices[3].first_element(Dtype::Bf16), 72);
        assert_eq!(slices[0].bytes(Dtype::Bf16), 48);
        assert_eq!(slot_bytes(83, Dtype::Bf16, 4), 64);
        // Fewer vectors than ranks: the later slices are empty, the last has only the tail.
        let few: Vec<u64> = (0..8)
            .map(|s| slice_of(s, 13, Dtype::Fp32, 8).elements(Dtype::Fp32))
            .collect();
        assert_eq!(few, [4, 4, 4, 0, 0, 0, 0, 1]);
    }

    proptest::proptest! {
        /// The slices cover every element once, in order, and each fits a slot.
        #[test]
        fn slices_partition_the_message_and_fit_a_slot(
            elements in 0u64..20_000,
            world in 2u32..=8,
            dtype in proptest::sample::select(Dtype::ALL.to_vec()),
        ) {
            let mut next = 0;
            for s in 0..world {
                let slice = slice_of(s, elements, dtype, world);
                proptest::prop_assert!(slice.begin_vector <= slice.end_vector);
                proptest::prop_assert_eq!(slice.first_element(dtype), next.min(slice.first_element(dtype)));
                if slice.elements(dtype) > 0 {
                    proptest::prop_assert_eq!(slice.first_element(dtype), next);
                }
                next += slice.elements(dtype);
                proptest::prop_assert!(slice.bytes(dtype) <= slot_bytes(elements, dtype, world));
            }
            proptest::prop_assert_eq!(next, elements);
        }
    }
}
