//! Where one all-reduce's message and sum lie, and what is copied around a custom kernel so
//! that it reads and writes only what its contract allows: a pure plan over device addresses.

use crate::gpu::driver::{CallerMemory, DeviceMemory};
use crate::kernels::{self, InputAccess};

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
        let range = |memory: &CallerMemory| {
            let start = memory.address();
            start..start.saturating_add(bytes)
        };
        self.input.address() == self.output.address()
            || !overlaps(&range(&self.input), &range(&self.output))
    }
}

/// How the message reaches a kernel that must read it from the registered buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// It is read where it is.
    None,
    /// It is copied to the registered buffer's start.
    Copy,
    /// It overlaps the registered buffer: copied to the private output buffer, then to the
    /// registered buffer's start (a copy whose source and destination overlap is undefined).
    ThroughPrivate,
}

/// Where a custom kernel reads and writes one all-reduce, and what is copied around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperandPlan {
    /// What is copied before the kernel.
    pub staging: Staging,
    /// The address the kernel reads this rank's message from.
    pub input: u64,
    /// The address the kernel writes the sum to.
    pub output: u64,
    /// The kernel writes the private output buffer, copied to the caller's output after it.
    pub bounce: bool,
}

/// This rank's buffers, as device address ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferLayout {
    /// The registered buffer's input region (peers read a message there from its start).
    pub input_region: std::ops::Range<u64>,
    /// The registered buffer's scratch, after the input region.
    pub scratch: std::ops::Range<u64>,
    /// The private output buffer, large enough for any message.
    pub private_output: u64,
}

/// Where a kernel of `access` reads and writes a message of `bytes` at `input`, summed to
/// `output`. The rules: a kernel whose peers read the message reads it at the registered
/// buffer's start, copied there unless it is there; so does any kernel given a message that is
/// not 16-byte aligned. The kernel writes the private output buffer instead of `output`, and
/// the sum is copied after it, when `output` is misaligned, partly overlaps what the kernel
/// reads, lies in the input region while peers may read it after this rank wrote an element
/// (one-shot pull, the copy-engine one-shot), or touches the scratch.
pub fn plan_operands(
    access: InputAccess,
    input: u64,
    output: u64,
    bytes: u64,
    layout: &BufferLayout,
) -> OperandPlan {
    let aligned = |address: u64| address % kernels::ALIGNMENT_BYTES == 0;
    let message = input..input.saturating_add(bytes);
    let registered = layout.input_region.start;
    let (staging, kernel_input) = if matches!(access, InputAccess::Local) && aligned(input) {
        (Staging::None, input)
    } else if input == registered {
        (Staging::None, registered)
    } else if overlaps(&message, &layout.input_region) || overlaps(&message, &layout.scratch) {
        (Staging::ThroughPrivate, registered)
    } else {
        (Staging::Copy, registered)
    };
    let reads = kernel_input..kernel_input.saturating_add(bytes);
    let written = output..output.saturating_add(bytes);
    let peers_read_input_region = matches!(
        access,
        InputAccess::Peers {
            output_may_alias: false
        }
    );
    let bounce = !aligned(output)
        || (overlaps(&written, &reads) && output != kernel_input)
        || (peers_read_input_region && overlaps(&written, &layout.input_region))
        || overlaps(&written, &layout.scratch);
    OperandPlan {
        staging,
        input: kernel_input,
        output: if bounce {
            layout.private_output
        } else {
            output
        },
        bounce,
    }
}

fn overlaps(a: &std::ops::Range<u64>, b: &std::ops::Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    /// A registered buffer at 1 GiB (16 MiB of input region, then 48 MiB of scratch) and a
    /// private output buffer at 2 GiB.
    fn layout() -> BufferLayout {
        BufferLayout {
            input_region: 1024 * MIB..1040 * MIB,
            scratch: 1040 * MIB..1088 * MIB,
            private_output: 2048 * MIB,
        }
    }

    fn accesses() -> impl Strategy<Value = InputAccess> {
        prop_oneof![
            Just(InputAccess::Local),
            Just(InputAccess::Peers {
                output_may_alias: false
            }),
            Just(InputAccess::Peers {
                output_may_alias: true
            }),
        ]
    }

    /// Addresses around and inside both buffers, aligned or not.
    fn addresses() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(1024 * MIB),
            Just(1024 * MIB + 2),
            (0..64 * MIB).prop_map(|offset| 1024 * MIB + offset),
            (0..64 * MIB).prop_map(|offset| 512 * MIB + offset * 2),
            (0..8 * MIB).prop_map(|offset| 3072 * MIB + offset * 16),
        ]
    }

    fn range(start: u64, bytes: u64) -> std::ops::Range<u64> {
        start..start + bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the caller passes, the kernel gets what its contract asks for.
        #[test]
        fn every_plan_keeps_the_kernel_contract(
            access in accesses(),
            input in addresses(),
            in_place in any::<bool>(),
            output in addresses(),
            elements in 1_u64..4 * MIB,
        ) {
            let bytes = elements * 2;
            let output = if in_place { input } else { output };
            let layout = layout();
            let plan = plan_operands(access, input, output, bytes, &layout);
            // Every address the kernel is given is 16-byte aligned.
            prop_assert_eq!(plan.input % 16, 0);
            prop_assert_eq!(plan.output % 16, 0);
            // A kernel whose peers read the message reads it at the registered start.
            if !matches!(access, InputAccess::Local) {
                prop_assert_eq!(plan.input, layout.input_region.start);
            }
            // The message reaches the kernel: read where it is, or copied where it is read.
            match plan.staging {
                Staging::None => prop_assert_eq!(plan.input, input),
                Staging::Copy => {
                    prop_assert!(!overlaps(&range(input, bytes), &range(plan.input, bytes)));
                }
                Staging::ThroughPrivate => {
                    prop_assert!(overlaps(&range(input, bytes), &layout.input_region)
                        || overlaps(&range(input, bytes), &layout.scratch));
                }
            }
            // The kernel writes over what it reads exactly or not at all, never the scratch,
            // and never the input region while peers may still read it there.
            let reads = range(plan.input, bytes);
            let writes = range(plan.output, bytes);
            prop_assert!(plan.output == plan.input || !overlaps(&reads, &writes));
            prop_assert!(!overlaps(&writes, &layout.scratch));
            if access == (InputAccess::Peers { output_may_alias: false }) {
                prop_assert!(!overlaps(&writes, &layout.input_region));
            }
            // The sum reaches the caller: written there, or copied there from the private buffer.
            prop_assert_eq!(plan.bounce, plan.output != output);
            if plan.bounce {
                prop_assert_eq!(plan.output, layout.private_output);
            }
        }
    }

    #[test]
    fn zero_copy_and_aligned_tensors_take_no_copy_where_the_kernel_allows() {
        let layout = layout();
        let registered = layout.input_region.start;
        let tensor = 3072 * MIB;
        let output = 3200 * MIB;
        let peers = InputAccess::Peers {
            output_may_alias: false,
        };
        let gather = InputAccess::Peers {
            output_may_alias: true,
        };
        let plan = |access, input, output| plan_operands(access, input, output, 4096, &layout);
        // Zero copy, out of place: nothing copied for any kernel.
        for access in [InputAccess::Local, peers, gather] {
            let zero_copy = plan(access, registered, output);
            assert_eq!(
                (zero_copy.staging, zero_copy.bounce),
                (Staging::None, false)
            );
        }
        // Zero copy in place: only the one-shot pull and the copy engine write elsewhere.
        assert!(!plan(InputAccess::Local, registered, registered).bounce);
        assert!(!plan(gather, registered, registered).bounce);
        assert!(plan(peers, registered, registered).bounce);
        // Any tensor: the local kernels read it where it is, in place too; the others get it
        // copied, and then write the caller's memory directly.
        let local = plan(InputAccess::Local, tensor, tensor);
        assert_eq!(
            (local.staging, local.input, local.bounce),
            (Staging::None, tensor, false)
        );
        let pulled = plan(peers, tensor, tensor);
        assert_eq!(
            (pulled.staging, pulled.output, pulled.bounce),
            (Staging::Copy, tensor, false)
        );
        // Misaligned: copied in, and the sum bounced out.
        let misaligned = plan(InputAccess::Local, tensor + 2, output + 2);
        assert_eq!(
            (misaligned.staging, misaligned.bounce),
            (Staging::Copy, true)
        );
        // A view inside the zero-copy region, off its start, for a pull: through the private
        // buffer.
        assert_eq!(
            plan(peers, registered + 32, output).staging,
            Staging::ThroughPrivate
        );
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
