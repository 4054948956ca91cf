//! The reduce-scatter and the all-gather on one rank, as pure plans over the shape rule
//! ([`crate::shape`]): what each rank reads and writes, which operands are refused, the
//! launch parameter's counts, and where a custom kernel reads and writes (what is copied
//! around it). What is enqueued is what these plans say, so the tests check them.
//!
//! A reduce-scatter reads the whole message on every rank and writes this rank's rows; an
//! all-gather reads this rank's rows and writes the whole message. In place is this rank's
//! rows of the other operand (the reduce-scatter's output inside its input, the all-gather's
//! input inside its output); any other overlap of input and output is refused.

use std::ops::Range;

use super::operands::{overlaps, span, BufferLayout};
use crate::abi::LaunchParams;
use crate::kernels::{self, InputAccess};
use crate::ladder::{Collective, Dtype};
use crate::runtime::OperandError;
use crate::shape::{RankRows, Shape, ShapeError};

/// One rank's reduce-scatter or all-gather of a message of a shape, its rows owned by the
/// shape rule or as the caller gave them ([`RankRows`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowMessage {
    collective: Collective,
    shape: Shape,
    world: u32,
    rank: u32,
    element_bytes: u64,
    // The caller's per-rank rows where they are not the rule's (`None`: the rule's).
    given: Option<RankRows>,
}

/// How a row collective's output lies against its input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowLayout {
    /// Apart (either operand may be empty).
    Apart,
    /// This rank's rows of the other operand: the reduce-scatter's output is its rows of the
    /// input, the all-gather's input is its rows of the output.
    InPlace,
}

impl RowMessage {
    /// Rank `rank` of `world`'s part of a `collective` of `shape` in `dtype`; refused for a
    /// collective without rows, a rank outside the world, or more bytes than a u64 counts
    /// (every byte count of the message is then exact).
    pub fn new(
        collective: Collective,
        shape: Shape,
        world: u32,
        rank: u32,
        dtype: Dtype,
    ) -> Result<RowMessage, ShapeError> {
        if !matches!(
            collective,
            Collective::ReduceScatter | Collective::AllGather
        ) {
            return Err(ShapeError::NotRowCollective { collective });
        }
        shape.owned_rows(world, rank)?;
        let element_bytes = dtype.size_bytes();
        shape.bytes(element_bytes)?;
        Ok(RowMessage {
            collective,
            shape,
            world,
            rank,
            element_bytes,
            given: None,
        })
    }

    /// Rank `rank`'s part of a `collective` of rows of `width` owned as `layout` says (a
    /// v-form); the same message as [`RowMessage::new`] gives when `layout` is the shape
    /// rule's. Refused as [`RowMessage::new`] refuses.
    pub fn given(
        collective: Collective,
        width: u64,
        layout: &RankRows,
        rank: u32,
        dtype: Dtype,
    ) -> Result<RowMessage, ShapeError> {
        let shape = Shape::new(layout.rows(), width)?;
        layout.owned_rows(rank)?;
        let mut message = RowMessage::new(collective, shape, layout.world(), rank, dtype)?;
        if !layout.follows_rule() {
            message.given = Some(layout.clone());
        }
        Ok(message)
    }

    /// Whether the ranks own their rows by the shape rule: what the custom kernels, the
    /// pieces and NCCL's own collectives take. Otherwise only the grouped transfers do.
    pub fn follows_rule(&self) -> bool {
        self.given.is_none()
    }

    /// The collective.
    pub fn collective(&self) -> Collective {
        self.collective
    }

    /// The full message's shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Ranks.
    pub fn world(&self) -> u32 {
        self.world
    }

    /// Bytes of one element.
    pub fn element_bytes(&self) -> u64 {
        self.element_bytes
    }

    /// The elements of the full message rank `rank` owns.
    pub fn owned_elements(&self, rank: u32) -> Range<u64> {
        let rows = match &self.given {
            Some(layout) => layout.owned_rows(rank),
            None => self.shape.owned_rows(self.world, rank),
        }
        .expect("a rank of the world");
        rows.start * self.shape.width()..rows.end * self.shape.width()
    }

    /// Bytes of the full message rank `rank` owns, as offsets into it.
    pub fn owned_bytes(&self, rank: u32) -> Range<u64> {
        let elements = self.owned_elements(rank);
        elements.start * self.element_bytes..elements.end * self.element_bytes
    }

    /// Bytes of the full message (what buckets are chosen by).
    pub fn message_bytes(&self) -> u64 {
        self.shape.elements() * self.element_bytes
    }

    /// Bytes of this rank's rows.
    pub fn own_bytes(&self) -> u64 {
        let own = self.owned_bytes(self.rank);
        own.end - own.start
    }

    /// Bytes this rank reads: the whole message (reduce-scatter) or its rows (all-gather).
    pub fn input_bytes(&self) -> u64 {
        match self.collective {
            Collective::ReduceScatter => self.message_bytes(),
            _ => self.own_bytes(),
        }
    }

    /// Bytes this rank writes: its rows (reduce-scatter) or the whole message (all-gather).
    pub fn output_bytes(&self) -> u64 {
        match self.collective {
            Collective::ReduceScatter => self.own_bytes(),
            _ => self.message_bytes(),
        }
    }

    /// The launch parameter's shape fields (the launch contract): the reduce-scatter reads
    /// rows x width and writes its owned rows, the all-gather the other way round.
    pub fn set_params(&self, params: &mut LaunchParams) {
        let whole = self.shape.elements();
        let own = self.own_bytes() / self.element_bytes;
        (params.input_elements, params.output_elements) = match self.collective {
            Collective::ReduceScatter => (whole, own),
            _ => (own, whole),
        };
        params.rows = self.shape.rows();
        params.width = self.shape.width();
    }

    /// Where the output would lie in place, given the input (reduce-scatter), or where the
    /// input would, given the output (all-gather).
    pub(super) fn in_place_partner(&self, input: u64, output: u64) -> bool {
        let own = self.owned_bytes(self.rank).start;
        match self.collective {
            Collective::ReduceScatter => output == input + own,
            _ => input == output + own,
        }
    }

    /// How `output` lies against `input`: apart, in place, or refused (any other overlap).
    pub fn layout(&self, input: u64, output: u64) -> Result<RowLayout, OperandError> {
        let (input_bytes, output_bytes) = (self.input_bytes(), self.output_bytes());
        if input_bytes > 0 && output_bytes > 0 && self.in_place_partner(input, output) {
            return Ok(RowLayout::InPlace);
        }
        if overlaps(&span(input, input_bytes), &span(output, output_bytes)) {
            return Err(OperandError::RowsOverlap {
                collective: self.collective,
                rank: self.rank,
                in_place: match self.collective {
                    Collective::ReduceScatter => "its output is this rank's rows of its input",
                    _ => "its input is this rank's rows of its output",
                },
            });
        }
        Ok(RowLayout::Apart)
    }

    /// Refuses operands of other lengths than the message takes on this rank.
    pub fn check_lengths(&self, input: u64, output: u64) -> Result<(), OperandError> {
        for (operand, holds, bytes) in [
            ("input", input, self.input_bytes()),
            ("output", output, self.output_bytes()),
        ] {
            if holds != bytes {
                return Err(OperandError::WrongLength {
                    collective: self.collective,
                    operand,
                    holds,
                    bytes,
                    rows: self.shape.rows(),
                    width: self.shape.width(),
                    rank: self.rank,
                });
            }
        }
        Ok(())
    }
}

/// Where a custom kernel reads and writes one row collective, and what is copied around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowPlan {
    /// The input is moved to the registered buffer's start before the kernel.
    pub staged: bool,
    /// The address the kernel reads this rank's input from.
    pub input: u64,
    /// The address the kernel writes this rank's output to.
    pub output: u64,
    /// The kernel writes elsewhere than the caller's output; it is moved there after.
    pub bounce: bool,
}

/// Where a kernel of `access` reads and writes `message` given at `input` and `output` (a
/// layout [`RowMessage::layout`] accepted). The rules:
///
/// - A kernel whose peers read this rank's input reads it at the registered buffer's start
///   (the reduce-scatter's whole message, the all-gather's rows from byte 0): moved there
///   unless it is there. A local kernel reads it where it is when that is 16-byte aligned and
///   outside the scratch; otherwise it is moved to the start too.
/// - The kernel writes `output` directly when that is 16-byte aligned, outside the scratch,
///   and overlaps what it reads only in place; for a kernel whose peers read, it must also lie
///   apart from what they read, except a reduce-scatter's output in place at the start when
///   the kernel allows it (`output_may_alias`: peers never read this rank's own rows).
/// - Otherwise it writes elsewhere and the output is moved after: a reduce-scatter that may
///   write in place over a copy of its input writes there; else the private output buffer
///   when the output fits; else the input region past what the kernel reads. A rank with an
///   empty output writes nothing (the kernel is given an aligned address it does not touch).
///
/// Refused when none of those holds the output: a message larger than the handle's buffers
/// were sized for.
pub fn plan_rows(
    access: InputAccess,
    message: &RowMessage,
    input: u64,
    output: u64,
    layout: &BufferLayout,
) -> Result<RowPlan, OperandError> {
    let aligned = |address: u64| address % kernels::ALIGNMENT_BYTES == 0;
    let (input_bytes, output_bytes) = (message.input_bytes(), message.output_bytes());
    let start = layout.input_region.start;
    let peers_read = matches!(access, InputAccess::Peers { .. });
    let reads_where_it_is = input_bytes == 0
        || if peers_read {
            input == start
        } else {
            aligned(input) && !overlaps(&span(input, input_bytes), &layout.scratch)
        };
    let kernel_input = if reads_where_it_is && input_bytes > 0 {
        input
    } else {
        start
    };
    let staged = !reads_where_it_is;
    if output_bytes == 0 {
        return Ok(RowPlan {
            staged,
            input: kernel_input,
            output: layout.private_output.start,
            bounce: false,
        });
    }
    let reads = span(kernel_input, input_bytes);
    let may_alias = match access {
        InputAccess::Local => true,
        InputAccess::Peers { output_may_alias } => {
            output_may_alias && message.collective() == Collective::ReduceScatter
        }
    };
    let in_place_over = |target: u64| may_alias && message.in_place_partner(kernel_input, target);
    let writable = |target: u64| {
        let writes = span(target, output_bytes);
        aligned(target)
            && !overlaps(&writes, &layout.scratch)
            && (!overlaps(&writes, &reads) || in_place_over(target))
    };
    if writable(output) {
        return Ok(RowPlan {
            staged,
            input: kernel_input,
            output,
            bounce: false,
        });
    }
    let over_copy = (message.collective() == Collective::ReduceScatter && staged)
        .then(|| kernel_input + message.owned_bytes(message.rank()).start)
        .filter(|&target| writable(target));
    let private = layout.private_output.clone();
    let in_private = (output_bytes <= private.end - private.start).then_some(private.start);
    let past_input = Some(if kernel_input == start {
        start + input_bytes.next_multiple_of(kernels::ALIGNMENT_BYTES)
    } else {
        start
    })
    .filter(|&target| {
        target.saturating_add(output_bytes) <= layout.input_region.end && writable(target)
    });
    let target = over_copy
        .or(in_private)
        .or(past_input)
        .ok_or(OperandError::NoRoomForOutput {
            collective: message.collective(),
            rank: message.rank(),
            bytes: output_bytes,
        })?;
    Ok(RowPlan {
        staged,
        input: kernel_input,
        output: target,
        bounce: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;
    const LOCAL: InputAccess = InputAccess::Local;
    const PULL: InputAccess = InputAccess::Peers {
        output_may_alias: false,
    };
    const PULL_ALIAS: InputAccess = InputAccess::Peers {
        output_may_alias: true,
    };

    fn message(collective: Collective, rows: u64, width: u64, world: u32, rank: u32) -> RowMessage {
        let shape = Shape::new(rows, width).expect("a valid shape");
        RowMessage::new(collective, shape, world, rank, Dtype::Bf16).expect("a row collective")
    }

    /// A registered buffer at 1 GiB (16 MiB of input region, then 48 MiB of scratch) and a
    /// private output buffer of 2 MiB at 2 GiB.
    fn layout() -> BufferLayout {
        BufferLayout {
            input_region: 1024 * MIB..1040 * MIB,
            scratch: 1040 * MIB..1088 * MIB,
            private_output: 2048 * MIB..2050 * MIB,
        }
    }

    #[test]
    fn the_params_carry_the_contract_s_counts_per_collective() {
        // 10 rows of width 7 on 4 ranks: runs of 3, 3, 2, 2 rows.
        for (rank, own) in [(0, 21), (1, 21), (2, 14), (3, 14)] {
            let mut params = LaunchParams::all_reduce(999);
            message(Collective::ReduceScatter, 10, 7, 4, rank).set_params(&mut params);
            assert_eq!(
                (
                    params.input_elements,
                    params.output_elements,
                    params.rows,
                    params.width
                ),
                (70, own, 10, 7)
            );
            message(Collective::AllGather, 10, 7, 4, rank).set_params(&mut params);
            assert_eq!(
                (
                    params.input_elements,
                    params.output_elements,
                    params.rows,
                    params.width
                ),
                (own, 70, 10, 7)
            );
        }
        // A rank that owns no rows still launches, with an empty output (RS) or input (AG).
        let mut params = LaunchParams::all_reduce(0);
        message(Collective::ReduceScatter, 2, 5, 4, 3).set_params(&mut params);
        assert_eq!((params.input_elements, params.output_elements), (10, 0));
        message(Collective::AllGather, 2, 5, 4, 3).set_params(&mut params);
        assert_eq!((params.input_elements, params.output_elements), (0, 10));
    }

    #[test]
    fn only_the_all_reduce_s_relatives_with_rows_and_ranks_of_the_world_are_messages() {
        let shape = Shape::new(4, 4).unwrap();
        for collective in [Collective::AllReduce, Collective::AllReduceAddRmsNorm] {
            let refused = RowMessage::new(collective, shape, 2, 0, Dtype::Fp32).unwrap_err();
            assert_eq!(refused, ShapeError::NotRowCollective { collective });
            assert_eq!(
                refused.to_string(),
                format!(
                    "{collective} is not a rows x width collective (reduce_scatter or all_gather)"
                )
            );
        }
        assert_eq!(
            RowMessage::new(Collective::AllGather, shape, 2, 2, Dtype::Fp32),
            Err(ShapeError::RankOutsideWorld { rank: 2, world: 2 })
        );
    }

    #[test]
    fn per_rank_rows_give_each_rank_its_counts_and_the_rule_s_list_is_the_ordinary_message() {
        let given = |counts: &[u64], rank: u32| {
            let layout = RankRows::given(counts, counts.len() as u32).unwrap();
            RowMessage::given(Collective::ReduceScatter, 8, &layout, rank, Dtype::Bf16).unwrap()
        };
        // The rule's list of 10 rows on 4 ranks is the ordinary message, field for field.
        for rank in 0..4 {
            let ordinary = message(Collective::ReduceScatter, 10, 8, 4, rank);
            assert_eq!(given(&[3, 3, 2, 2], rank), ordinary);
            assert!(ordinary.follows_rule());
        }
        // 2, 0, 5, 3 rows of 8 bf16 elements (16 bytes a row).
        let counts = [2, 0, 5, 3];
        let scatter = given(&counts, 2);
        assert!(!scatter.follows_rule());
        assert_eq!(scatter.shape(), Shape::new(10, 8).unwrap());
        let runs: Vec<_> = (0..4).map(|rank| scatter.owned_bytes(rank)).collect();
        assert_eq!(runs, [0..32, 32..32, 32..112, 112..160]);
        assert_eq!((scatter.input_bytes(), scatter.output_bytes()), (160, 80));
        assert_eq!(scatter.check_lengths(160, 80), Ok(()));
        assert_eq!(
            scatter.check_lengths(160, 48).unwrap_err().to_string(),
            "rank 2: the reduce_scatter of 10 x 8 takes an output of 80 bytes on this rank; it \
             holds 48"
        );
        assert_eq!(scatter.layout(MIB, MIB + 32), Ok(RowLayout::InPlace));
        assert!(scatter.layout(MIB, MIB + 48).is_err());
        let layout = RankRows::given(&counts, 4).unwrap();
        let gather = RowMessage::given(Collective::AllGather, 8, &layout, 1, Dtype::Bf16).unwrap();
        assert_eq!((gather.input_bytes(), gather.output_bytes()), (0, 160));
        assert_eq!(
            RowMessage::given(Collective::AllGather, 0, &layout, 1, Dtype::Bf16),
            Err(ShapeError::ZeroWidth { rows: 10 })
        );
        assert_eq!(
            RowMessage::given(Collective::AllGather, 8, &layout, 4, Dtype::Bf16),
            Err(ShapeError::RankOutsideWorld { rank: 4, world: 4 })
        );
    }

    #[test]
    fn a_message_of_more_bytes_than_a_u64_counts_is_refused_naming_its_shape() {
        // 2^63 elements fit a u64; their bytes do not, in any type.
        let shape = Shape::new(1 << 32, 1 << 31).unwrap();
        for (dtype, element_bytes) in [(Dtype::Bf16, 2), (Dtype::Fp32, 4)] {
            for collective in [Collective::ReduceScatter, Collective::AllGather] {
                assert_eq!(
                    RowMessage::new(collective, shape, 2, 1, dtype),
                    Err(ShapeError::TooManyBytes {
                        rows: 1 << 32,
                        width: 1 << 31,
                        element_bytes
                    })
                );
            }
        }
        let refused = RowMessage::new(Collective::AllGather, shape, 2, 0, Dtype::Fp32).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "a message of 4294967296 rows of width 2147483648 in 4-byte elements holds more than \
             2^64 - 1 bytes"
        );
        // The largest that fits is taken, and its byte counts are exact.
        let large = Shape::new(1 << 31, 1 << 30).unwrap();
        let message = RowMessage::new(Collective::ReduceScatter, large, 2, 1, Dtype::Fp32).unwrap();
        assert_eq!(message.message_bytes(), 1 << 63);
        assert_eq!(message.output_bytes(), 1 << 62);
    }

    #[test]
    fn the_two_in_place_layouts_are_taken_and_every_other_overlap_is_refused() {
        // bf16, 10 rows of width 8 on 4 ranks: rank 1 owns rows 3..6, bytes 48..96 of 160.
        let scatter = message(Collective::ReduceScatter, 10, 8, 4, 1);
        assert_eq!(scatter.owned_bytes(1), 48..96);
        assert_eq!(scatter.layout(MIB, MIB + 48), Ok(RowLayout::InPlace));
        assert_eq!(scatter.layout(MIB, 2 * MIB), Ok(RowLayout::Apart));
        assert_eq!(scatter.layout(MIB, MIB + 160), Ok(RowLayout::Apart));
        for output in [MIB, MIB + 16, MIB + 112] {
            let refused = scatter.layout(MIB, output).unwrap_err();
            assert_eq!(
                refused.to_string(),
                "rank 1: the reduce_scatter's output overlaps its input, and not in place (in \
                 place, its output is this rank's rows of its input)",
                "{output:#x}"
            );
        }
        let gather = message(Collective::AllGather, 10, 8, 4, 1);
        assert_eq!(gather.layout(MIB + 48, MIB), Ok(RowLayout::InPlace));
        assert_eq!(gather.layout(MIB + 160, MIB), Ok(RowLayout::Apart));
        assert!(gather.layout(MIB + 50, MIB).is_err());
        assert!(gather.layout(MIB, MIB).is_err());
        // An empty operand never overlaps.
        let none = message(Collective::ReduceScatter, 2, 8, 4, 3);
        assert_eq!(none.layout(MIB, MIB + 8), Ok(RowLayout::Apart));
    }

    #[test]
    fn an_operand_of_another_length_is_refused_by_name() {
        let scatter = message(Collective::ReduceScatter, 10, 8, 4, 1);
        assert_eq!(scatter.check_lengths(160, 48), Ok(()));
        assert_eq!(
            scatter.check_lengths(160, 160).unwrap_err().to_string(),
            "rank 1: the reduce_scatter of 10 x 8 takes an output of 48 bytes on this rank; \
             it holds 160"
        );
        let gather = message(Collective::AllGather, 10, 8, 4, 1);
        assert!(matches!(
            gather.check_lengths(160, 160),
            Err(OperandError::WrongLength {
                operand: "input",
                ..
            })
        ));
    }

    #[test]
    fn peers_read_the_input_at_the_registered_start_and_write_apart_from_it() {
        let start = layout().input_region.start;
        let tensor = 3072 * MIB;
        let output = 3200 * MIB;
        let scatter = message(Collective::ReduceScatter, 64, 1024, 4, 2);
        // Zero copy, apart: nothing moved.
        let plan = plan_rows(PULL, &scatter, start, output, &layout()).unwrap();
        assert_eq!(
            plan,
            RowPlan {
                staged: false,
                input: start,
                output,
                bounce: false
            }
        );
        // Any tensor: moved to the start; written where the caller asked.
        let plan = plan_rows(PULL, &scatter, tensor, output, &layout()).unwrap();
        assert_eq!(
            (plan.staged, plan.input, plan.output),
            (true, start, output)
        );
        // Zero copy in place: a kernel that allows it writes its rows where they are; one
        // that does not writes the private buffer.
        let own = scatter.owned_bytes(2).start;
        let plan = plan_rows(PULL_ALIAS, &scatter, start, start + own, &layout()).unwrap();
        assert_eq!((plan.output, plan.bounce), (start + own, false));
        let plan = plan_rows(PULL, &scatter, start, start + own, &layout()).unwrap();
        assert_eq!(
            (plan.output, plan.bounce),
            (layout().private_output.start, true)
        );
        // The all-gather's own rows go to byte 0; its output in the region past them when it
        // must be written elsewhere and the private buffer is too small.
        let gather = message(Collective::AllGather, 1024, 4096, 4, 1);
        let own = gather.own_bytes();
        let plan = plan_rows(PULL, &gather, tensor + own, tensor, &layout()).unwrap();
        assert_eq!(
            (plan.staged, plan.input, plan.output),
            (true, start, tensor)
        );
        let misaligned = plan_rows(PULL, &gather, tensor, output + 2, &layout()).unwrap();
        assert_eq!((misaligned.output, misaligned.bounce), (start + own, true));
    }

    #[test]
    fn a_local_kernel_reads_an_aligned_input_where_it_is() {
        let tensor = 3072 * MIB;
        let scatter = message(Collective::ReduceScatter, 64, 1024, 4, 2);
        let own = scatter.owned_bytes(2).start;
        // In place on the caller's memory: nothing moved.
        let plan = plan_rows(LOCAL, &scatter, tensor, tensor + own, &layout()).unwrap();
        assert_eq!(
            plan,
            RowPlan {
                staged: false,
                input: tensor,
                output: tensor + own,
                bounce: false
            }
        );
        // A misaligned input is moved to the start, and a misaligned in-place output is
        // written over that copy, then moved.
        let start = layout().input_region.start;
        let plan = plan_rows(LOCAL, &scatter, tensor + 2, tensor + 2 + own, &layout()).unwrap();
        assert_eq!(
            plan,
            RowPlan {
                staged: true,
                input: start,
                output: start + own,
                bounce: true
            }
        );
        // A rank with no rows writes nothing.
        let none = message(Collective::ReduceScatter, 2, 1024, 4, 3);
        let plan = plan_rows(LOCAL, &none, tensor, tensor + 2, &layout()).unwrap();
        assert!(!plan.bounce);
    }

    #[test]
    fn an_output_no_buffer_holds_is_refused() {
        // 16 MiB of output through a 2 MiB private buffer and a full region.
        let gather = message(Collective::AllGather, 8 * 1024, 1024, 2, 0);
        let refused = plan_rows(PULL, &gather, 3072 * MIB, 3200 * MIB + 2, &layout()).unwrap_err();
        assert_eq!(
            refused.to_string(),
            "rank 0: no buffer of this rank holds the all_gather's output of 16777216 bytes, \
             which the kernel cannot write where it is"
        );
    }

    fn accesses() -> impl Strategy<Value = InputAccess> {
        prop_oneof![Just(LOCAL), Just(PULL), Just(PULL_ALIAS)]
    }

    proptest! {
        /// Every plan keeps the kernels' contract: aligned addresses, the input where its
        /// peers read it, nothing written in the scratch or over what the kernel reads but in
        /// place where the kernel allows it, and a move exactly when it writes elsewhere.
        #[test]
        fn every_row_plan_keeps_the_kernel_contract(
            access in accesses(),
            gather in any::<bool>(),
            rows in 0u64..64,
            width in 1u64..600,
            world in 2u32..=8,
            rank_seed in any::<u32>(),
            input_at in prop_oneof![Just(0u64), Just(2), 0u64..40_000],
            output_at in prop_oneof![Just(0u64), Just(2), 0u64..40_000],
            in_place in any::<bool>(),
            region in any::<bool>(),
        ) {
            let collective = if gather { Collective::AllGather } else { Collective::ReduceScatter };
            let rank = rank_seed % world;
            let message = message(collective, rows, width, world, rank);
            let layout = BufferLayout {
                input_region: 1 << 20..(1 << 20) + 64 * 1024,
                scratch: (1 << 20) + 64 * 1024..(1 << 20) + 128 * 1024,
                private_output: 4 << 20..(4 << 20) + 16 * 1024,
            };
            let base = if region { layout.input_region.start } else { 8 << 20 };
            let own = message.owned_bytes(rank).start;
            let (input, output) = match (in_place, collective) {
                (true, Collective::ReduceScatter) => (base + input_at, base + input_at + own),
                (true, _) => (base + output_at + own, base + output_at),
                (false, _) => (base + input_at, (16 << 20) + output_at),
            };
            prop_assume!(message.layout(input, output).is_ok());
            // The input region holds the largest message of every bucket.
            prop_assume!(message.message_bytes() <= 64 * 1024);
            let Ok(plan) = plan_rows(access, &message, input, output, &layout) else {
                return Ok(());
            };
            prop_assert_eq!(plan.input % 16, 0);
            prop_assert_eq!(plan.output % 16, 0);
            prop_assert_eq!(plan.staged, plan.input != input && message.input_bytes() > 0);
            if matches!(access, InputAccess::Peers { .. }) {
                prop_assert_eq!(plan.input, layout.input_region.start);
            }
            let reads = span(plan.input, message.input_bytes());
            let writes = span(plan.output, message.output_bytes());
            prop_assert!(!overlaps(&reads, &layout.scratch));
            prop_assert!(!overlaps(&writes, &layout.scratch));
            if overlaps(&reads, &writes) {
                prop_assert!(access != PULL);
                prop_assert!(message.in_place_partner(plan.input, plan.output));
            }
            if message.output_bytes() > 0 {
                prop_assert_eq!(plan.bounce, plan.output != output);
            }
        }
    }
}
