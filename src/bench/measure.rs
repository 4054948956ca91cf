//! The measurements of `prepare bench` on one rank, each collective: every qualified
//! candidate of a size's bucket timed against the others, NCCL among them, with the tuned
//! choice marked; the chosen candidate through the serving paths; and the decode emulation
//! with the choice against NCCL alone.
//!
//! Method: per size every qualified candidate of the bucket covering it is captured in a graph
//! of enough back-to-back operations (about `sample_us` per replay), and timed in interleaved
//! rounds with a barrier before every sample; per round the slowest rank counts, and a
//! candidate's figure is the median over rounds (`crate::timing`, `crate::tune`).

mod epilogue;

pub use epilogue::EpilogueBuffers;

use super::{bench_shape, bus_gbps, DecodeRow, DecodeShape, RowsWidth, ServingRow, SizeRow};
use crate::collective::{Collectives, Operands, RowMessage};
use crate::gpu::driver::{CallerMemory, DeviceBuffer};
use crate::ladder::{Collective, Ladder};
use crate::package::Outcome;
use crate::pieces;
use crate::runtime::{Runtime, RuntimeError};
use crate::shape::Shape;
use crate::timing::{Timed, Timer, TimingOptions};
use crate::tune::choice::Choice;
use crate::tune::{
    decide_bucket, BucketDecision, BucketSamples, CandidateOutcome, CandidateSamples,
    DecisionError, Policy, SizeFigures,
};

/// Why a measurement failed.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The ranks were given different choices.
    #[error(
        "rank {other} was given another choice than rank {rank}; give every rank the same file"
    )]
    OtherChoice {
        /// This rank.
        rank: u32,
        /// The first rank whose choice differs.
        other: u32,
    },
    /// The runtime failed (driver, NCCL, a peer missing).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// No candidate of a bucket could be timed.
    #[error(transparent)]
    Decision(#[from] DecisionError),
}

/// Every bucket's smallest and largest message and the powers of two between, then twice and
/// four times the largest (above the ladder), ascending.
pub fn default_sizes(ladder: &Ladder) -> Vec<u64> {
    let last = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes);
    let mut sizes: Vec<u64> = std::iter::successors(Some(2_u64), |size| size.checked_mul(2))
        .take_while(|&size| size <= last)
        .collect();
    if last > 0 {
        sizes.extend([2 * last, 4 * last]);
    }
    for index in 0..ladder.buckets.len() {
        sizes.push(ladder.bucket_min_bytes(index));
        sizes.push(ladder.buckets[index].max_bytes);
    }
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The median over rounds of the slowest rank's time (`[rank][round]`); rounds where a rank
/// has no sample are left out.
fn slowest_median(samples: &[Vec<Option<f64>>]) -> f64 {
    let mut figures: Vec<f64> = (0..samples.first().map_or(0, Vec::len))
        .filter_map(|round| {
            samples
                .iter()
                .map(|rank| rank[round])
                .try_fold(0.0_f64, |slowest, value| value.map(|v| slowest.max(v)))
        })
        .collect();
    figures.sort_by(f64::total_cmp);
    figures.get(figures.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The bucket's plain NCCL candidate ([`Ladder::plain_nccl`]).
fn nccl_profile(ladder: &Ladder, bucket: usize) -> Option<String> {
    ladder.plain_nccl(bucket).map(|profile| profile.id.clone())
}

/// Where a serving row's operands lie, as byte ranges of the memory each is in: apart (the
/// input in one buffer, the output in another) and in place (both in one).
#[derive(Debug, Clone, PartialEq, Eq)]
struct ServingSpans {
    apart: (std::ops::Range<u64>, std::ops::Range<u64>),
    in_place: (std::ops::Range<u64>, std::ops::Range<u64>),
}

impl ServingSpans {
    /// An all-reduce of `bytes` (no `message`) reads and writes them all, in place over
    /// itself; a reduce-scatter writes its rows and an all-gather reads them, in place as this
    /// rank's rows of the whole message.
    fn of(bytes: u64, message: Option<&RowMessage>) -> ServingSpans {
        let Some(message) = message else {
            return ServingSpans {
                apart: (0..bytes, 0..bytes),
                in_place: (0..bytes, 0..bytes),
            };
        };
        let (whole, own) = (
            0..message.message_bytes(),
            message.owned_bytes(message.rank()),
        );
        ServingSpans {
            apart: (0..message.input_bytes(), 0..message.output_bytes()),
            in_place: match message.collective() {
                Collective::ReduceScatter => (whole, own),
                _ => (own, whole),
            },
        }
    }
}

/// A server's own memory for the serving rows: an input and an output buffer.
#[derive(Debug)]
pub struct ServingBuffers {
    input: DeviceBuffer,
    output: DeviceBuffer,
}

/// One rank's measurements over loaded, qualified candidates with an agreed choice.
#[derive(Debug)]
pub struct Bench<'a> {
    runtime: &'a Runtime,
    collectives: &'a Collectives,
    ladder: &'a Ladder,
    outcomes: &'a [Outcome],
    chosen: Vec<String>,
    // The candidate the choice runs on every piece above the ladder; `None`: NCCL takes them.
    pieces_winner: Option<String>,
    // Buffers for messages above the ladder, with the largest message they hold.
    piece_buffers: Option<(u64, pieces::PieceBuffers)>,
    timer: Timer,
    timing: TimingOptions,
}

impl<'a> Bench<'a> {
    /// Checks that every rank was given the same `choice`, and takes per bucket its winner,
    /// or the bucket's NCCL where this run's qualification (`outcomes`, per entry of
    /// `collectives`, loaded from a package of `ladder`) dropped the winner. Collective.
    pub fn new(
        runtime: &'a Runtime,
        collectives: &'a Collectives,
        ladder: &'a Ladder,
        outcomes: &'a [Outcome],
        choice: &Choice,
        timing: TimingOptions,
    ) -> Result<Bench<'a>, BenchError> {
        // Every rank must time and emulate with the same choice.
        runtime
            .agree_on(&choice.digest(), "the choice")
            .map_err(|error| match error {
                RuntimeError::Disagreement(disagreement) => BenchError::OtherChoice {
                    rank: disagreement.rank,
                    other: disagreement.other,
                },
                error => error.into(),
            })?;
        let chosen = choice
            .buckets
            .iter()
            .enumerate()
            .map(|(bucket, chosen)| {
                let profile = &chosen.decision.winner;
                if collectives.find_live(bucket, profile).is_some() {
                    profile.clone()
                } else {
                    nccl_profile(ladder, bucket).unwrap_or_else(|| profile.clone())
                }
            })
            .collect();
        Ok(Bench {
            runtime,
            collectives,
            ladder,
            outcomes,
            chosen,
            pieces_winner: choice.above_ladder.pieces_winner().map(str::to_owned),
            piece_buffers: None,
            timer: Timer::new(runtime)?,
            timing,
        })
    }

    /// Per bucket, the profile the choice takes here.
    pub fn chosen(&self) -> &[String] {
        &self.chosen
    }

    /// Every candidate of the bucket covering `bytes` timed against the others at that size,
    /// in the bucket's order. Above the last bucket, NCCL on the whole message against the
    /// largest bucket's chosen kernel in pieces (`crate::pieces`), as the bucket after the last;
    /// `None` there when the largest bucket chose NCCL.
    pub fn time_size(&mut self, bytes: u64) -> Result<Option<Vec<SizeRow>>, BenchError> {
        let (ladder, collectives) = (self.ladder, self.collectives);
        let Some(bucket) = ladder.bucket_for(bytes) else {
            return self.time_above_ladder(bytes);
        };
        let shape = self.shape_at(bytes, bucket);
        let (elements, bytes) = match shape {
            Some(shape) => (
                shape.elements() as usize,
                shape.elements() * ladder.dtype.size_bytes(),
            ),
            None => (bytes.div_ceil(ladder.dtype.size_bytes()) as usize, bytes),
        };
        let live: Vec<Timed> = collectives
            .bucket_entries(bucket)
            .filter(|(_, entry)| entry.dropped.is_none())
            .map(|(id, _)| Timed {
                shape,
                ..Timed::from((id, elements))
            })
            .collect();
        let mut rows = self.time_bucket(bucket, bytes, &live)?;
        for row in &mut rows {
            row.shape = shape.map(RowsWidth::from);
        }
        Ok(Some(rows))
    }

    /// `live` (every live entry of `bucket`, in the bucket's order, each at the message of
    /// `bytes`) timed against each other, a row per candidate of the bucket, the tuned choice
    /// marked.
    fn time_bucket(
        &mut self,
        bucket: usize,
        bytes: u64,
        live: &[Timed],
    ) -> Result<Vec<SizeRow>, BenchError> {
        let (ladder, collectives) = (self.ladder, self.collectives);
        let group = self
            .timer
            .time_operands(self.runtime, collectives, live, self.timing)?;
        let mut timed = group.samples.into_iter().zip(group.ops);
        let mut ops_of = Vec::new();
        let candidates: Vec<CandidateSamples> = collectives
            .bucket_entries(bucket)
            .map(|(id, entry)| {
                let (samples, dropped) = if entry.dropped.is_none() {
                    let (samples, ops) = timed.next().expect("one group per live entry");
                    ops_of.push((entry.profile.clone(), ops));
                    // Timed at one size: this one.
                    (vec![samples], None)
                } else {
                    (Vec::new(), entry.dropped.as_ref().map(ToString::to_string))
                };
                CandidateSamples {
                    profile: entry.profile.clone(),
                    dropped,
                    exact: !matches!(self.outcomes[id], Outcome::Qualified { exact: false }),
                    samples,
                }
            })
            .collect();
        // The decision gives every candidate's figures, inexact ones (NCCL beyond two ranks)
        // included, since the bench compares them all; the winner marked is the tuned choice's,
        // made under its own policy.
        let world = self.runtime.world();
        let decision = decide_bucket(
            &BucketSamples {
                index: bucket,
                default: ladder.buckets[bucket].default.clone(),
                sizes: vec![bytes],
                candidates,
            },
            world as usize,
            &Policy {
                exact_only: false,
                ..Policy::default()
            },
        )?;
        let chosen = self.chosen[bucket].clone();
        Ok(self.rows(&decision, bytes, &ops_of, |profile| profile == chosen))
    }

    /// The shape a reduce-scatter or all-gather of `bytes` in `bucket` is timed at
    /// ([`bench_shape`]); `None` for the all-reduce.
    fn shape_at(&self, bytes: u64, bucket: usize) -> Option<Shape> {
        let ladder = self.ladder;
        self.collectives.has_rows().then(|| {
            bench_shape(
                bytes,
                ladder.dtype.size_bytes(),
                self.runtime.world(),
                Some((
                    ladder.bucket_min_bytes(bucket),
                    ladder.buckets[bucket].max_bytes,
                )),
            )
        })
    }

    /// The bucket after the last: NCCL on the whole message against the pieces; `None` for a
    /// reduce-scatter or all-gather, which the bench does not time in pieces.
    fn time_above_ladder(&mut self, bytes: u64) -> Result<Option<Vec<SizeRow>>, BenchError> {
        let (ladder, collectives) = (self.ladder, self.collectives);
        if collectives.has_rows() {
            return Ok(None);
        }
        let Some(winner) = self.chosen.last() else {
            return Ok(None);
        };
        let Ok(contenders) = pieces::Contenders::of(ladder, collectives, winner) else {
            return Ok(None);
        };
        let element_bytes = ladder.dtype.size_bytes();
        let bytes = bytes / element_bytes * element_bytes;
        if self
            .piece_buffers
            .as_ref()
            .is_none_or(|(capacity, _)| *capacity < bytes)
        {
            // The previous buffers go first, so that only one pair is ever held.
            self.piece_buffers = None;
            self.piece_buffers = Some((
                bytes,
                pieces::PieceBuffers::new(self.runtime, collectives, bytes)?,
            ));
        }
        let (_, buffers) = self.piece_buffers.as_ref().expect("allocated above");
        let policy = Policy::default();
        let group = pieces::time_contenders(
            self.runtime,
            collectives,
            &mut self.timer,
            &contenders,
            (buffers.operands(bytes), buffers.staging()),
            self.timing,
            policy.margin,
        )?;
        let profile = |id: usize| collectives.entries()[id].profile.clone();
        let ops_of: Vec<(String, u32)> = contenders
            .all()
            .zip(&group.ops)
            .map(|(id, &ops)| (profile(id), ops))
            .collect();
        let decision = pieces::decide(
            ladder,
            collectives,
            self.outcomes,
            &contenders,
            group,
            bytes,
            &policy,
        )?;
        let nccl = profile(contenders.nccl);
        let pieces_winner = self.pieces_winner.clone();
        let mut rows = self.rows(
            &decision,
            bytes,
            &ops_of,
            |candidate| match &pieces_winner {
                Some(winner) => candidate == winner,
                None => candidate == nccl,
            },
        );
        for row in &mut rows {
            if row.profile != nccl {
                row.profile = format!("{} in pieces", row.profile);
            }
        }
        Ok(Some(rows))
    }

    /// One row per candidate of `decision` at `bytes`, each marked chosen where `chosen` says
    /// so, with its bus bandwidth and its speed against NCCL's.
    fn rows(
        &self,
        decision: &BucketDecision,
        bytes: u64,
        ops_of: &[(String, u32)],
        chosen: impl Fn(&str) -> bool,
    ) -> Vec<SizeRow> {
        let bucket = decision.index;
        let world = self.runtime.world();
        // Above the ladder (the bucket after the last) NCCL is the largest bucket's.
        let nccl_name = nccl_profile(self.ladder, bucket.min(self.ladder.buckets.len() - 1));
        let nccl_median = decision.candidates.iter().find_map(|candidate| {
            match (
                &candidate.outcome,
                Some(&candidate.profile) == nccl_name.as_ref(),
            ) {
                (CandidateOutcome::Timed { sizes, .. }, true) => {
                    sizes.first().map(|figures| figures.median_us)
                }
                _ => None,
            }
        });
        let rows = decision.candidates.iter().map(|candidate| {
            let chosen = chosen(&candidate.profile);
            let excluded = SizeRow {
                bytes,
                bucket,
                shape: None,
                profile: candidate.profile.clone(),
                median_us: None,
                min_us: None,
                max_us: None,
                rounds: 0,
                ops_per_sample: 0,
                bus_gbps: None,
                speedup_vs_nccl: None,
                excluded: None,
                chosen,
                form: None,
                exact: None,
            };
            match &candidate.outcome {
                CandidateOutcome::Timed { sizes, .. } => {
                    let SizeFigures {
                        median_us,
                        min_us,
                        max_us,
                        rounds,
                        ..
                    } = sizes.first().expect("one size was timed");
                    SizeRow {
                        median_us: Some(*median_us),
                        min_us: Some(*min_us),
                        max_us: Some(*max_us),
                        rounds: *rounds,
                        ops_per_sample: ops_of
                            .iter()
                            .find(|(profile, _)| *profile == candidate.profile)
                            .map_or(0, |(_, ops)| *ops),
                        bus_gbps: Some(bus_gbps(self.ladder.collective, world, bytes, *median_us)),
                        speedup_vs_nccl: nccl_median.map(|nccl| nccl / median_us),
                        ..excluded
                    }
                }
                CandidateOutcome::Excluded { reason } => SizeRow {
                    excluded: Some(reason.clone()),
                    ..excluded
                },
            }
        });
        rows.collect()
    }

    /// The server's own memory the serving rows run on, as large as the largest of `sizes` a
    /// bucket covers.
    pub fn serving_buffers(&self, sizes: &[u64]) -> Result<ServingBuffers, BenchError> {
        let element_bytes = self.ladder.dtype.size_bytes();
        let largest = sizes
            .iter()
            .filter_map(|&bytes| {
                let bucket = self.ladder.bucket_for(bytes)?;
                Some(
                    self.shape_at(bytes, bucket)
                        .map_or(bytes, |shape| shape.elements() * element_bytes),
                )
            })
            .max()
            .unwrap_or(0) as usize;
        let device = self.runtime.device();
        let allocate = || {
            device
                .allocate(largest.max(16))
                .map_err(RuntimeError::driver(self.runtime.rank()))
        };
        Ok(ServingBuffers {
            input: allocate()?,
            output: allocate()?,
        })
    }

    /// The chosen candidate at `bytes` through the serving handle's paths, in one interleaved
    /// group, so the copies the handle adds show; `None` above the last bucket.
    pub fn time_serving(
        &mut self,
        bytes: u64,
        buffers: &ServingBuffers,
    ) -> Result<Option<ServingRow>, BenchError> {
        let ladder = self.ladder;
        let Some(bucket) = ladder.bucket_for(bytes) else {
            return Ok(None);
        };
        let Some(id) = self.collectives.find(bucket, &self.chosen[bucket]) else {
            return Ok(None);
        };
        let shape = self.shape_at(bytes, bucket);
        let elements = shape.map_or(bytes.div_ceil(ladder.dtype.size_bytes()), Shape::elements);
        let message = match shape {
            Some(shape) => Some(self.collectives.row_message(self.runtime.world(), shape)?),
            None => None,
        };
        let bytes = if message.is_some() {
            elements * ladder.dtype.size_bytes()
        } else {
            bytes
        };
        let spans = ServingSpans::of(elements * ladder.dtype.size_bytes(), message.as_ref());
        let part = |memory: CallerMemory, span: &std::ops::Range<u64>| {
            CallerMemory::prefix(&memory.offset(span.start), span.end - span.start)
        };
        let elements = elements as usize;
        let timed = |input, output| Timed {
            id,
            elements,
            operands: Some(Operands { input, output }),
            chunked: false,
            shape,
            staging: None,
            epilogue: None,
        };
        let (input, output) = (
            CallerMemory::whole(&buffers.input),
            CallerMemory::whole(&buffers.output),
        );
        let in_place = |memory: CallerMemory| {
            timed(
                part(memory, &spans.in_place.0),
                part(memory, &spans.in_place.1),
            )
        };
        let mut entries = vec![
            Timed {
                shape,
                ..Timed::from((id, elements))
            },
            timed(part(input, &spans.apart.0), part(output, &spans.apart.1)),
            in_place(output),
        ];
        if let Some(region) = self.collectives.input_region() {
            entries.push(in_place(region));
        }
        let group =
            self.timer
                .time_operands(self.runtime, self.collectives, &entries, self.timing)?;
        let medians: Vec<f64> = group
            .samples
            .iter()
            .map(|samples| slowest_median(samples))
            .collect();
        Ok(Some(ServingRow {
            bytes,
            bucket,
            profile: self.chosen[bucket].clone(),
            zero_copy_us: medians[0],
            any_tensor_us: medians[1],
            any_tensor_in_place_us: medians[2],
            zero_copy_in_place_us: medians.get(3).copied(),
        }))
    }

    /// One batch of the decode emulation: the layers' operations (all-reduces, or the
    /// package's reduce-scatters or all-gathers of `batch` x hidden) of `batch` rows in one
    /// graph, with the choice and with NCCL alone; `None` above the last bucket or where the
    /// bucket has no NCCL candidate.
    pub fn time_decode(
        &mut self,
        batch: usize,
        shape: &DecodeShape,
    ) -> Result<Option<DecodeRow>, BenchError> {
        let (ladder, collectives) = (self.ladder, self.collectives);
        let elements = batch * shape.hidden;
        let bytes = elements as u64 * ladder.dtype.size_bytes();
        let Some(bucket) = ladder.bucket_for(bytes) else {
            return Ok(None);
        };
        let Some(nccl) =
            nccl_profile(ladder, bucket).and_then(|profile| collectives.find(bucket, &profile))
        else {
            return Ok(None);
        };
        let ops = (shape.layers * shape.all_reduces_per_layer) as u32;
        let tuned = collectives
            .find(bucket, &self.chosen[bucket])
            .unwrap_or(nccl);
        // A reduce-scatter or all-gather of the batch's rows of the hidden width.
        let rows = collectives
            .has_rows()
            .then(|| Shape::new(batch as u64, shape.hidden as u64))
            .transpose()
            .map_err(|source| RuntimeError::Operands {
                rank: self.runtime.rank(),
                source: source.into(),
            })?;
        let timed = |id| Timed {
            shape: rows,
            ..Timed::from((id, elements))
        };
        let mut entries = vec![timed(tuned)];
        if tuned != nccl {
            entries.push(timed(nccl));
        }
        let group =
            self.timer
                .time_with_ops(self.runtime, collectives, &entries, ops, self.timing)?;
        let step = |samples: &Vec<Vec<Option<f64>>>| slowest_median(samples) * f64::from(ops);
        let tuned_us = step(&group.samples[0]);
        let nccl_us = group.samples.get(1).map_or(tuned_us, step);
        Ok(Some(DecodeRow {
            batch,
            elements,
            tuned_profile: self.chosen[bucket].clone(),
            tuned_us,
            nccl_us,
            speedup: nccl_us / tuned_us,
            unfused_profile: None,
            unfused_us: None,
            speedup_vs_unfused: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::{slowest_median, ServingSpans};
    use crate::collective::RowMessage;
    use crate::ladder::{Collective, Dtype};
    use crate::shape::Shape;

    /// The all-reduce reads and writes the whole message, in place over itself; in place, the
    /// reduce-scatter writes this rank's rows of its input and the all-gather reads this
    /// rank's rows of its output.
    #[test]
    fn the_serving_operands_are_each_collective_s_own() {
        assert_eq!(
            ServingSpans::of(4096, None),
            ServingSpans {
                apart: (0..4096, 0..4096),
                in_place: (0..4096, 0..4096),
            }
        );
        // bf16, 10 rows of 8 on 4 ranks: rank 1 owns rows 3..6, bytes 48..96 of 160.
        let shape = Shape::new(10, 8).unwrap();
        let message = |collective| RowMessage::new(collective, shape, 4, 1, Dtype::Bf16).unwrap();
        assert_eq!(
            ServingSpans::of(160, Some(&message(Collective::ReduceScatter))),
            ServingSpans {
                apart: (0..160, 0..48),
                in_place: (0..160, 48..96),
            }
        );
        assert_eq!(
            ServingSpans::of(160, Some(&message(Collective::AllGather))),
            ServingSpans {
                apart: (0..48, 0..160),
                in_place: (48..96, 0..160),
            }
        );
        // A rank that owns no rows has an empty output (RS) or input (AG), at its place.
        let none = RowMessage::new(
            Collective::AllGather,
            Shape::new(2, 8).unwrap(),
            4,
            3,
            Dtype::Bf16,
        )
        .unwrap();
        assert_eq!(ServingSpans::of(32, Some(&none)).apart.0, 0..0);
        assert_eq!(ServingSpans::of(32, Some(&none)).in_place.0, 32..32);
    }

    #[test]
    fn per_round_the_slowest_rank_counts_and_incomplete_rounds_are_left_out() {
        let samples = vec![
            vec![Some(1.0), Some(5.0), None, Some(2.0)],
            vec![Some(3.0), Some(4.0), Some(9.0), Some(2.5)],
        ];
        // Rounds: 3, 5, (left out), 2.5; the median of three is the middle one.
        assert!((slowest_median(&samples) - 3.0).abs() < 1e-12);
        assert!(slowest_median(&[]).is_nan());
    }
}
