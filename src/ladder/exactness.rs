//! Which candidates write the reference's bits by construction, per collective and world size:
//! the one policy that validation's default rule, static tuning and the NCCL fallback ask.
//! Qualification still checks every candidate's output; this says which ones can pass.

use super::{Collective, Profile};

/// Whether `profile`, run as `collective` at `world` ranks, writes the reference's bits. Custom
/// kernels and the rank-order NCCL path (`"order": "rank"`) sum in rank order at every world
/// size; plain NCCL as [`plain_nccl_is_exact`] says.
pub fn is_exact(collective: Collective, profile: &Profile, world: u32) -> bool {
    !profile.is_plain_nccl() || plain_nccl_is_exact(collective, world)
}

/// Whether NCCL's own collective (`ncclAllReduce`, `ncclReduceScatter`, `ncclAllGather`) writes
/// the reference's bits at `world` ranks: an all-gather adds nothing, so at every world size;
/// the others add in NCCL's order, which is the reference's only where there is one addition,
/// at two ranks.
pub fn plain_nccl_is_exact(collective: Collective, world: u32) -> bool {
    match collective {
        Collective::AllGather => true,
        Collective::AllReduce | Collective::ReduceScatter | Collective::AllReduceAddRmsNorm => {
            world == 2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(json: serde_json::Value) -> Profile {
        serde_json::from_value(json).expect("a profile")
    }

    #[test]
    fn an_all_gather_is_exact_with_every_candidate_at_every_world_size() {
        let candidates = [
            profile(serde_json::json!({"id": "nccl", "algorithm": "nccl"})),
            profile(serde_json::json!({"id": "ctas", "algorithm": "nccl", "max_ctas": 4})),
            profile(serde_json::json!({"id": "pull", "algorithm": "one_shot"})),
            profile(serde_json::json!({"id": "push", "algorithm": "one_shot", "transfer": "push"})),
        ];
        for world in 2..=8 {
            assert!(plain_nccl_is_exact(Collective::AllGather, world), "{world}");
            for candidate in &candidates {
                assert!(
                    is_exact(Collective::AllGather, candidate, world),
                    "{} at {world}",
                    candidate.id
                );
            }
        }
    }

    #[test]
    fn plain_nccl_sums_exactly_only_at_two_ranks_and_the_rank_order_path_everywhere() {
        let plain = profile(serde_json::json!({"id": "nccl", "algorithm": "nccl"}));
        let ctas = profile(serde_json::json!({"id": "nccl_4", "algorithm": "nccl", "max_ctas": 4}));
        let rank_order =
            profile(serde_json::json!({"id": "exact", "algorithm": "nccl", "order": "rank"}));
        let custom = profile(serde_json::json!({"id": "pull", "algorithm": "one_shot"}));
        for collective in [
            Collective::AllReduce,
            Collective::ReduceScatter,
            Collective::AllReduceAddRmsNorm,
        ] {
            for world in 2..=8 {
                let two = world == 2;
                assert_eq!(plain_nccl_is_exact(collective, world), two);
                assert_eq!(
                    is_exact(collective, &plain, world),
                    two,
                    "{collective} {world}"
                );
                assert_eq!(
                    is_exact(collective, &ctas, world),
                    two,
                    "{collective} {world}"
                );
                assert!(
                    is_exact(collective, &rank_order, world),
                    "{collective} {world}"
                );
                assert!(is_exact(collective, &custom, world), "{collective} {world}");
            }
        }
    }
}
