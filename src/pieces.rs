//! Messages above the largest bucket: NCCL on the whole message, or the message in pieces of
//! the largest bucket's largest message, each all-reduced by its bucket's winner
//! ([`Collectives::enqueue_chunked`]). Start-up selection times both at twice the largest
//! bucket's message and decides as it does for a bucket, NCCL being the baseline to beat by the
//! margin; `prepare bench` times both at every size above the ladder.

use crate::collective::{Collectives, EntryId, Operands};
use crate::gpu::driver::{CallerMemory, DeviceBuffer};
use crate::ladder::Ladder;
use crate::package::Outcome;
use crate::runtime::{Runtime, RuntimeError};
use crate::timing::{GroupSamples, Timed, Timer, TimingOptions};
use crate::tune::choice::{AboveLadder, AboveLadderRoute};
use crate::tune::{decide_bucket, BucketDecision, BucketSamples, CandidateSamples, DecisionError};
use crate::tune::{CandidateOutcome, Policy};

/// The two ways to all-reduce a message above the ladder, as entries of the largest bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Contenders {
    /// The largest bucket's plain NCCL entry, run on the whole message.
    pub nccl: EntryId,
    /// The largest bucket's winner, run on every piece.
    pub pieces: EntryId,
}

impl Contenders {
    /// The contenders when the largest bucket's winner `winner` is a custom kernel that runs
    /// here and the bucket has an NCCL candidate that runs; `Err` says why there is nothing to
    /// time (NCCL then takes the whole message).
    pub fn of(
        ladder: &Ladder,
        collectives: &Collectives,
        winner: &str,
    ) -> Result<Contenders, String> {
        let last = ladder
            .buckets
            .len()
            .checked_sub(1)
            .ok_or_else(|| "the ladder has no bucket".to_owned())?;
        let live = |profile: &str| {
            collectives
                .find(last, profile)
                .filter(|&id| collectives.entries()[id].dropped.is_none())
        };
        if ladder
            .profile(winner)
            .is_some_and(crate::ladder::Profile::is_nccl)
        {
            return Err(format!(
                "the largest bucket chose {winner}, NCCL, so pieces would be NCCL too"
            ));
        }
        let pieces = live(winner)
            .ok_or_else(|| format!("the largest bucket's winner {winner} does not run here"))?;
        let nccl = ladder
            .plain_nccl(last)
            .and_then(|profile| live(&profile.id))
            .ok_or_else(|| "the largest bucket has no NCCL candidate that runs here".to_owned())?;
        Ok(Contenders { nccl, pieces })
    }
}

/// Input and output buffers for timing messages above the ladder, allocated for the timing and
/// freed with it; the input is zeroed.
#[derive(Debug)]
pub struct PieceBuffers {
    input: DeviceBuffer,
    output: DeviceBuffer,
}

impl PieceBuffers {
    /// Buffers for messages up to `bytes`.
    pub fn new(runtime: &Runtime, bytes: u64) -> Result<PieceBuffers, RuntimeError> {
        let rank = runtime.rank();
        let bytes = usize::try_from(bytes.max(16)).expect("a message fits the address space");
        let device = runtime.device();
        let allocate = || device.allocate(bytes).map_err(RuntimeError::driver(rank));
        let buffers = PieceBuffers {
            input: allocate()?,
            output: allocate()?,
        };
        let stream = runtime.stream();
        stream
            .fill_u8(&buffers.input, 0..bytes, 0)
            .and_then(|()| stream.synchronize())
            .map_err(RuntimeError::driver(rank))?;
        Ok(buffers)
    }

    /// The operands of a message of `bytes`, out of place.
    pub fn operands(&self, bytes: u64) -> Operands {
        Operands {
            input: CallerMemory::prefix(&self.input, bytes),
            output: CallerMemory::prefix(&self.output, bytes),
        }
    }
}

/// Times NCCL on the whole message against the pieces at `bytes`, in one interleaved group
/// (NCCL first). Collective.
pub fn time_contenders(
    runtime: &Runtime,
    collectives: &Collectives,
    timer: &mut Timer,
    contenders: Contenders,
    buffers: &PieceBuffers,
    bytes: u64,
    timing: TimingOptions,
) -> Result<GroupSamples, RuntimeError> {
    let elements =
        usize::try_from(bytes / collectives.dtype().size_bytes()).expect("a message fits usize");
    let operands = Some(buffers.operands(bytes));
    let entries = [
        Timed {
            id: contenders.nccl,
            elements,
            operands,
            chunked: false,
        },
        Timed {
            id: contenders.pieces,
            elements,
            operands,
            chunked: true,
        },
    ];
    timer.time_operands(runtime, collectives, &entries, timing)
}

/// The decision between NCCL (the baseline) and the pieces from their samples at `bytes`
/// ([`time_contenders`]), made as for a bucket whose index is the number of buckets.
pub fn decide(
    ladder: &Ladder,
    collectives: &Collectives,
    outcomes: &[Outcome],
    contenders: Contenders,
    group: GroupSamples,
    bytes: u64,
    policy: &Policy,
) -> Result<BucketDecision, DecisionError> {
    // One row per rank.
    let world = group.samples.first().map_or(0, Vec::len);
    let mut samples = group.samples.into_iter();
    let candidate = |id: EntryId, samples: Vec<Vec<Option<f64>>>| CandidateSamples {
        profile: collectives.entries()[id].profile.clone(),
        dropped: None,
        exact: !matches!(outcomes[id], Outcome::Qualified { exact: false }),
        samples: vec![samples],
    };
    let nccl = candidate(contenders.nccl, samples.next().expect("NCCL was timed"));
    let pieces = candidate(
        contenders.pieces,
        samples.next().expect("the pieces were timed"),
    );
    decide_bucket(
        &BucketSamples {
            index: ladder.buckets.len(),
            default: nccl.profile.clone(),
            sizes: vec![bytes],
            candidates: vec![nccl, pieces],
        },
        world,
        policy,
    )
}

/// The route a decision gives, with its reason.
pub fn route_of(decision: BucketDecision, bytes: u64) -> AboveLadder {
    let median = |profile: &str| {
        decision.candidates.iter().find_map(|candidate| {
            match (&candidate.outcome, candidate.profile == profile) {
                (CandidateOutcome::Timed { sizes, .. }, true) => {
                    sizes.first().map(|figures| figures.median_us)
                }
                _ => None,
            }
        })
    };
    let nccl = &decision.candidates[0].profile;
    let pieces = &decision.candidates[1].profile;
    let figures = match (median(nccl), median(pieces)) {
        (Some(nccl_us), Some(pieces_us)) => {
            format!(" ({pieces_us:.1} us in pieces, {nccl_us:.1} us with NCCL)")
        }
        _ => String::new(),
    };
    let (route, reason) = if decision.winner == *nccl {
        (
            AboveLadderRoute::Nccl,
            format!(
                "NCCL on the whole message: pieces through {pieces} did not beat it by the \
                 margin at {bytes} bytes{figures}"
            ),
        )
    } else {
        (
            AboveLadderRoute::Pieces,
            format!("in pieces through {pieces}: faster than NCCL at {bytes} bytes{figures}"),
        )
    };
    AboveLadder {
        route,
        reason,
        decision: Some(decision),
    }
}

/// NCCL on the whole message, untimed, for `reason`.
pub fn nccl_untimed(reason: &str) -> AboveLadder {
    AboveLadder {
        route: AboveLadderRoute::Nccl,
        reason: format!("NCCL on the whole message: {reason}"),
        decision: None,
    }
}
