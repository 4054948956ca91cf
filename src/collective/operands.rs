//! Where one all-reduce's message and sum lie, and what is copied around a custom kernel so
//! that it reads and writes only what its contract allows: a pure plan over device addresses.
//!
//! Besides the caller's memory, a plan uses two places of this rank's:
//!
//! - the registered buffer's input region, from its start. Peers read it only inside a launch
//!   of a kernel whose peers read this rank's message, and every such launch ends on this rank
//!   only once the peers are done with it (one-shot pull and the copy-engine one-shot: their
//!   end barrier; RSAG pull: every owner has read its slice before this rank can gather it),
//!   while the next such launch reads it only after its start barrier, which this rank reaches
//!   only after everything it enqueued before. So between launches, and inside a launch whose
//!   peers do not read this rank's message, the region is this rank's to write: a message is
//!   copied there for a kernel whose peers read it, and a sum the caller's output cannot take
//!   is written there and copied out after the kernel;
//! - the private output buffer (not peer-mapped), small: the sum of a kernel whose peers read
//!   this rank's input region until the launch ends (one-shot pull, the copy-engine one-shot),
//!   and the chunk through which a message is moved between overlapping ranges.

use std::ops::Range;

use crate::gpu::driver::{CallerMemory, DeviceMemory as _};
use crate::kernels::{self, InputAccess};
use crate::runtime::OperandError;

/// The least the private output buffer holds: a move between overlapping ranges (a message in
/// the registered buffer off its start, copied to the start; a sum copied out to an output
/// that overlaps where it was written) goes through the private buffer in chunks of its size.
pub const MOVE_CHUNK_BYTES: u64 = 2 << 20;

/// The memory one all-reduce reads its message from and writes its sum to, on this rank's GPU;
/// the same memory for an all-reduce in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operands {
    /// The message.
    pub input: CallerMemory,
    /// Where the sum goes.
    pub output: CallerMemory,
}

impl Operands {
    /// Whether a message of `bytes` may be all-reduced in consecutive pieces: the output is the
    /// input (each piece in place) or lies apart from it, so no piece writes what a later piece
    /// still reads.
    pub fn may_be_chunked(&self, bytes: u64) -> bool {
        self.input.address() == self.output.address()
            || !overlaps(
                &span(self.input.address(), bytes),
                &span(self.output.address(), bytes),
            )
    }

    /// Refuses a message of `bytes` that the input or the output does not hold.
    pub fn check_lengths(&self, bytes: u64) -> Result<(), OperandError> {
        for (operand, memory) in [("input", &self.input), ("output", &self.output)] {
            if (memory.len_bytes() as u64) < bytes {
                return Err(OperandError::TooShort {
                    operand,
                    holds: memory.len_bytes(),
                    bytes,
                });
            }
        }
        Ok(())
    }

    /// Refuses `what`, a message of `bytes` to go in consecutive pieces, that the operands do
    /// not hold or whose output partly overlaps its input ([`Operands::may_be_chunked`]).
    pub fn check_chunkable(&self, bytes: u64, what: &str) -> Result<(), OperandError> {
        self.check_lengths(bytes)?;
        if self.may_be_chunked(bytes) {
            return Ok(());
        }
        Err(OperandError::PartlyOverlapping {
            what: what.to_owned(),
        })
    }
}

/// Where a custom kernel reads and writes one all-reduce, and what is copied around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperandPlan {
    /// The message is moved to the registered buffer's start before the kernel ([`moves`]).
    pub staged: bool,
    /// The address the kernel reads this rank's message from.
    pub input: u64,
    /// The address the kernel writes the sum to.
    pub output: u64,
    /// The kernel writes the sum elsewhere than the caller's output (the registered buffer's
    /// input region or the private output buffer); it is moved there after the kernel
    /// ([`moves`]).
    pub bounce: bool,
}

/// This rank's buffers, as device address ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferLayout {
    /// The registered buffer's input region (peers read a message there from its start).
    pub input_region: Range<u64>,
    /// The registered buffer's scratch, after the input region.
    pub scratch: Range<u64>,
    /// The private output buffer: at least [`MOVE_CHUNK_BYTES`], and at least any message a
    /// kernel whose peers read the input region until its launch ends takes.
    pub private_output: Range<u64>,
}

/// One copy of `bytes` from `source` to `destination`, device addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedCopy {
    /// Where the bytes go.
    pub destination: u64,
    /// Where they come from.
    pub source: u64,
    /// How many.
    pub bytes: u64,
}

/// Where a kernel of `access` reads and writes a message of `bytes` at `input`, summed to
/// `output`. The rules:
///
/// - The kernel reads the message where it is when it may: a local kernel (it reads only
///   `input`) given a 16-byte aligned message outside the scratch, any kernel given the message
///   at the registered buffer's start. Otherwise the message is moved to that start first.
/// - It writes `output` directly when that is 16-byte aligned, is what it reads (in place) or
///   lies apart from it, is not in the scratch, and is not in the input region while peers
///   read there until the launch ends (one-shot pull, the copy-engine one-shot).
/// - Otherwise it writes elsewhere and the sum is moved to `output` after it: into the private
///   output buffer for a kernel whose peers read the input region until the end; over the copy
///   it reads, when the message was moved to the registered buffer's start; and when it reads
///   the caller's own message, which an out-of-place all-reduce keeps, at the input region's
///   start if that lies apart from the message, else just past the message if the region has
///   room, else into the private buffer if the sum fits, and only else over the message (the
///   caller's input then holds the sum).
///
/// `None` when the sum must go to the private buffer and does not fit there: a message larger
/// than the buffer was sized for (see [`private_output_bytes`](super::private_output_bytes)).
pub fn plan_operands(
    access: InputAccess,
    input: u64,
    output: u64,
    bytes: u64,
    layout: &BufferLayout,
) -> Option<OperandPlan> {
    let aligned = |address: u64| address % kernels::ALIGNMENT_BYTES == 0;
    let start = layout.input_region.start;
    let reads_where_it_is = match access {
        InputAccess::Local => aligned(input) && !overlaps(&span(input, bytes), &layout.scratch),
        InputAccess::Peers { .. } => input == start,
    };
    let kernel_input = if reads_where_it_is { input } else { start };
    let reads = span(kernel_input, bytes);
    let peers_read_until_end = access
        == InputAccess::Peers {
            output_may_alias: false,
        };
    let writable = aligned(output)
        && (output == kernel_input || !overlaps(&span(output, bytes), &reads))
        && !(peers_read_until_end && overlaps(&span(output, bytes), &layout.input_region))
        && !overlaps(&span(output, bytes), &layout.scratch);
    let private = layout.private_output.start;
    let fits_private = bytes <= layout.private_output.end - layout.private_output.start;
    let kernel_output = if writable {
        output
    } else if peers_read_until_end {
        if !fits_private {
            return None;
        }
        private
    } else if !reads_where_it_is {
        kernel_input
    } else {
        let past = start + bytes.next_multiple_of(kernels::ALIGNMENT_BYTES);
        [start, past]
            .into_iter()
            .find(|&target| {
                target.saturating_add(bytes) <= layout.input_region.end
                    && !overlaps(&span(target, bytes), &reads)
            })
            .or_else(|| fits_private.then_some(private))
            .unwrap_or(kernel_input)
    };
    Some(OperandPlan {
        staged: !reads_where_it_is,
        input: kernel_input,
        output: kernel_output,
        bounce: kernel_output != output,
    })
}

/// The copies that move `bytes` from `source` to `destination`, in order: none when they are
/// the same, one when the ranges lie apart, and otherwise chunk by chunk through `private` (a
/// copy whose source and destination overlap is undefined), each chunk as large as `private`
/// and copied into it, then out to its place. Below the source the chunks go front to back,
/// above it back to front, so no chunk is overwritten before it was read.
pub fn moves(destination: u64, source: u64, bytes: u64, private: &Range<u64>) -> Vec<PlannedCopy> {
    if destination == source || bytes == 0 {
        return Vec::new();
    }
    if !overlaps(&span(destination, bytes), &span(source, bytes)) {
        return vec![PlannedCopy {
            destination,
            source,
            bytes,
        }];
    }
    let chunk = (private.end - private.start).max(1);
    let mut chunks: Vec<(u64, u64)> = Vec::new();
    let mut offset = 0;
    while offset < bytes {
        chunks.push((offset, chunk.min(bytes - offset)));
        offset += chunk;
    }
    if destination > source {
        chunks.reverse();
    }
    chunks
        .into_iter()
        .flat_map(|(offset, length)| {
            [
                PlannedCopy {
                    destination: private.start,
                    source: source + offset,
                    bytes: length,
                },
                PlannedCopy {
                    destination: destination + offset,
                    source: private.start,
                    bytes: length,
                },
            ]
        })
        .collect()
}

pub(super) fn span(start: u64, bytes: u64) -> Range<u64> {
    start..start.saturating_add(bytes)
}

pub(super) fn overlaps(a: &Range<u64>, b: &Range<u64>) -> bool {
    a.start < b.end && b.start < a.end && !a.is_empty() && !b.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gpu::driver::DeviceMemory;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    const LOCAL: InputAccess = InputAccess::Local;
    const PULL: InputAccess = InputAccess::Peers {
        output_may_alias: false,
    };
    const GATHER: InputAccess = InputAccess::Peers {
        output_may_alias: true,
    };

    /// A registered buffer at 1 GiB (16 MiB of input region, then 48 MiB of scratch) and a
    /// private output buffer of 2 MiB at 2 GiB.
    fn layout() -> BufferLayout {
        BufferLayout {
            input_region: 1024 * MIB..1040 * MIB,
            scratch: 1040 * MIB..1088 * MIB,
            private_output: 2048 * MIB..2050 * MIB,
        }
    }

    fn accesses() -> impl Strategy<Value = InputAccess> {
        prop_oneof![Just(LOCAL), Just(PULL), Just(GATHER)]
    }

    fn plan(access: InputAccess, input: u64, output: u64, bytes: u64) -> OperandPlan {
        plan_operands(access, input, output, bytes, &layout()).expect("the sum fits")
    }

    #[test]
    fn zero_copy_and_aligned_tensors_take_no_copy_where_the_kernel_allows() {
        let registered = layout().input_region.start;
        let tensor = 3072 * MIB;
        let output = 3200 * MIB;
        let plan = |access, input, output| plan(access, input, output, 4096);
        // Zero copy, out of place: nothing copied for any kernel.
        for access in [LOCAL, PULL, GATHER] {
            let zero_copy = plan(access, registered, output);
            assert_eq!((zero_copy.staged, zero_copy.bounce), (false, false));
        }
        // Zero copy in place: only the one-shot pull and the copy engine write elsewhere, into
        // the private buffer.
        assert!(!plan(LOCAL, registered, registered).bounce);
        assert!(!plan(GATHER, registered, registered).bounce);
        assert_eq!(
            plan(PULL, registered, registered).output,
            layout().private_output.start
        );
        // Any tensor: the local kernels read it where it is, in place too; the others get it
        // copied, and then write the caller's memory directly.
        let local = plan(LOCAL, tensor, tensor);
        assert_eq!(
            (local.staged, local.input, local.bounce),
            (false, tensor, false)
        );
        let pulled = plan(PULL, tensor, tensor);
        assert_eq!(
            (pulled.staged, pulled.output, pulled.bounce),
            (true, tensor, false)
        );
    }

    #[test]
    fn a_sum_the_output_cannot_take_goes_through_the_input_region() {
        let registered = layout().input_region.start;
        let tensor = 3072 * MIB;
        let output = 3200 * MIB;
        // A local kernel reading a tensor elsewhere writes a misaligned or overlapping output's
        // sum at the region's start.
        for caller_output in [output + 2, tensor + 16, tensor + 2] {
            let local = plan(LOCAL, tensor, caller_output, 4 * MIB);
            assert_eq!(
                (local.staged, local.input, local.output, local.bounce),
                (false, tensor, registered, true),
                "{caller_output:#x}"
            );
        }
        // A misaligned message is copied to the start and summed over its copy, by every
        // kernel but the one-shot pull, which writes the private buffer.
        for access in [LOCAL, GATHER] {
            let misaligned = plan(access, tensor + 2, output + 2, 4 * MIB);
            assert_eq!(
                (misaligned.staged, misaligned.output, misaligned.bounce),
                (true, registered, true)
            );
        }
        let pulled = plan(PULL, tensor + 2, output + 2, MIB);
        assert_eq!(pulled.output, layout().private_output.start);
        // Larger than the private buffer: the one-shot pull has no place for its sum (the
        // buffer is sized so that it never gets such a message).
        assert_eq!(
            plan_operands(PULL, tensor, registered, 4 * MIB, &layout()),
            None
        );
    }

    #[test]
    fn a_zero_copy_message_out_of_place_is_kept_while_there_is_room() {
        let registered = layout().input_region.start;
        let misaligned = 3200 * MIB + 2;
        // Past the message in the region while both fit (16 MiB).
        for access in [LOCAL, GATHER] {
            let small = plan(access, registered, misaligned, 4 * MIB);
            assert_eq!(
                (small.staged, small.input, small.output),
                (false, registered, registered + 4 * MIB)
            );
            // Then nowhere but over the message.
            let large = plan(access, registered, misaligned, 12 * MIB);
            assert_eq!((large.input, large.output), (registered, registered));
        }
        // The private buffer between the two, where the region is small.
        let small_region = BufferLayout {
            input_region: registered..registered + 2 * MIB,
            scratch: registered + 2 * MIB..registered + 4 * MIB,
            private_output: layout().private_output,
        };
        let through_private =
            plan_operands(LOCAL, registered, misaligned, 3 * MIB / 2, &small_region).unwrap();
        assert_eq!(through_private.output, layout().private_output.start);
    }

    #[test]
    fn moves_between_overlapping_ranges_go_through_the_private_buffer_in_order() {
        let private = 100..104;
        // Each copy as (destination, source, bytes).
        let copies = |copies: &[(u64, u64, u64)]| -> Vec<PlannedCopy> {
            copies
                .iter()
                .map(|&(destination, source, bytes)| PlannedCopy {
                    destination,
                    source,
                    bytes,
                })
                .collect()
        };
        assert_eq!(moves(0, 0, 8, &private), copies(&[]));
        assert_eq!(moves(0, 8, 8, &private), copies(&[(0, 8, 8)]));
        // Down by 2: front to back.
        assert_eq!(
            moves(0, 2, 6, &private),
            copies(&[(100, 2, 4), (0, 100, 4), (100, 6, 2), (4, 100, 2)])
        );
        // Up by 2: back to front.
        assert_eq!(
            moves(2, 0, 6, &private),
            copies(&[(100, 4, 2), (6, 100, 2), (100, 0, 4), (2, 100, 4)])
        );
    }

    /// A byte of the simulated memory: what first lay at an address, or a byte of the sum.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Byte {
        Initial(u64),
        Sum(u64),
    }

    /// The simulated address space: the caller's memory below 16 KiB, the registered buffer
    /// (4 KiB of input region, 4 KiB of scratch), nothing, then a private buffer of 3 KiB
    /// (more than half the region, so that each place a sum may go is taken by some message).
    const SPACE: u64 = 35 * 1024;

    fn small_layout() -> BufferLayout {
        BufferLayout {
            input_region: 16 * 1024..20 * 1024,
            scratch: 20 * 1024..24 * 1024,
            private_output: 32 * 1024..35 * 1024,
        }
    }

    /// Addresses a caller may pass: its own memory, the input region (its start or off it)
    /// and the scratch, aligned or not.
    fn small_addresses() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(16 * 1024),
            Just(16 * 1024 + 2),
            (0_u64..4 * 1024).prop_map(|offset| 16 * 1024 + offset * 2),
            (0_u64..6 * 1024).prop_map(|offset| offset * 2),
            (0_u64..384).prop_map(|offset| offset * 16),
        ]
    }

    /// Runs `copies` on `memory`, each between ranges apart, and none into the scratch but
    /// into the caller's `output` (where a caller may have asked for it).
    fn run_copies(
        memory: &mut [Byte],
        copies: &[PlannedCopy],
        layout: &BufferLayout,
        output: &Range<u64>,
    ) -> Result<(), TestCaseError> {
        for copy in copies {
            let to = span(copy.destination, copy.bytes);
            let from = span(copy.source, copy.bytes);
            prop_assert!(!overlaps(&to, &from), "an overlapping copy: {copy:?}");
            let into_output = output.start <= to.start && to.end <= output.end;
            prop_assert!(
                into_output || !overlaps(&to, &layout.scratch),
                "a copy into the scratch"
            );
            let bytes: Vec<Byte> = memory[from.start as usize..from.end as usize].to_vec();
            memory[to.start as usize..to.end as usize].copy_from_slice(&bytes);
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the caller passes, the kernel gets what its contract asks for, and the sum
        /// reaches the caller's output: the copies, the kernel and the copies after it run on
        /// a simulated memory.
        #[test]
        fn every_plan_keeps_the_kernel_contract_and_delivers_the_sum(
            access in accesses(),
            input in small_addresses(),
            in_place in any::<bool>(),
            output in small_addresses(),
            elements in 1_u64..=2048,
        ) {
            let layout = small_layout();
            let private_bytes = layout.private_output.end - layout.private_output.start;
            // The private buffer holds every message of a kernel whose peers read until the end.
            let elements = if access == PULL {
                elements % (private_bytes / 2) + 1
            } else {
                elements
            };
            let bytes = elements * 2;
            let output = if in_place { input } else { output };
            let plan = plan_operands(access, input, output, bytes, &layout)
                .expect("the private buffer holds the message");
            let private = layout.private_output.clone();
            let start = layout.input_region.start;
            let mut memory: Vec<Byte> = (0..SPACE).map(Byte::Initial).collect();

            // Before the kernel: the message where the kernel reads it.
            prop_assert_eq!(plan.staged, plan.input != input);
            if plan.staged {
                prop_assert_eq!(plan.input, start);
                let copies = moves(plan.input, input, bytes, &private);
                run_copies(&mut memory, &copies, &layout, &(0..0))?;
            }
            // The kernel: aligned addresses; a kernel whose peers read the message reads it at
            // the registered start; it reads nothing peers write (the scratch) and writes
            // nothing peers may read (the scratch; the input region while they read it until
            // the end) and nothing it reads but its input exactly, in place.
            prop_assert_eq!(plan.input % 16, 0);
            prop_assert_eq!(plan.output % 16, 0);
            if access != LOCAL {
                prop_assert_eq!(plan.input, start);
            }
            let reads = span(plan.input, bytes);
            let writes = span(plan.output, bytes);
            prop_assert!(plan.output == plan.input || !overlaps(&reads, &writes));
            prop_assert!(!overlaps(&reads, &layout.scratch));
            prop_assert!(!overlaps(&writes, &layout.scratch));
            if access == PULL {
                prop_assert!(!overlaps(&writes, &layout.input_region));
            }
            for index in 0..bytes {
                prop_assert_eq!(
                    memory[(plan.input + index) as usize],
                    Byte::Initial(input + index),
                    "the kernel reads the message"
                );
            }
            for index in 0..bytes {
                memory[(plan.output + index) as usize] = Byte::Sum(index);
            }
            // After it: the sum in the caller's output.
            prop_assert_eq!(plan.bounce, plan.output != output);
            if plan.bounce {
                let copies = moves(output, plan.output, bytes, &private);
                run_copies(&mut memory, &copies, &layout, &span(output, bytes))?;
            }
            for index in 0..bytes {
                prop_assert_eq!(memory[(output + index) as usize], Byte::Sum(index));
            }
            // Nothing changed but the output, the input region and the private buffer.
            let written = span(output, bytes);
            for address in 0..SPACE {
                let allowed = [&written, &layout.input_region, &private]
                    .iter()
                    .any(|range| range.contains(&address));
                if !allowed {
                    prop_assert_eq!(memory[address as usize], Byte::Initial(address));
                }
            }
            // Out of place, the input is kept, unless it lies in the registered buffer off its
            // start, or at the start while neither the rest of the region nor the private
            // buffer holds the sum.
            let message = span(input, bytes);
            let registered = layout.input_region.start..layout.scratch.end;
            let region_bytes = layout.input_region.end - start;
            let room = 2 * bytes.next_multiple_of(16) <= region_bytes || bytes <= private_bytes;
            let kept = !overlaps(&message, &written)
                && (!overlaps(&message, &registered) || (input == start && room));
            if kept {
                for index in 0..bytes {
                    prop_assert_eq!(
                        memory[(input + index) as usize],
                        Byte::Initial(input + index),
                        "the input is kept"
                    );
                }
            }
        }

        /// The copies of a move leave the destination as one copy between ranges apart would.
        #[test]
        fn moves_copy_as_if_through_a_buffer_of_the_whole_message(
            destination in 0_u64..4096,
            source in 0_u64..4096,
            bytes in 0_u64..4096,
            chunk in 1_u64..600,
        ) {
            let private = 10_000..10_000 + chunk;
            let mut memory: Vec<Byte> = (0..10_600).map(Byte::Initial).collect();
            let layout = BufferLayout {
                input_region: 0..0,
                scratch: 20_000..20_000,
                private_output: private.clone(),
            };
            let copies = moves(destination, source, bytes, &private);
            run_copies(&mut memory, &copies, &layout, &(0..0))?;
            for index in 0..bytes {
                prop_assert_eq!(
                    memory[(destination + index) as usize],
                    Byte::Initial(source + index)
                );
            }
        }
    }

    /// Device memory at `address` of `bytes`, as a caller's.
    fn memory(address: u64, bytes: usize) -> CallerMemory {
        struct Range(u64, usize);
        impl DeviceMemory for Range {
            fn address(&self) -> u64 {
                self.0
            }
            fn len_bytes(&self) -> usize {
                self.1
            }
            fn ordinal(&self) -> usize {
                0
            }
        }
        CallerMemory::whole(&Range(address, bytes))
    }

    #[test]
    fn operands_shorter_than_the_message_are_the_callers_mistake() {
        let operands = Operands {
            input: memory(MIB, 4096),
            output: memory(2 * MIB, 1024),
        };
        assert_eq!(operands.check_lengths(1024), Ok(()));
        assert_eq!(
            operands.check_lengths(2048),
            Err(OperandError::TooShort {
                operand: "output",
                holds: 1024,
                bytes: 2048
            })
        );
        let overlapping = Operands {
            input: memory(MIB, 4096),
            output: memory(MIB + 16, 4096),
        };
        assert_eq!(
            overlapping.check_chunkable(4096, "a message in pieces"),
            Err(OperandError::PartlyOverlapping {
                what: "a message in pieces".to_owned()
            })
        );
        assert_eq!(
            overlapping.check_chunkable(8192, "a message in pieces"),
            Err(OperandError::TooShort {
                operand: "input",
                holds: 4096,
                bytes: 8192
            })
        );
    }

    #[test]
    fn pieces_take_an_output_that_is_the_input_or_apart_from_it() {
        let operands = |input, output| Operands {
            input: memory(input, 4096),
            output: memory(output, 4096),
        };
        assert!(operands(MIB, MIB).may_be_chunked(4096));
        assert!(operands(MIB, MIB + 4096).may_be_chunked(4096));
        assert!(operands(MIB + 4096, MIB).may_be_chunked(4096));
        // Partly overlapping, either way round: a piece would overwrite a later piece's input.
        assert!(!operands(MIB, MIB + 16).may_be_chunked(4096));
        assert!(!operands(MIB + 16, MIB).may_be_chunked(4096));
        // Only the message counts, not the memory around it.
        assert!(operands(MIB, MIB + 1024).may_be_chunked(1024));
    }
}
