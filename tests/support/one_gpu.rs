//! What the ranks-on-one-GPU tests (tests/gpu/ranks_on_one_gpu.rs) decide without a GPU: how
//! many blocks each rank launches when every rank of the world shares one GPU, and how a run
//! that passed its deadline is judged from the blocks' arrival words.

use prepare::device::Residency;

/// How every rank launches a candidate when the world shares one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LaunchPlan {
    /// The bucket's own geometry: every rank's blocks fit at once.
    Own,
    /// Fewer blocks than the bucket's (the kernels take any count): the most that fit at once
    /// for every rank, a whole number of clusters in a clustered bucket.
    Reduced {
        /// Blocks each rank launches.
        blocks: u32,
    },
    /// Not even one block (or cluster) per rank fits at once.
    Impossible,
}

impl LaunchPlan {
    /// Blocks each rank launches, given the bucket's own count.
    pub fn blocks(self, own: u32) -> Option<u32> {
        match self {
            LaunchPlan::Own => Some(own),
            LaunchPlan::Reduced { blocks } => Some(blocks),
            LaunchPlan::Impossible => None,
        }
    }
}

/// The plan for `world` ranks on one GPU of a candidate that needs `needed` resident at once
/// for one rank, where the occupancy query allows `capacity` on the whole GPU at that geometry
/// (the same unit: clusters of `cluster_size` blocks for a clustered bucket, else blocks), on a
/// GPU of `sms` multiprocessors. The ranks' blocks together take at most one multiprocessor
/// each (a cluster, `cluster_size` of them): kernels of different streams sharing
/// multiprocessors were seen on an H200 not to start together (every block of a rank began
/// after its peers' deadline, as the arrival words showed) even where the occupancy query
/// allowed them all. Units that differ prove nothing: the plan is then impossible, as the
/// residency rule drops such a candidate.
pub fn plan_launch(
    needed: Residency,
    capacity: Residency,
    world: u32,
    cluster_size: Option<u32>,
    sms: u32,
) -> LaunchPlan {
    let (needed, capacity, blocks_per_unit) = match (needed, capacity, cluster_size) {
        (Residency::Blocks(needed), Residency::Blocks(capacity), None) => {
            (needed, capacity.min(sms), 1)
        }
        (Residency::Clusters(needed), Residency::Clusters(capacity), Some(size)) => {
            (needed, capacity.min(sms / size.max(1)), size)
        }
        _ => return LaunchPlan::Impossible,
    };
    if u64::from(needed) * u64::from(world) <= u64::from(capacity) {
        return LaunchPlan::Own;
    }
    match capacity / world.max(1) {
        0 => LaunchPlan::Impossible,
        units => LaunchPlan::Reduced {
            blocks: units * blocks_per_unit,
        },
    }
}

/// How a run whose kernels left an abort word is judged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Every block of every rank began its launch before the first of them could give up: the
    /// abort is the kernel's.
    KernelAborted,
    /// Some blocks began only after the first block's deadline had passed, or never: the
    /// ranks' kernels did not run at once on the GPU, which CUDA does not promise for kernels
    /// on different streams. Neither a pass nor the kernel's failure.
    NotCoScheduled {
        /// `(rank, block)` of every block that never began.
        never: Vec<(usize, usize)>,
        /// `(rank, block)` of every block that began past the first one's deadline.
        late: Vec<(usize, usize)>,
    },
}

/// Judges an aborted run from each rank's arrival words before and after it (one a block: when
/// it last began a launch, in nanoseconds), for launches of which the first `recording` blocks
/// stamp their arrival (every block of an ordinary kernel, the first cluster's of a cluster
/// kernel), on the ranks that launched (`launched[rank]`), under a deadline of `deadline_ns`
/// from each block's start.
pub fn judge_abort(
    before: &[Vec<u64>],
    after: &[Vec<u64>],
    recording: usize,
    launched: &[bool],
    deadline_ns: u64,
) -> Verdict {
    let mut never = Vec::new();
    let mut began = Vec::new();
    for (rank, (before, after)) in before.iter().zip(after).enumerate() {
        if !launched[rank] {
            continue;
        }
        for block in 0..recording {
            if after[block] == before[block] {
                never.push((rank, block));
            } else {
                began.push(((rank, block), after[block]));
            }
        }
    }
    let first = began.iter().map(|&(_, start)| start).min().unwrap_or(0);
    let late: Vec<(usize, usize)> = began
        .iter()
        .filter(|&&(_, start)| start - first > deadline_ns)
        .map(|&(place, _)| place)
        .collect();
    if never.is_empty() && late.is_empty() {
        Verdict::KernelAborted
    } else {
        Verdict::NotCoScheduled { never, late }
    }
}
