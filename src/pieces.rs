//! Messages above the largest bucket: NCCL on the whole message, or the message in pieces of
//! the largest bucket's largest message, each by its bucket's winner
//! ([`Collectives::enqueue_chunked`]; a reduce-scatter's or all-gather's through a staging
//! buffer of one piece, [`Collectives::enqueue_rows_in_pieces`]; cut by the collective's plan,
//! [`crate::shape::pieces`]; an `all_reduce_add_rms_norm`'s in runs of whole rows,
//! [`crate::shape::epilogue_pieces`], [`Collectives::enqueue_epilogue_in_pieces`]).
//! Start-up selection times both at twice the largest
//! bucket's message and decides as it does for a bucket, NCCL being the baseline to beat by the
//! margin; `prepare bench` times both at every size above the ladder.

use crate::collective::{rank_order_applies, Collectives, EntryId, Operands};
use crate::gpu::driver::{CallerMemory, DeviceBuffer, DeviceMemory};
use crate::ladder::{Collective, Ladder};
use crate::package::Outcome;
use crate::runtime::{Runtime, RuntimeError};
use crate::shape::Shape;
use crate::timing::{GroupSamples, Timed, Timer, TimingOptions};
use crate::tune::choice::{AboveLadder, AboveLadderRoute};
use crate::tune::early_stop::keep_timing;
use crate::tune::{decide_bucket, BucketDecision, BucketSamples, CandidateSamples, DecisionError};
use crate::tune::{CandidateOutcome, Policy};

/// The ways to run a message above the ladder, as entries of the largest bucket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contenders {
    /// The largest bucket's plain NCCL entry, run on the whole message.
    pub nccl: EntryId,
    /// Every custom candidate of the largest bucket that runs here, in the bucket's order, each
    /// run on every piece. The bucket's winner was timed on the registered buffer; on a
    /// caller's memory a kernel whose peers read the message pays a copy per piece, so each
    /// is timed in pieces.
    pub pieces: Vec<EntryId>,
}

impl Contenders {
    /// The contenders when the largest bucket's winner `winner` is a custom kernel and the
    /// bucket has an NCCL candidate that runs here; `Err` says why there is nothing to time
    /// (NCCL then takes the whole message).
    pub fn of(
        ladder: &Ladder,
        collectives: &Collectives,
        winner: &str,
    ) -> Result<Contenders, String> {
        Contenders::under(ladder, collectives, winner, false)
    }

    /// [`Contenders::of`] under a policy: where the NCCL fallback sums in rank order
    /// ([`rank_order_applies`]), the baseline is the largest bucket's rank-order candidate.
    pub fn under(
        ladder: &Ladder,
        collectives: &Collectives,
        winner: &str,
        exact_only: bool,
    ) -> Result<Contenders, String> {
        let last = ladder
            .buckets
            .len()
            .checked_sub(1)
            .ok_or_else(|| "the ladder has no bucket".to_owned())?;
        if ladder
            .profile(winner)
            .is_some_and(crate::ladder::Profile::is_nccl)
        {
            return Err(format!(
                "the largest bucket chose {winner}, NCCL, so pieces would be NCCL too"
            ));
        }
        let nccl = if rank_order_applies(ladder.collective, ladder.world_size, exact_only) {
            ladder
                .rank_order_nccl(last)
                .and_then(|profile| collectives.find_live(last, &profile.id))
                .ok_or_else(|| {
                    "the largest bucket has no rank-order NCCL candidate that runs here".to_owned()
                })?
        } else {
            ladder
                .plain_nccl(last)
                .and_then(|profile| collectives.find_live(last, &profile.id))
                .ok_or_else(|| {
                    "the largest bucket has no NCCL candidate that runs here".to_owned()
                })?
        };
        let pieces = collectives.live_custom_entries(last);
        if pieces.is_empty() {
            return Err("no custom candidate of the largest bucket runs here".to_owned());
        }
        Ok(Contenders { nccl, pieces })
    }

    /// Every contender, NCCL first.
    pub fn all(&self) -> impl Iterator<Item = EntryId> + '_ {
        std::iter::once(self.nccl).chain(self.pieces.iter().copied())
    }
}

/// Input and output buffers for timing messages above the ladder, allocated for the timing and
/// freed with it; the input is zeroed. A reduce-scatter's or all-gather's also has the staging
/// buffer of one piece that its pieces go through, an `all_reduce_add_rms_norm`'s a zeroed
/// residual as long as the message in its place.
#[derive(Debug)]
pub struct PieceBuffers {
    input: DeviceBuffer,
    output: DeviceBuffer,
    staging: Option<DeviceBuffer>,
}

impl PieceBuffers {
    /// Buffers for messages of `collectives` up to `bytes`.
    pub fn new(
        runtime: &Runtime,
        collectives: &Collectives,
        bytes: u64,
    ) -> Result<PieceBuffers, RuntimeError> {
        let rank = runtime.rank();
        let bytes = usize::try_from(bytes.max(16)).expect("a message fits the address space");
        let device = runtime.device();
        let allocate = |bytes: usize| device.allocate(bytes).map_err(RuntimeError::driver(rank));
        let piece = collectives.piece_elements() * collectives.dtype().size_bytes() as usize;
        let buffers = PieceBuffers {
            input: allocate(bytes)?,
            output: allocate(bytes)?,
            staging: if collectives.has_rows() {
                Some(allocate(piece.max(16))?)
            } else if collectives.collective() == Collective::AllReduceAddRmsNorm {
                Some(allocate(bytes)?)
            } else {
                None
            },
        };
        let stream = runtime.stream();
        let zeroed = std::iter::once(&buffers.input)
            .chain(buffers.staging.as_ref().filter(|_| !collectives.has_rows()));
        for buffer in zeroed {
            stream
                .fill_u8(buffer, 0..buffer.len_bytes(), 0)
                .map_err(RuntimeError::driver(rank))?;
        }
        stream.synchronize().map_err(RuntimeError::driver(rank))?;
        Ok(buffers)
    }

    /// The operands of a message of `bytes`, out of place.
    pub fn operands(&self, bytes: u64) -> Operands {
        Operands {
            input: CallerMemory::prefix(&self.input, bytes),
            output: CallerMemory::prefix(&self.output, bytes),
        }
    }

    /// The staging buffer of a reduce-scatter's or all-gather's pieces; an
    /// `all_reduce_add_rms_norm`'s residual.
    pub fn staging(&self) -> Option<CallerMemory> {
        self.staging.as_ref().map(CallerMemory::whole)
    }
}

/// The shape a reduce-scatter or all-gather of up to `elements` is timed at above the ladder,
/// on `world` ranks in pieces of `piece` elements: rows of 4,096 elements (the width the bench
/// takes), narrower by halves until every piece takes at least two rows of every rank's run,
/// as many rows as `elements` holds.
pub fn timing_shape(elements: u64, piece: u64, world: u32) -> Shape {
    let mut width: u64 = 4096;
    while width > 1 && 2 * width * u64::from(world) > piece {
        width /= 2;
    }
    Shape::new(elements / width, width).expect("a width of at least one")
}

/// Times NCCL on the whole message against every candidate in pieces on `buffers` (the operands
/// of a message of their size, [`PieceBuffers::operands`], and the staging buffer of a
/// reduce-scatter's or all-gather's pieces; those time rows of [`timing_shape`]), in one
/// interleaved group (NCCL first), a candidate that another beats far beyond the margin leaving
/// early (`tune::early_stop`). Collective.
pub fn time_contenders(
    runtime: &Runtime,
    collectives: &Collectives,
    timer: &mut Timer,
    contenders: &Contenders,
    buffers: (Operands, Option<CallerMemory>),
    timing: TimingOptions,
    margin: f64,
) -> Result<GroupSamples, RuntimeError> {
    let (operands, staging) = buffers;
    let elements = operands.input.len_bytes() / collectives.dtype().size_bytes() as usize;
    let shape = collectives.has_rows().then(|| {
        timing_shape(
            elements as u64,
            collectives.piece_elements() as u64,
            runtime.world(),
        )
    });
    let elements = shape.map_or(elements, |shape| shape.elements() as usize);
    let operands = Some(operands);
    let entries: Vec<Timed> = contenders
        .all()
        .map(|id| Timed {
            id,
            elements,
            operands,
            chunked: id != contenders.nccl,
            shape,
            staging,
            epilogue: None,
        })
        .collect();
    // One size: `[entry][rank][round]` is each candidate's only size.
    let keep = |so_far: &[Vec<Vec<Option<f64>>>]| -> Vec<bool> {
        let by_candidate: Vec<Vec<Vec<Vec<Option<f64>>>>> =
            so_far.iter().map(|samples| vec![samples.clone()]).collect();
        keep_timing(&by_candidate, margin)
    };
    timer.time_operands_until(runtime, collectives, &entries, timing, &keep)
}

/// The decision between NCCL (the baseline) and the candidates in pieces from their samples at
/// `bytes` ([`time_contenders`]), made as for a bucket whose index is the number of buckets.
pub fn decide(
    ladder: &Ladder,
    collectives: &Collectives,
    outcomes: &[Outcome],
    contenders: &Contenders,
    group: GroupSamples,
    bytes: u64,
    policy: &Policy,
) -> Result<BucketDecision, DecisionError> {
    // One row per rank.
    let world = group.samples.first().map_or(0, Vec::len);
    let candidates: Vec<CandidateSamples> = contenders
        .all()
        .zip(group.samples)
        .map(|(id, samples)| CandidateSamples {
            profile: collectives.entries()[id].profile.clone(),
            dropped: None,
            exact: !matches!(outcomes[id], Outcome::Qualified { exact: false }),
            samples: vec![samples],
        })
        .collect();
    decide_bucket(
        &BucketSamples {
            index: ladder.buckets.len(),
            default: collectives.entries()[contenders.nccl].profile.clone(),
            sizes: vec![bytes],
            candidates,
        },
        world,
        policy,
    )
}

/// The route a decision gives, with its reason: pieces through the decision's winner unless
/// NCCL (its baseline) won.
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
    // NCCL is the first candidate.
    let nccl = &decision.candidates[0].profile;
    let winner = &decision.winner;
    let (route, reason) = if winner == nccl {
        (
            AboveLadderRoute::Nccl,
            format!(
                "NCCL on the whole message: no candidate in pieces beat it by the margin at \
                 {bytes} bytes{}",
                median(nccl).map_or_else(String::new, |us| format!(" ({us:.1} us)"))
            ),
        )
    } else {
        let figures = match (median(nccl), median(winner)) {
            (Some(nccl_us), Some(pieces_us)) => {
                format!(" ({pieces_us:.1} us in pieces, {nccl_us:.1} us with NCCL)")
            }
            _ => String::new(),
        };
        (
            AboveLadderRoute::Pieces,
            format!("in pieces through {winner}: faster than NCCL at {bytes} bytes{figures}"),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::epilogue_pieces;
    use crate::tune::{CandidateResult, DecisionReason};
    use std::ops::Range;

    /// A decision over NCCL (first) and one candidate in pieces, won by `winner`.
    fn decision(winner: &str) -> BucketDecision {
        let candidate = |profile: &str| CandidateResult {
            profile: profile.to_owned(),
            exact: true,
            outcome: CandidateOutcome::Excluded {
                reason: "not timed here".to_owned(),
            },
        };
        BucketDecision {
            index: 18,
            winner: winner.to_owned(),
            baseline: "nccl".to_owned(),
            reason: DecisionReason::BaselineFastest,
            bit_exact: true,
            candidates: vec![candidate("nccl"), candidate("one_shot_simple_256")],
        }
    }

    #[test]
    fn rows_are_timed_4096_wide_unless_a_piece_would_take_fewer_than_two_of_every_run() {
        // Twice the 64 MiB bucket of bf16 at eight ranks, in pieces of 32 Mi elements.
        let shape = timing_shape(64 << 20, 32 << 20, 8);
        assert_eq!((shape.rows(), shape.width()), (16384, 4096));
        // A 16 KiB bucket at eight ranks: pieces of 8192 elements take two rows of 512 of
        // every run.
        let shape = timing_shape(16384, 8192, 8);
        assert_eq!((shape.rows(), shape.width()), (32, 512));
        let piece = crate::shape::piece_plan(Collective::AllGather, shape, 8, 8192);
        let Ok(crate::shape::PiecePlan::Rows(plan)) = piece else {
            panic!("a plan in rows: {piece:?}");
        };
        assert_eq!(plan.rows_per_run(), 2);
        // Rows that do not fill the elements: as many as fit.
        assert_eq!(timing_shape(10_000, 1 << 20, 2).elements(), 8192);
        assert_eq!(timing_shape(5, 1, 4).width(), 1);
    }

    #[test]
    fn an_epilogue_goes_in_runs_of_whole_rows_the_last_shorter() {
        let shape = Shape::new(10, 8).unwrap();
        assert_eq!(
            epilogue_pieces(shape, 24),
            Some(vec![0..3, 3..6, 6..9, 9..10])
        );
        assert_eq!(epilogue_pieces(shape, 31), epilogue_pieces(shape, 24));
        let whole: Range<u64> = 0..10;
        assert_eq!(epilogue_pieces(shape, 80), Some(vec![whole.clone()]));
        assert_eq!(epilogue_pieces(shape, 1 << 20), Some(vec![whole]));
        // A row larger than a piece, or no bucket: no pieces.
        assert_eq!(epilogue_pieces(shape, 7), None);
        assert_eq!(epilogue_pieces(shape, 0), None);
        assert_eq!(epilogue_pieces(Shape::new(0, 8).unwrap(), 8), Some(vec![]));
    }

    proptest::proptest! {
        /// The pieces are consecutive runs of whole rows covering the message once, each within
        /// a piece and all but the last as long as a piece holds; done piece by piece through
        /// the plan (each piece's rows of every rank's x and of the residual, with the whole
        /// weight), the epilogue's reference gives the whole message's `normed` and residual
        /// bit for bit: a row's outputs do not depend on the rows beside it.
        #[test]
        fn epilogue_pieces_give_the_whole_message_s_reference(
            rows in 0u64..120,
            groups in 1u64..6,
            world in 2usize..=8,
            piece_rows in 1u64..6,
            extra in 0u64..8,
            residual in proptest::bool::ANY,
            seed in 0u64..1000,
        ) {
            use crate::reference::{random_rank_inputs, reference_epilogue, EpilogueInputs};
            let dtype = crate::ladder::Dtype::Bf16;
            let hidden = 8 * groups;
            let shape = Shape::new(rows, hidden).unwrap();
            let piece = piece_rows * hidden + extra;
            let pieces = epilogue_pieces(shape, piece).expect("a row fits a piece");
            let mut next = 0;
            for (index, run) in pieces.iter().enumerate() {
                proptest::prop_assert_eq!(run.start, next);
                proptest::prop_assert!((run.end - run.start) * hidden <= piece);
                if index + 1 < pieces.len() {
                    proptest::prop_assert_eq!(run.end - run.start, piece_rows);
                }
                proptest::prop_assert!(run.end > run.start);
                next = run.end;
            }
            proptest::prop_assert_eq!(next, rows);
            let elements = shape.elements() as usize;
            let x = random_rank_inputs(dtype, seed, world, elements);
            let residual_in = random_rank_inputs(dtype, seed + 1, 1, elements).remove(0);
            let weight = random_rank_inputs(dtype, seed + 2, 1, hidden as usize).remove(0);
            let whole = |rows: &Range<u64>| {
                let bytes = (rows.start * hidden * 2) as usize..(rows.end * hidden * 2) as usize;
                let views: Vec<&[u8]> = x.iter().map(|x| &x[bytes.clone()]).collect();
                let inputs = EpilogueInputs {
                    residual: residual.then(|| &residual_in[bytes.clone()]),
                    weight: &weight,
                    eps: 1e-6,
                };
                let part = Shape::new(rows.end - rows.start, hidden).unwrap();
                reference_epilogue(dtype, part, &views, &inputs).unwrap().swap_remove(0)
            };
            let expected = whole(&(0..rows));
            let (mut normed, mut residual_out) = (Vec::new(), Vec::new());
            for run in &pieces {
                let outputs = whole(run);
                normed.extend(outputs.normed);
                residual_out.extend(outputs.residual_out);
            }
            proptest::prop_assert_eq!(normed, expected.normed);
            proptest::prop_assert_eq!(residual_out, expected.residual_out);
        }
    }

    #[test]
    fn the_route_follows_the_winner_and_names_the_piece_candidate() {
        let pieces = route_of(decision("one_shot_simple_256"), 1 << 27);
        assert_eq!(pieces.route, AboveLadderRoute::Pieces);
        assert_eq!(pieces.pieces_winner(), Some("one_shot_simple_256"));
        assert!(pieces
            .reason
            .starts_with("in pieces through one_shot_simple_256"));
        let nccl = route_of(decision("nccl"), 1 << 27);
        assert_eq!(nccl.route, AboveLadderRoute::Nccl);
        assert_eq!(nccl.pieces_winner(), None);
        assert_eq!(nccl_untimed("static tuning").pieces_winner(), None);
    }
}
