//! The ranks-on-one-GPU tests' decisions, against synthetic occupancy limits and arrival words:
//! the block count each rank launches, and when a run that passed its deadline is called "not
//! co-scheduled" rather than the kernel's failure.

use prepare::device::Residency;

use crate::support::one_gpu::{judge_abort, plan_launch, LaunchPlan, Verdict};

#[test]
fn every_rank_keeps_the_buckets_geometry_while_all_fit_at_once() {
    // 132 SMs x 2 blocks: 264 blocks at once.
    let capacity = Residency::Blocks(264);
    assert_eq!(
        plan_launch(Residency::Blocks(32), capacity, 8, None, 1000),
        LaunchPlan::Own
    );
    assert_eq!(
        plan_launch(Residency::Blocks(132), capacity, 2, None, 1000),
        LaunchPlan::Own
    );
    // Exactly full is still at once.
    assert_eq!(
        plan_launch(Residency::Blocks(33), capacity, 8, None, 1000),
        LaunchPlan::Own
    );
}

#[test]
fn ranks_that_do_not_fit_share_what_does_equally() {
    let capacity = Residency::Blocks(264);
    assert_eq!(
        plan_launch(Residency::Blocks(64), capacity, 8, None, 1000),
        LaunchPlan::Reduced { blocks: 33 }
    );
    assert_eq!(
        plan_launch(Residency::Blocks(128), capacity, 4, None, 1000),
        LaunchPlan::Reduced { blocks: 66 }
    );
    assert_eq!(
        plan_launch(Residency::Blocks(34), capacity, 8, None, 1000).blocks(34),
        Some(33)
    );
    assert_eq!(
        plan_launch(Residency::Blocks(1), Residency::Blocks(7), 8, None, 1000),
        LaunchPlan::Impossible
    );
}

#[test]
fn clustered_buckets_are_reduced_by_whole_clusters() {
    // 62 clusters of 8 x 512 at once on an H200.
    let capacity = Residency::Clusters(62);
    assert_eq!(
        plan_launch(Residency::Clusters(8), capacity, 4, Some(8), 1000),
        LaunchPlan::Own
    );
    assert_eq!(
        plan_launch(Residency::Clusters(8), capacity, 8, Some(8), 1000),
        LaunchPlan::Reduced { blocks: 56 }
    );
    assert_eq!(
        plan_launch(
            Residency::Clusters(8),
            Residency::Clusters(7),
            8,
            Some(8),
            1000
        ),
        LaunchPlan::Impossible
    );
}

#[test]
fn the_ranks_together_take_at_most_one_multiprocessor_a_block() {
    // 132 SMs, two blocks of 512 threads each by occupancy: 8 ranks get 16 blocks, not 33.
    let capacity = Residency::Blocks(264);
    assert_eq!(
        plan_launch(Residency::Blocks(16), capacity, 8, None, 132),
        LaunchPlan::Own
    );
    assert_eq!(
        plan_launch(Residency::Blocks(32), capacity, 8, None, 132),
        LaunchPlan::Reduced { blocks: 16 }
    );
    assert_eq!(
        plan_launch(Residency::Blocks(128), capacity, 2, None, 132),
        LaunchPlan::Reduced { blocks: 66 }
    );
    // Clusters of 8: 16 of them on 132 SMs, two a rank at 8 ranks.
    assert_eq!(
        plan_launch(
            Residency::Clusters(8),
            Residency::Clusters(62),
            8,
            Some(8),
            132
        ),
        LaunchPlan::Reduced { blocks: 16 }
    );
    assert_eq!(
        plan_launch(
            Residency::Clusters(8),
            Residency::Clusters(62),
            2,
            Some(8),
            132
        ),
        LaunchPlan::Own
    );
}

#[test]
fn an_occupancy_figure_in_the_wrong_unit_plans_nothing() {
    assert_eq!(
        plan_launch(
            Residency::Clusters(8),
            Residency::Blocks(1000),
            2,
            Some(8),
            1000
        ),
        LaunchPlan::Impossible
    );
    assert_eq!(
        plan_launch(
            Residency::Blocks(8),
            Residency::Clusters(1000),
            2,
            None,
            1000
        ),
        LaunchPlan::Impossible
    );
}

/// A deadline of one second, in nanoseconds.
const SECOND: u64 = 1_000_000_000;

#[test]
fn an_abort_with_every_block_begun_within_the_deadline_is_the_kernels() {
    let before = vec![vec![3, 3, 3, 0], vec![3, 3, 3, 0]];
    let after = vec![
        vec![10 * SECOND, 10 * SECOND + 5, 10 * SECOND + 9, 0],
        vec![10 * SECOND + SECOND / 2, 10 * SECOND, 11 * SECOND, 0],
    ];
    assert_eq!(
        judge_abort(&before, &after, 3, &[true, true], SECOND),
        Verdict::KernelAborted
    );
}

#[test]
fn an_abort_with_blocks_that_never_began_or_began_too_late_is_not_co_scheduled() {
    let before = vec![vec![3, 3, 3], vec![3, 3, 3], vec![0, 0, 0]];
    let after = vec![
        vec![10 * SECOND, 10 * SECOND, 10 * SECOND],
        vec![10 * SECOND, 3, 11 * SECOND + 1],
        vec![0, 0, 0],
    ];
    // Rank 2 did not launch at all: its words say nothing.
    assert_eq!(
        judge_abort(&before, &after, 3, &[true, true, false], SECOND),
        Verdict::NotCoScheduled {
            never: vec![(1, 1)],
            late: vec![(1, 2)],
        }
    );
}
