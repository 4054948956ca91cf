//! When the NCCL fallback sums in rank order, what the rank-order path keeps on a rank (the
//! path itself: `rank_order`), and NCCL's name for an element type.

use crate::gpu::driver::{DeviceBuffer, LoadedKernel};
use crate::gpu::nccl::NcclDataType;
use crate::ladder::{plain_nccl_is_exact, Collective, Dtype};

/// NCCL's name for a ladder's element type.
pub fn nccl_type(dtype: Dtype) -> NcclDataType {
    match dtype {
        Dtype::Bf16 => NcclDataType::Bf16,
        Dtype::Fp16 => NcclDataType::F16,
        Dtype::Fp32 => NcclDataType::F32,
    }
}

/// Whether the NCCL fallback of `collective` sums in rank order: under the exact policy where
/// NCCL's own collective is not exact (an all-reduce or reduce-scatter beyond two ranks). At two
/// ranks NCCL's one addition is the reference sum, an all-gather adds nothing, and under an
/// inexact policy the caller took NCCL's own order.
pub fn rank_order_applies(collective: Collective, world: u32, exact_only: bool) -> bool {
    exact_only && !plain_nccl_is_exact(collective, world)
}

/// The sum kernel and its scratch on this rank.
#[derive(Debug)]
pub(super) struct RankOrder {
    pub(super) kernel: LoadedKernel,
    // `world` slots of `slot_bytes(pass_elements)`.
    pub(super) scratch: DeviceBuffer,
    // The most elements one pass takes.
    pub(super) pass_elements: usize,
    pub(super) dtype: Dtype,
}

#[cfg(test)]
mod tests {
    use super::rank_order_applies;
    use crate::ladder::Collective;

    #[test]
    fn the_fallback_sums_in_rank_order_beyond_two_ranks_under_the_exact_policy_only() {
        for collective in [Collective::AllReduce, Collective::ReduceScatter] {
            // Two ranks: NCCL's one addition is the reference sum, whatever the policy.
            assert!(!rank_order_applies(collective, 2, true));
            assert!(!rank_order_applies(collective, 2, false));
            for world in 3..=8 {
                assert!(rank_order_applies(collective, world, true), "{world}");
                assert!(!rank_order_applies(collective, world, false), "{world}");
            }
        }
    }

    #[test]
    fn an_all_gather_never_sums_in_rank_order() {
        for world in 2..=8 {
            for exact_only in [true, false] {
                assert!(!rank_order_applies(
                    Collective::AllGather,
                    world,
                    exact_only
                ));
            }
        }
    }
}
