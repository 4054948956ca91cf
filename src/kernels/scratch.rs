//! The scratch each kernel needs after the input region of the registered buffer, and where
//! each kernel's region lies (kernels/prepare_layout.cuh, kernels/prepare_double_buffer.cuh).

#[cfg(feature = "testing")]
use super::spec::all_kernels;
use super::spec::{kernel_for, kernel_named, KernelSpec, Scratch};
use crate::abi::ALIGNMENT_BYTES;
use crate::ladder::{Collective, Dtype, Ladder};

fn round_up(value: u64, multiple: u64) -> u64 {
    value.div_ceil(multiple) * multiple
}

/// Bytes of a message-sized scratch region (kernels/prepare_layout.cuh `message_bytes`).
fn message_bytes(elements: u64, dtype: Dtype) -> u64 {
    round_up(elements * dtype.size_bytes(), ALIGNMENT_BYTES)
}

/// Where every region of the registered buffer starts and ends: a multiple of 2 MiB, the GPU's
/// large page. Measured on 2x H200 (docs/kernels.md): with the regions packed at 16-byte
/// multiples, the double-buffered `simple` one-shot was 2-4% slower from 768 KiB to 2 MiB and at
/// 64 MiB than with them at 2 MiB multiples (216.5 against 205.6 us at 64 MiB), whatever the
/// chunk of its halves (8 KiB to 2 MiB).
pub const REGION_ALIGNMENT_BYTES: u64 = 2 << 20;

/// The chunk in which the two halves of a double-buffered region interleave
/// (kernels/prepare_double_buffer.cuh).
pub const DOUBLE_BUFFER_CHUNK_BYTES: u64 = 8192;

/// Bytes of a double-buffered region for slots of `slot_bytes`: both halves of every peer's
/// slot (a rank keeps none for itself), each cut into whole chunks.
fn double_buffered_bytes(slot_bytes: u64, peers: u64) -> u64 {
    2 * peers * round_up(slot_bytes, DOUBLE_BUFFER_CHUNK_BYTES)
}

/// Lines to reserve for every message up to `elements` in the flags-in-data kernel. A message
/// takes two lines per whole vector and one per tail element (one if empty), which does not
/// grow with the message (for bf16, 15 elements take 9 lines, 16 take 4); one vector fewer and
/// the longest tail is the most any smaller message takes.
fn line_capacity(elements: u64, dtype: Dtype) -> u64 {
    2 * (elements / dtype.per_vector()) + dtype.per_vector() - 1
}

/// Bytes of one rank's slot of a slice, tail included (`slot_bytes`).
fn slice_slot_bytes(elements: u64, dtype: Dtype, world: u64) -> u64 {
    ((elements / dtype.per_vector()).div_ceil(world) + 1) * ALIGNMENT_BYTES
}

/// Bytes of one slot of a slice in the double-buffered RSAG, whose slots interleave in chunks
/// so that no offset depends on a slot's size: the tail counted as one more vector, a world's
/// share of the vectors, rounded up. Every slice with its tail fits: the slices before the last
/// take ceil(vectors / world) whole vectors each, never more than the share, and the last one,
/// which the tail follows, at most the share less one.
fn tight_slice_slot_bytes(elements: u64, dtype: Dtype, world: u64) -> u64 {
    elements.div_ceil(dtype.per_vector()).div_ceil(world) * ALIGNMENT_BYTES
}

/// The name of every scratch layout (`Scratch`'s variants, as Rust spells them), sorted: the
/// host emulation's harness (tests/host_emulation) has its C++ enum generated from this list.
/// Every layout is some kernel's (a variant no kernel uses would be dead code), so the kernels'
/// layouts are all of them.
#[cfg(feature = "testing")]
pub fn scratch_layouts() -> Vec<String> {
    let mut names: Vec<String> = all_kernels(Dtype::Bf16, 2)
        .iter()
        .map(|spec| format!("{:?}", kernel_named(spec).scratch))
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Scratch bytes a kernel needs for messages up to `max_bytes` at its world size; it grows with
/// the message, so the largest message sizes the region.
pub fn scratch_bytes(spec: &KernelSpec, max_bytes: u64) -> u64 {
    let dtype = spec.dtype;
    let elements = max_bytes.div_ceil(dtype.size_bytes());
    let world = u64::from(spec.world);
    let peers = world - 1;
    match kernel_named(spec).scratch {
        Scratch::None => 0,
        Scratch::Slice => slice_slot_bytes(elements, dtype, world),
        Scratch::Message => message_bytes(elements, dtype),
        Scratch::PeerMessageSlots => peers * message_bytes(elements, dtype),
        Scratch::PeerSliceSlotsThenMessage => {
            peers * slice_slot_bytes(elements, dtype, world) + message_bytes(elements, dtype)
        }
        Scratch::TwoMessages => 2 * message_bytes(elements, dtype),
        Scratch::DoubleBufferedLines => {
            double_buffered_bytes(line_capacity(elements, dtype) * ALIGNMENT_BYTES, peers)
        }
        Scratch::DoubleBufferedMessageSlots => {
            double_buffered_bytes(message_bytes(elements, dtype), peers)
        }
        Scratch::DoubleBufferedSliceSlotsTwice => {
            2 * double_buffered_bytes(tight_slice_slot_bytes(elements, dtype, world), peers)
        }
    }
}

/// Whether a kernel has no barrier and so a scratch region of its own (a peer may still be in
/// its previous launch, of any kernel, when this one writes).
pub fn is_double_buffered(spec: &KernelSpec) -> bool {
    kernel_named(spec).scratch.is_double_buffered()
}

/// Where the kernels' scratch lies after the input region: the region the barrier kernels
/// share, then one region per double-buffered kernel, in name order, each a whole number of
/// [`REGION_ALIGNMENT_BYTES`].
fn scratch_regions(ladder: &Ladder) -> (u64, Vec<(String, u64)>) {
    let mut shared = 0;
    let mut own: Vec<(String, u64)> = Vec::new();
    for (max_bytes, spec) in custom_bucket_kernels(ladder) {
        // Every size is a multiple of 16 bytes; a double-buffered region, of its chunk.
        let bytes = scratch_bytes(&spec, max_bytes);
        if is_double_buffered(&spec) {
            match own.iter_mut().find(|(name, _)| *name == spec.name) {
                Some((_, largest)) => *largest = (*largest).max(bytes),
                None => own.push((spec.name, bytes)),
            }
        } else {
            shared = shared.max(bytes);
        }
    }
    own.sort();
    let aligned = |bytes: u64| round_up(bytes, REGION_ALIGNMENT_BYTES);
    (
        aligned(shared),
        own.into_iter()
            .map(|(name, bytes)| (name, aligned(bytes)))
            .collect(),
    )
}

/// Bytes of scratch the ladder's custom candidates need after the input region: the shared
/// region plus every double-buffered kernel's own.
pub fn scratch_region_bytes(ladder: &Ladder) -> u64 {
    let (shared, own) = scratch_regions(ladder);
    shared + own.iter().map(|(_, bytes)| bytes).sum::<u64>()
}

/// Where `spec`'s scratch starts, in bytes after the end of the input region: 0 for the
/// barrier kernels, which share one region; after it, each double-buffered kernel's own.
pub fn scratch_offset_after_input(ladder: &Ladder, spec: &KernelSpec) -> u64 {
    let (shared, own) = scratch_regions(ladder);
    if !is_double_buffered(spec) {
        return 0;
    }
    let mut offset = shared;
    for (name, bytes) in &own {
        if *name == spec.name {
            return offset;
        }
        offset += bytes;
    }
    panic!("{} is not a kernel of ladder {}", spec.name, ladder.name)
}

/// The largest message any custom candidate of the ladder takes, rounded up to
/// [`REGION_ALIGNMENT_BYTES`]: the input region, so also every launch's `scratch_offset`.
/// Zero when only NCCL is ever a candidate.
pub fn input_region_bytes(ladder: &Ladder) -> u64 {
    custom_bucket_kernels(ladder)
        .map(|(max_bytes, _)| round_up(max_bytes, REGION_ALIGNMENT_BYTES))
        .max()
        .unwrap_or(0)
}

/// Bytes of the registered buffer each GPU needs for the ladder: the input region plus
/// [`scratch_region_bytes`], a whole number of [`REGION_ALIGNMENT_BYTES`]. The signal flags
/// ([`SIGNAL_BYTES`](crate::abi::SIGNAL_BYTES)) come on top.
pub fn peer_buffer_bytes(ladder: &Ladder) -> u64 {
    input_region_bytes(ladder) + scratch_region_bytes(ladder)
}

/// Bytes of one peer's slot in the copy-engine candidates' private scratch: the largest message
/// of the buckets that have such a candidate, rounded up to [`ALIGNMENT_BYTES`]; `None` when
/// the ladder has none, and for an all-gather, whose copies go straight to the output. Each
/// GPU allocates `world_size - 1` slots, not peer-mapped.
pub fn copy_engine_slot_bytes(ladder: &Ladder) -> Option<u64> {
    if ladder.collective == Collective::AllGather {
        return None;
    }
    custom_bucket_kernels(ladder)
        .filter(|(_, spec)| spec.copy_engine_barriers().is_some())
        .map(|(max_bytes, _)| round_up(max_bytes, ALIGNMENT_BYTES))
        .max()
}

/// Every (bucket `max_bytes`, kernel) pair where a bucket has a custom candidate.
fn custom_bucket_kernels(ladder: &Ladder) -> impl Iterator<Item = (u64, KernelSpec)> + '_ {
    ladder.buckets.iter().flat_map(move |bucket| {
        bucket.candidates.iter().filter_map(move |id| {
            let profile = ladder.profile(id)?;
            Some((
                bucket.max_bytes,
                kernel_for(profile, ladder.collective, ladder.dtype, ladder.world_size)?,
            ))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::all_kernels;
    use crate::kernels::spec::tests::{ladder, spec, EXAMPLE};
    use crate::ladder::Collective;

    fn scratch(name: &str, world: u32, max_bytes: u64) -> u64 {
        scratch_bytes(&spec(name, world), max_bytes)
    }

    #[test]
    fn scratch_follows_each_layout() {
        // 16 KiB at 4 ranks: 8192 elements, 1024 vectors, 256 per slice; slots are one per
        // peer, three.
        assert_eq!(scratch("all_reduce_one_shot_pull_bf16", 4, 16384), 0);
        assert_eq!(
            scratch("all_reduce_one_shot_push_bf16", 4, 16384),
            3 * 16384
        );
        assert_eq!(scratch("all_reduce_full_phased_bf16", 4, 16384), 3 * 16384);
        // The reduced slice alone, in a slot of 257 vectors.
        assert_eq!(scratch("all_reduce_rsag_pull_bf16", 4, 16384), 257 * 16);
        assert_eq!(
            scratch("all_reduce_rsag_push_bf16", 4, 16384),
            3 * 257 * 16 + 16384
        );
        assert_eq!(
            scratch("all_reduce_rsag_phased_bf16", 4, 16384),
            3 * 257 * 16 + 16384
        );
        // The row collectives: the reduce-scatter's push a message-sized slot per peer (a rank
        // may own every row), the all-gather's one message-sized region for every peer's rows.
        assert_eq!(scratch("reduce_scatter_one_shot_pull_bf16", 4, 16384), 0);
        assert_eq!(scratch("all_gather_one_shot_pull_bf16", 4, 16384), 0);
        assert_eq!(
            scratch("reduce_scatter_one_shot_push_bf16", 4, 16384),
            3 * 16384
        );
        assert_eq!(scratch("all_gather_one_shot_push_bf16", 4, 16384), 16384);
        // Their ll pushes: a region of their own, sized as the all-reduce's ll (a run of e
        // elements takes no more lines than the all-reduce's message of e elements).
        for ll in [
            "reduce_scatter_one_shot_push_ll",
            "all_gather_one_shot_push_ll",
        ] {
            for (dtype, world, bytes) in [("bf16", 4, 16384), ("fp32", 8, 18), ("bf16", 2, 1 << 20)]
            {
                let name = format!("{ll}_{dtype}");
                assert!(is_double_buffered(&spec(&name, world)), "{name}");
                assert_eq!(
                    scratch(&name, world, bytes),
                    scratch(
                        &format!("all_reduce_one_shot_push_ll_{dtype}"),
                        world,
                        bytes
                    ),
                    "{name}"
                );
            }
        }
        assert_eq!(scratch("all_gather_one_shot_push_fp32", 8, 18), 32);
        // The fused two-shot: the owners' normed rows, then their residual_out rows, each
        // message-sized (a rank may own every row), whatever the world.
        for world in [2, 8] {
            assert_eq!(
                scratch("all_reduce_add_rms_norm_two_shot_bf16", world, 16384),
                2 * 16384
            );
        }
        assert_eq!(
            scratch("all_reduce_add_rms_norm_two_shot_fp32", 3, 18),
            2 * 32
        );
        // 96 bytes at 3 ranks: 48 elements, 6 vectors, 2 per slice; slots of 3 vectors.
        assert_eq!(scratch("all_reduce_rsag_push_bf16", 3, 96), 2 * 48 + 96);
        // A message that is not whole vectors still gets whole-vector regions.
        assert_eq!(scratch("all_reduce_one_shot_push_bf16", 2, 18), 32);
        // fp32: 96 bytes are 24 elements, 6 vectors of 4, as for bf16; 16 KiB at 4 ranks the
        // same bytes; fp16 lays out exactly as bf16.
        assert_eq!(scratch("all_reduce_rsag_push_fp32", 3, 96), 2 * 48 + 96);
        assert_eq!(
            scratch("all_reduce_rsag_phased_fp32", 4, 16384),
            3 * 257 * 16 + 16384
        );
        assert_eq!(scratch("all_reduce_one_shot_push_fp32", 2, 20), 32);
        for name in [
            "rsag_push",
            "one_shot_push_ll",
            "one_shot_push_simple",
            "rsag_push_simple",
        ] {
            assert_eq!(
                scratch(&format!("all_reduce_{name}_fp16"), 5, 1000),
                scratch(&format!("all_reduce_{name}_bf16"), 5, 1000)
            );
        }
    }

    /// Lines the flags-in-data kernel uses for a message (all_reduce_one_shot_double_buffered.cu).
    fn line_count(elements: u64) -> u64 {
        lines_of(elements, Dtype::Bf16)
    }

    /// Lines a message of `elements` takes in the flags-in-data kernel.
    fn lines_of(elements: u64, dtype: Dtype) -> u64 {
        let per = dtype.per_vector();
        (2 * (elements / per) + elements % per).max(1)
    }

    #[test]
    fn double_buffered_scratch_holds_both_halves_in_whole_chunks() {
        // 16 KiB at 4 ranks: 1024 vectors, room for 2048 + 7 lines of 16 bytes: 5 chunks, in
        // each half of each of the three peer slots.
        assert_eq!(
            scratch("all_reduce_one_shot_push_ll_bf16", 4, 16384),
            2 * 3 * 5 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        assert_eq!(
            scratch("all_reduce_one_shot_push_simple_bf16", 4, 16384),
            2 * 3 * 16384
        );
        // 9 elements: one vector (2 lines) and one tail line; any slot takes a whole chunk.
        assert_eq!(
            scratch("all_reduce_one_shot_push_ll_bf16", 2, 18),
            2 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        assert_eq!(
            scratch("all_reduce_one_shot_push_simple_bf16", 3, 18),
            2 * 2 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        // The RSAG's two regions, each two halves of a slice slot per peer: 1 MiB at 4 ranks is
        // 65536 vectors, slices and slots of 16384 vectors, 32 chunks; half the one-shot's
        // scratch. Four vectors more make every slot one vector longer: 33 chunks. At two ranks
        // a slot is half the message.
        assert_eq!(
            scratch("all_reduce_rsag_push_simple_bf16", 4, 1 << 20),
            2 * 2 * 3 * 32 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        assert_eq!(
            scratch("all_reduce_rsag_push_simple_bf16", 4, (1 << 20) + 16 * 4),
            2 * 2 * 3 * 33 * DOUBLE_BUFFER_CHUNK_BYTES
        );
        assert_eq!(
            scratch("all_reduce_one_shot_push_simple_bf16", 4, 1 << 20),
            2 * 3 * (1 << 20)
        );
        assert_eq!(
            scratch("all_reduce_rsag_push_simple_bf16", 2, 1 << 20),
            2 * 2 * (1 << 19)
        );
        assert!(is_double_buffered(&spec(
            "all_reduce_rsag_push_simple_fp32",
            8
        )));
        // An empty message still has its one line.
        assert_eq!(line_count(0), 1);
        assert_eq!(line_count(8), 2);
        assert_eq!(line_count(15), 9);
    }

    #[test]
    fn lines_reserved_for_a_bucket_hold_every_smaller_message() {
        // The largest message of a bucket need not take the most lines: near a chunk boundary
        // (4096 elements fill two chunks exactly) a few elements less take more.
        for dtype in Dtype::ALL {
            for largest in (0..40_000u64).chain((1..64).map(|k| (k << 20) / 2)) {
                for elements in largest.saturating_sub(16)..=largest {
                    assert!(
                        lines_of(elements, dtype) <= line_capacity(largest, dtype),
                        "{dtype}: {elements} of at most {largest}"
                    );
                }
            }
        }
        assert!(line_count(524_285) > line_count(524_288));
    }

    /// Two buckets where barrier and double-buffered kernels meet.
    const MIXED: &str = r#"{
        "format_version": 1, "name": "mixed", "collective": "all_reduce", "dtype": "bf16",
        "world_size": 2, "targets": ["sm_90"],
        "profiles": [
            { "id": "push", "algorithm": "one_shot", "transfer": "push" },
            { "id": "ll", "algorithm": "one_shot", "transfer": "push", "protocol": "ll" },
            { "id": "simple", "algorithm": "one_shot", "transfer": "push", "protocol": "simple" },
            { "id": "barrier", "algorithm": "one_shot", "transfer": "push", "protocol": "barrier" },
            { "id": "nccl", "algorithm": "nccl" }
        ],
        "buckets": [
            { "max_bytes": 16384, "threads": 256, "blocks": 4,
              "candidates": ["push", "ll", "simple", "nccl"], "default": "ll" },
            { "max_bytes": 65536, "threads": 256, "blocks": 4,
              "candidates": ["barrier", "simple", "nccl"], "default": "simple" }
        ]
    }"#;

    #[test]
    fn each_double_buffered_kernel_has_a_region_of_its_own_after_the_shared_one() {
        let mixed = ladder(MIXED);
        let push = spec("all_reduce_one_shot_push_bf16", 2);
        let ll = spec("all_reduce_one_shot_push_ll_bf16", 2);
        let simple = spec("all_reduce_one_shot_push_simple_bf16", 2);
        assert!(!is_double_buffered(&push));
        assert!(is_double_buffered(&ll) && is_double_buffered(&simple));
        // `protocol: barrier` is the ordinary push kernel.
        let barrier = kernel_for(
            mixed.profile("barrier").unwrap(),
            Collective::AllReduce,
            Dtype::Bf16,
            2,
        )
        .unwrap();
        assert_eq!(barrier, push);
        // Shared: one-shot push at 64 KiB, one peer slot. Then ll (16 KiB: room for 2048 + 7
        // lines, 5 chunks a slot) and simple (64 KiB), two halves of one peer slot each. Every
        // region takes whole large pages, so each takes one here.
        assert_eq!(scratch_bytes(&push, 65536), 65536);
        assert_eq!(scratch_bytes(&ll, 16384), 2 * 5 * DOUBLE_BUFFER_CHUNK_BYTES);
        assert_eq!(scratch_bytes(&simple, 65536), 2 * 65536);
        let page = REGION_ALIGNMENT_BYTES;
        assert_eq!(scratch_offset_after_input(&mixed, &push), 0);
        assert_eq!(scratch_offset_after_input(&mixed, &ll), page);
        assert_eq!(scratch_offset_after_input(&mixed, &simple), 2 * page);
        assert_eq!(scratch_region_bytes(&mixed), 3 * page);
        assert_eq!(peer_buffer_bytes(&mixed), 4 * page);
    }

    #[test]
    fn peer_buffer_is_sized_by_the_largest_bucket_with_custom_candidates() {
        let example = ladder(EXAMPLE);
        // The NCCL-only 1 MiB bucket does not count; the 96 KiB one does, in a large page.
        assert_eq!(input_region_bytes(&example), REGION_ALIGNMENT_BYTES);
        // Largest scratch: one_shot_push (or full_phased) at 96 KiB, 3 peer slots, in a page.
        assert_eq!(
            scratch_bytes(
                &kernel_for(
                    example.profile("one_shot_push").unwrap(),
                    Collective::AllReduce,
                    Dtype::Bf16,
                    4
                )
                .unwrap(),
                98304
            ),
            3 * 98304
        );
        assert_eq!(peer_buffer_bytes(&example), 2 * REGION_ALIGNMENT_BYTES);
        let mut nccl_only = example.clone();
        for bucket in &mut nccl_only.buckets {
            bucket.candidates = vec!["nccl".to_owned()];
        }
        assert_eq!(input_region_bytes(&nccl_only), 0);
        assert_eq!(peer_buffer_bytes(&nccl_only), 0);
    }

    #[test]
    fn copy_engine_scratch_is_sized_by_its_largest_bucket_only() {
        let mut example = ladder(EXAMPLE);
        assert_eq!(copy_engine_slot_bytes(&example), None);
        example.profiles.push(
            serde_json::from_value(serde_json::json!({
                "id": "copy", "algorithm": "one_shot", "transfer": "copy_engine"
            }))
            .unwrap(),
        );
        example.buckets[0].candidates.push("copy".to_owned());
        // Only the 16 KiB bucket has it; the 1 MiB bucket does not count.
        assert_eq!(copy_engine_slot_bytes(&example), Some(16384));
        example.buckets[2].candidates.push("copy".to_owned());
        assert_eq!(copy_engine_slot_bytes(&example), Some(1 << 20));
        let spec = kernel_for(
            example.profile("copy").unwrap(),
            Collective::AllReduce,
            Dtype::Bf16,
            4,
        )
        .unwrap();
        assert_eq!(
            spec.copy_engine_barriers(),
            Some([
                "all_reduce_one_shot_copy_engine_start_bf16".to_owned(),
                "all_reduce_one_shot_copy_engine_end_bf16".to_owned()
            ])
        );
        // No registered scratch, and the barriers belong to no other kernel.
        assert_eq!(scratch_bytes(&spec, 1 << 20), 0);
        let gather = kernel_for(
            example.profile("copy").unwrap(),
            Collective::AllGather,
            Dtype::Bf16,
            4,
        )
        .unwrap();
        assert_eq!(
            gather.copy_engine_barriers(),
            Some([
                "all_gather_one_shot_copy_engine_start_bf16".to_owned(),
                "all_gather_one_shot_copy_engine_end_bf16".to_owned()
            ])
        );
        assert_eq!(scratch_bytes(&gather, 1 << 20), 0);
        assert!(all_kernels(Dtype::Bf16, 4)
            .iter()
            .filter(|other| **other != spec && **other != gather)
            .all(|other| other.copy_engine_barriers().is_none()));
        // An all-gather copies straight into its output: no private scratch either.
        example.collective = Collective::AllGather;
        assert_eq!(copy_engine_slot_bytes(&example), None);
    }

    /// `slice_of` of kernels/prepare_layout.cuh ([`crate::kernels::slice_of`]), element ranges:
    /// (vectors, tail).
    fn slice_of(slice: u64, elements: u64, world: u64, dtype: Dtype) -> ((u64, u64), (u64, u64)) {
        let slice = crate::kernels::slice_of(slice as u32, elements, dtype, world as u32);
        (
            (slice.begin_vector, slice.end_vector),
            (slice.tail_begin, slice.tail_end),
        )
    }

    proptest::proptest! {
        /// The slices cover every element once, in order, and each fits a slot of
        /// `slice_slot_bytes`, so the scratch `scratch_bytes` reports holds what the kernels
        /// write for any message up to the bucket's size.
        #[test]
        fn slices_partition_the_message_and_fit_their_slots(
            elements in 0u64..5000,
            world in 2u64..=8,
            smaller in 0u64..5000,
            dtype in proptest::sample::select(Dtype::ALL.to_vec()),
        ) {
            let per = dtype.per_vector();
            let size = dtype.size_bytes();
            let mut next = 0;
            for slice in 0..world {
                let ((begin, end), (tail_begin, tail_end)) = slice_of(slice, elements, world, dtype);
                proptest::prop_assert!(begin <= end);
                if begin < end {
                    proptest::prop_assert_eq!(begin * per, next);
                    next = end * per;
                }
                if tail_begin < tail_end {
                    proptest::prop_assert_eq!(tail_begin, next);
                    next = tail_end;
                }
                // The highest byte written into a slot: the last tail element, or the last vector.
                let used = if tail_begin < tail_end {
                    (tail_end - begin * per) * size
                } else {
                    (end - begin) * 16
                };
                proptest::prop_assert!(used <= slice_slot_bytes(elements, dtype, world));
                proptest::prop_assert!(used <= tight_slice_slot_bytes(elements, dtype, world));
            }
            proptest::prop_assert_eq!(next, elements);
            // Scratch grows with the message, so the bucket's largest message sizes it.
            let smaller = smaller.min(elements);
            for spec in all_kernels(dtype, world as u32) {
                proptest::prop_assert!(
                    scratch_bytes(&spec, smaller * size) <= scratch_bytes(&spec, elements * size)
                );
            }
        }
    }
}
