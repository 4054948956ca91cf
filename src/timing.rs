//! Timing candidates on the real GPUs, the way start-up selection (docs/selection.md) and benchmarks
//! ask: each candidate captured in a graph of enough back-to-back operations that event
//! resolution (0.5 us) does not matter, then interleaved rounds (A B C A B C ...), every sample
//! preceded by a barrier (an NCCL all-reduce of a few bytes on the same stream) so that the
//! ranks start it together. Samples are microseconds per operation; every rank's samples are
//! gathered, so every rank returns the same matrix.

use crate::collective::{Collectives, EntryId, EpilogueMessage, Operands};
use crate::gpu::driver::{CallerMemory, DeviceBuffer, Event, Graph, Stream};
use crate::ladder::Collective;
use crate::runtime::{Runtime, RuntimeError};
use crate::shape::Shape;

/// Elements of the barrier all-reduce.
const BARRIER_ELEMENTS: usize = 64;

/// How candidates are timed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TimingOptions {
    /// Interleaved rounds; each gives one sample per candidate.
    pub rounds: u32,
    /// Warm-up rounds, not recorded.
    pub warmup_rounds: u32,
    /// Each sample replays enough operations to take about this long, microseconds.
    pub sample_us: f64,
    /// At most this many operations per sample.
    pub max_ops: u32,
    /// With a stop rule ([`Timer::time_until`]): after every this many recorded rounds, the
    /// samples so far are gathered and the rule may end entries' timing; 0 never asks it.
    pub checkpoint_rounds: u32,
}

impl Default for TimingOptions {
    fn default() -> TimingOptions {
        TimingOptions {
            rounds: 25,
            warmup_rounds: 2,
            sample_us: 150.0,
            max_ops: 200,
            checkpoint_rounds: 8,
        }
    }
}

/// Every rank's samples of a group's entries, microseconds per operation, `[entry][rank][round]`;
/// `None` for a failed sample.
pub type Samples = Vec<Vec<Vec<Option<f64>>>>;

/// Which entries go on being timed, given the samples so far (see [`Timer::time_until`]).
pub type KeepTiming<'a> = &'a dyn Fn(&[Vec<Vec<Option<f64>>>]) -> Vec<bool>;

/// Samples of one group of candidates timed together, from every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct GroupSamples {
    /// Operations each sample replayed, per entry of the group (the same on every rank).
    pub ops: Vec<u32>,
    /// Microseconds per operation, `[entry][rank][round]`, entries in the group's order; `None`
    /// for a failed sample.
    pub samples: Samples,
}

/// Times candidates on one rank's GPU; create one per rank and reuse it.
#[derive(Debug)]
pub struct Timer {
    stream: Stream,
    barrier: DeviceBuffer,
    events: Vec<(Event, Event)>,
}

fn driver(rank: u32) -> impl Fn(crate::gpu::driver::DriverError) -> RuntimeError {
    move |source| RuntimeError::Driver { rank, source }
}

impl Timer {
    /// A timer with its own stream.
    pub fn new(runtime: &Runtime) -> Result<Timer, RuntimeError> {
        let rank = runtime.rank();
        let device = runtime.device();
        let stream = device.new_stream().map_err(driver(rank))?;
        let barrier = device
            .allocate(BARRIER_ELEMENTS * 2)
            .map_err(driver(rank))?;
        stream
            .fill_u16(&barrier, 0..BARRIER_ELEMENTS * 2, 0)
            .map_err(driver(rank))?;
        Ok(Timer {
            stream,
            barrier,
            events: Vec::new(),
        })
    }

    fn ensure_events(&mut self, runtime: &Runtime, count: usize) -> Result<(), RuntimeError> {
        while self.events.len() < count {
            let device = runtime.device();
            let rank = runtime.rank();
            self.events.push((
                device.new_event(true).map_err(driver(rank))?,
                device.new_event(true).map_err(driver(rank))?,
            ));
        }
        Ok(())
    }

    /// One interleaved round over `graphs`: per graph a barrier, an event, the replay and an
    /// event, all on the stream, then one bounded wait. Returns microseconds per replay.
    fn round(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        graphs: &[(EntryId, &Graph)],
        step: &str,
    ) -> Result<Vec<f64>, RuntimeError> {
        let rank = runtime.rank();
        self.ensure_events(runtime, graphs.len())?;
        let stream = &self.stream;
        let barrier = &self.barrier;
        let events = &self.events;
        let waited = runtime.bounded(runtime.communicator(), stream, step, || {
            for ((_, graph), (start, end)) in graphs.iter().zip(events) {
                runtime.communicator().all_reduce_bf16(
                    stream,
                    barrier,
                    barrier,
                    BARRIER_ELEMENTS,
                )?;
                stream.record(start).map_err(driver(rank))?;
                graph.launch().map_err(driver(rank))?;
                stream.record(end).map_err(driver(rank))?;
            }
            Ok(())
        });
        if waited.is_err() {
            // The graphs may hold NCCL work of a profile's own communicator, which the
            // runtime's watchdog does not abort.
            collectives.abort_splits();
        }
        waited?;
        collectives.check_abort(stream, step)?;
        graphs
            .iter()
            .zip(events)
            .map(|(_, (start, end))| {
                start
                    .elapsed_ms(end)
                    .map(|ms| f64::from(ms) * 1000.0)
                    .map_err(driver(rank))
            })
            .collect()
    }

    /// Times `entries` (each at its message size, elements) against each other. An entry may
    /// appear more than once, at different sizes: each appearance is captured, calibrated and
    /// timed on its own, and its samples are in the same position as in `entries`. Collective:
    /// every rank passes the same entries in the same order. Returns every rank's samples.
    pub fn time(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        entries: &[(EntryId, usize)],
        options: TimingOptions,
    ) -> Result<GroupSamples, RuntimeError> {
        let entries: Vec<Timed> = entries.iter().map(|&entry| entry.into()).collect();
        self.time_operands(runtime, collectives, &entries, options)
    }

    /// Like [`Timer::time`], each entry on the operands it names (the serving path on a
    /// caller's memory) or, without, on the registered buffer into the out-of-place output.
    pub fn time_operands(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        entries: &[Timed],
        options: TimingOptions,
    ) -> Result<GroupSamples, RuntimeError> {
        let ops = self.calibrate(runtime, collectives, entries, options)?;
        self.time_graphs(runtime, collectives, entries, &ops, options, None)
    }

    /// Like [`Timer::time`], asking `keep` at every checkpoint
    /// ([`TimingOptions::checkpoint_rounds`]) which entries go on being timed, given every
    /// rank's samples so far (`[entry][rank][round]`); an entry it ends keeps the rounds it
    /// has, and timing ends when it ends every entry. `keep` must decide from the samples
    /// alone, so that every rank ends the same entries. Collective.
    pub fn time_until(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        entries: &[(EntryId, usize)],
        options: TimingOptions,
        keep: KeepTiming<'_>,
    ) -> Result<GroupSamples, RuntimeError> {
        let entries: Vec<Timed> = entries.iter().map(|&entry| entry.into()).collect();
        self.time_operands_until(runtime, collectives, &entries, options, keep)
    }

    /// Like [`Timer::time_until`], each entry on the operands it names.
    pub fn time_operands_until(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        entries: &[Timed],
        options: TimingOptions,
        keep: KeepTiming<'_>,
    ) -> Result<GroupSamples, RuntimeError> {
        let ops = self.calibrate(runtime, collectives, entries, options)?;
        self.time_graphs(runtime, collectives, entries, &ops, options, Some(keep))
    }

    /// Times `entries` with exactly `ops` operations per replay (a decode step's all-reduces,
    /// say): no calibration. Collective.
    pub fn time_with_ops(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        entries: &[Timed],
        ops: u32,
        options: TimingOptions,
    ) -> Result<GroupSamples, RuntimeError> {
        let ops = vec![ops.max(1); entries.len()];
        self.time_graphs(runtime, collectives, entries, &ops, options, None)
    }

    /// Operations per replay for each entry: about `sample_us` on the slowest rank.
    fn calibrate(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        entries: &[Timed],
        options: TimingOptions,
    ) -> Result<Vec<u32>, RuntimeError> {
        let world = runtime.world() as usize;
        // Calibration: one operation per replay, the slowest rank's estimate decides how many
        // operations a sample replays, so every rank captures the same graphs.
        let mut single = Vec::with_capacity(entries.len());
        for entry in entries {
            single.push(entry.capture(runtime, collectives, &mut self.stream, 1)?);
        }
        let views: Vec<(EntryId, &Graph)> = entries
            .iter()
            .map(|entry| entry.id)
            .zip(single.iter())
            .collect();
        let mut estimate = vec![0.0_f64; entries.len()];
        for _ in 0..3 {
            let times = self.round(runtime, collectives, &views, "the timing calibration")?;
            for (best, time) in estimate.iter_mut().zip(times) {
                *best = if *best == 0.0 { time } else { best.min(time) };
            }
        }
        drop(views);
        drop(single);
        let local: Vec<u8> = estimate
            .iter()
            .flat_map(|value| (*value as f32).to_le_bytes())
            .collect();
        let gathered = runtime.all_gather_pieces(&local, "the calibration all-gather")?;
        let ops: Vec<u32> = (0..entries.len())
            .map(|candidate| {
                let slowest = (0..world)
                    .map(|rank| read_f32(&gathered[rank], candidate))
                    .fold(0.0_f64, f64::max);
                let wanted = (options.sample_us / slowest.max(0.1)).ceil();
                (wanted as u32).clamp(1, options.max_ops.max(1))
            })
            .collect();
        Ok(ops)
    }

    fn time_graphs(
        &mut self,
        runtime: &Runtime,
        collectives: &Collectives,
        entries: &[Timed],
        ops: &[u32],
        options: TimingOptions,
        keep: Option<KeepTiming<'_>>,
    ) -> Result<GroupSamples, RuntimeError> {
        let mut graphs = Vec::with_capacity(entries.len());
        for (entry, &count) in entries.iter().zip(ops) {
            graphs.push(entry.capture(runtime, collectives, &mut self.stream, count)?);
        }
        let mut active = vec![true; entries.len()];
        let mut local: Vec<Vec<f32>> = vec![Vec::new(); entries.len()];
        let checkpoint = options.checkpoint_rounds as usize;
        for round in 0..options.warmup_rounds + options.rounds {
            let step = format!("timing round {}", round + 1);
            let timed: Vec<usize> = (0..entries.len()).filter(|&entry| active[entry]).collect();
            if timed.is_empty() {
                break;
            }
            let views: Vec<(EntryId, &Graph)> = timed
                .iter()
                .map(|&entry| (entries[entry].id, &graphs[entry]))
                .collect();
            let times = self.round(runtime, collectives, &views, &step)?;
            if round < options.warmup_rounds {
                continue;
            }
            for (&entry, time) in timed.iter().zip(times) {
                local[entry].push((time / f64::from(ops[entry])) as f32);
            }
            let recorded = (round + 1 - options.warmup_rounds) as usize;
            if let Some(keep) = keep.filter(|_| {
                checkpoint > 0 && recorded % checkpoint == 0 && recorded < options.rounds as usize
            }) {
                let so_far = gather(runtime, &local, "the timing checkpoint all-gather")?;
                for (active, keep) in active.iter_mut().zip(keep(&so_far)) {
                    *active &= keep;
                }
            }
        }
        Ok(GroupSamples {
            ops: ops.to_vec(),
            samples: gather(runtime, &local, "the timing all-gather")?,
        })
    }
}

/// Every rank's samples, `[entry][rank][round]`, from this rank's `[entry][round]`: every rank
/// holds as many rounds of each entry as this one. Collective.
fn gather(runtime: &Runtime, local: &[Vec<f32>], step: &str) -> Result<Samples, RuntimeError> {
    let bytes: Vec<u8> = local
        .iter()
        .flatten()
        .flat_map(|value| value.to_le_bytes())
        .collect();
    let gathered = runtime.all_gather_pieces(&bytes, step)?;
    let mut offset = 0;
    Ok(local
        .iter()
        .map(|rounds| {
            let start = offset;
            offset += rounds.len();
            gathered
                .iter()
                .map(|rank| {
                    (start..offset)
                        .map(|index| {
                            let value = read_f32(rank, index);
                            (value.is_finite() && value > 0.0).then_some(value)
                        })
                        .collect()
                })
                .collect()
        })
        .collect())
}

/// One thing to time: an entry at a message size, on the registered buffer into the out-of-place
/// output, or on operands of its own.
#[derive(Debug, Clone, Copy)]
pub struct Timed {
    /// The entry.
    pub id: EntryId,
    /// The message size, in elements.
    pub elements: usize,
    /// Where the message is and the sum goes; `None` for the collectives' own buffers.
    pub operands: Option<Operands>,
    /// In pieces of the largest bucket's message, each through the entry
    /// ([`Collectives::enqueue_chunked`]); needs operands large enough for the message.
    pub chunked: bool,
    /// A reduce-scatter's or all-gather's rows x width (`elements` of them); `None` for the
    /// all-reduce, and for the shape start-up times these collectives at
    /// ([`crate::collective::startup_shape`]).
    pub shape: Option<Shape>,
    /// The staging buffer of a reduce-scatter's or all-gather's pieces (`chunked` with a
    /// `shape`, [`Collectives::enqueue_rows_in_pieces`]); for an `all_reduce_add_rms_norm` on
    /// `operands`, the residual, as long as the message (`chunked`: in pieces of whole rows,
    /// [`Collectives::enqueue_epilogue_in_pieces`]).
    pub staging: Option<CallerMemory>,
    /// The whole call of an `all_reduce_add_rms_norm` entry (x, residual, weight, normed,
    /// rows x hidden, eps), enqueued as given ([`Collectives::enqueue_epilogue`]); the other
    /// fields but `id` are then unused.
    pub epilogue: Option<EpilogueMessage>,
}

impl From<(EntryId, usize)> for Timed {
    fn from((id, elements): (EntryId, usize)) -> Timed {
        Timed {
            id,
            elements,
            operands: None,
            chunked: false,
            shape: None,
            staging: None,
            epilogue: None,
        }
    }
}

impl Timed {
    fn capture(
        &self,
        runtime: &Runtime,
        collectives: &Collectives,
        stream: &mut Stream,
        ops: u32,
    ) -> Result<Graph, RuntimeError> {
        if let Some(message) = &self.epilogue {
            return collectives.capture_with(stream, ops, |stream| {
                collectives.enqueue_epilogue(runtime, stream, self.id, message)
            });
        }
        if let Some(shape) = self.shape {
            let message = collectives.row_message(runtime.world(), shape)?;
            if let (true, Some(operands), Some(staging)) =
                (self.chunked, self.operands, self.staging)
            {
                return collectives.capture_with(stream, ops, |stream| {
                    collectives.enqueue_rows_in_pieces(
                        runtime,
                        stream,
                        &message,
                        operands,
                        staging,
                        |_| self.id,
                    )
                });
            }
            return collectives.capture_rows(
                runtime,
                stream,
                self.id,
                &message,
                self.operands,
                ops,
            );
        }
        if let (Some(operands), Some(residual), Collective::AllReduceAddRmsNorm) =
            (self.operands, self.staging, collectives.collective())
        {
            let message =
                collectives.startup_epilogue_message(self.elements, operands, residual)?;
            return collectives.capture_with(stream, ops, |stream| {
                if self.chunked {
                    collectives.enqueue_epilogue_in_pieces(runtime, stream, &message, self.id)
                } else {
                    collectives.enqueue_epilogue(runtime, stream, self.id, &message)
                }
            });
        }
        match self.operands {
            None => collectives.capture(runtime, stream, self.id, self.elements, ops),
            Some(operands) if self.chunked => collectives.capture_with(stream, ops, |stream| {
                collectives.enqueue_chunked(runtime, stream, self.elements, operands, |_| self.id)
            }),
            Some(operands) => {
                collectives.capture_operands(runtime, stream, self.id, self.elements, operands, ops)
            }
        }
    }
}

fn read_f32(bytes: &[u8], index: usize) -> f64 {
    let mut word = [0_u8; 4];
    word.copy_from_slice(&bytes[index * 4..index * 4 + 4]);
    f64::from(f32::from_le_bytes(word))
}
