//! When the NCCL fallback sums in rank order, and what the rank-order path keeps on a rank
//! (the path itself: `rank_order`).

use crate::gpu::driver::{DeviceBuffer, LoadedKernel};
use crate::ladder::Dtype;

/// Whether the NCCL fallback sums in rank order: beyond two ranks under the exact policy. At
/// two ranks NCCL's one addition is the reference sum; under an inexact policy the caller took
/// NCCL's own order.
pub fn rank_order_applies(world: u32, exact_only: bool) -> bool {
    world > 2 && exact_only
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

    #[test]
    fn the_fallback_sums_in_rank_order_beyond_two_ranks_under_the_exact_policy_only() {
        // Two ranks: NCCL's one addition is the reference sum, whatever the policy.
        assert!(!rank_order_applies(2, true));
        assert!(!rank_order_applies(2, false));
        for world in 3..=8 {
            assert!(rank_order_applies(world, true), "{world}");
            assert!(!rank_order_applies(world, false), "{world}");
        }
    }
}
