//! Qualification: every candidate of every bucket captured in CUDA graphs and replayed on the
//! real GPUs, on fresh random data, at the bucket's smallest, largest and one odd size (a tail
//! that is not a whole 16-byte vector). A custom candidate qualifies only if, on every rank and
//! every run, its output bytes equal the reference sum, its input is unchanged and it wrote
//! the whole message and nothing past it; otherwise it is dropped with the reason. NCCL is
//! always kept, with whether it matched the reference (beyond two ranks it sums in its own
//! order).
//!
//! A server captures its collectives at several batch sizes and replays them alternately, so
//! qualification also replays a sequence of graphs at 8, 16 and 32 rows of a 7168-wide
//! hidden state, alternated, each replay checked, and requires the device memory in use to be
//! the same after the replays as before them (nothing is allocated after capture).
//!
//! Collective: every rank runs the same launches in the same order, whatever it finds, and the
//! outcome is agreed, so every rank returns the same outcomes.

mod epilogue;

use rayon::prelude::*;

use crate::collective::{agree_drops, Collectives, EntryId};
use crate::device::DropReason;
use crate::gpu::driver::{DeviceBuffer, DeviceMemory as _, Graph, PinnedBytes, Stream};
use crate::ladder::{Collective, Dtype};
use crate::package::{BucketQualification, CandidateQualification, Outcome};
use crate::reference::{element, random_rank_inputs, rank_dataset, reference_sum, RankDataset};
use crate::runtime::{Runtime, RuntimeError};

/// Output poison, in every 16-bit half of an element: a NaN payload no sum produces in any type
/// (the kernels write 0x7FFF or 0x7FFF_FFFF for NaN).
pub const POISON: u16 = 0x7FA5;

/// An element of `dtype` as the poison leaves it.
fn poison_bits(dtype: Dtype) -> u32 {
    match dtype {
        Dtype::Bf16 | Dtype::Fp16 => u32::from(POISON),
        Dtype::Fp32 => (u32::from(POISON) << 16) | u32::from(POISON),
    }
}
/// Elements after the message that must stay poisoned.
const PAST_END_ELEMENTS: usize = 4096;
/// The hidden state width of the multi-size sequence (a 7168-wide model).
pub const SEQUENCE_HIDDEN: usize = 7168;
/// Rows of the multi-size sequence's graphs.
pub const SEQUENCE_ROWS: [usize; 3] = [8, 16, 32];

/// Which message sizes of a bucket each candidate runs at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sizes {
    /// The bucket's smallest and largest messages and one with a tail that is not a whole
    /// vector.
    Edges,
    /// Only the bucket's largest message (what startup timing checks before timing).
    Largest,
}

/// How much qualification runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QualifyOptions {
    /// The sizes every candidate runs at.
    pub sizes: Sizes,
    /// Times every candidate runs at each size, each time on fresh data.
    pub repeat: u32,
    /// Replays in the multi-size sequence (per candidate, alternating sizes); 0 skips it.
    pub sequence_replays: u32,
    /// Where each run's data comes from.
    pub data: Data,
}

/// Where each checked run's inputs and reference sum come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data {
    /// Fresh random inputs for every run, and their reference sum.
    Fresh,
    /// Two random datasets made once, as long as the largest message checked, used by turns:
    /// a run at `n` elements takes the first `n` of the turn's dataset (the sum is element by
    /// element, so its reference is the first `n` of the dataset's). Consecutive runs still
    /// see different inputs, and the output is poisoned before every run, so a candidate that
    /// reads a peer's input before it is written, or leaves part of its output unwritten,
    /// still fails; making the data once instead of for every run is what makes the startup
    /// check fast.
    Shared,
}

impl Default for QualifyOptions {
    fn default() -> QualifyOptions {
        QualifyOptions {
            sizes: Sizes::Edges,
            repeat: 1,
            sequence_replays: 18,
            data: Data::Fresh,
        }
    }
}

/// The multi-size sequence's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceReport {
    /// Message sizes of the graphs, elements.
    pub sizes: Vec<usize>,
    /// Candidates that ran the sequence.
    pub candidates: usize,
    /// Graph replays checked, all candidates together.
    pub replays: u32,
    /// Device memory in use before the first replay, bytes.
    pub used_before: usize,
    /// Device memory in use after the last replay, bytes.
    pub used_after: usize,
}

/// What qualification found on this rank; the outcomes are the same on every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct QualifyReport {
    /// Per entry of [`Collectives::entries`]: qualified (with exactness) or dropped.
    pub outcomes: Vec<Outcome>,
    /// Graph replays checked in the per-size runs.
    pub runs: u64,
    /// The multi-size sequence, when it ran.
    pub sequence: Option<SequenceReport>,
}

impl QualifyReport {
    /// The outcomes as the manifest records them, bucket by bucket.
    pub fn buckets(&self, collectives: &Collectives) -> Vec<BucketQualification> {
        let mut buckets: Vec<BucketQualification> = Vec::new();
        for (entry, outcome) in collectives.entries().iter().zip(&self.outcomes) {
            if buckets.last().is_none_or(|last| last.index != entry.bucket) {
                buckets.push(BucketQualification {
                    index: entry.bucket,
                    candidates: Vec::new(),
                });
            }
            buckets
                .last_mut()
                .expect("pushed above")
                .candidates
                .push(CandidateQualification {
                    profile: entry.profile.clone(),
                    outcome: outcome.clone(),
                });
        }
        buckets
    }
}

/// A seed every rank shares: rank 0's clock, gathered.
pub fn shared_seed(runtime: &Runtime) -> Result<u64, RuntimeError> {
    let mine = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
        ^ u64::from(runtime.rank()).rotate_left(32);
    let gathered = runtime.all_gather(&mine.to_le_bytes(), "the seed all-gather")?;
    let mut first = [0; 8];
    first.copy_from_slice(&gathered[..8]);
    Ok(u64::from_le_bytes(first))
}

/// The sizes a candidate of `bucket` is checked at: the bucket's smallest and largest
/// messages, and one whose tail is not a whole 16-byte vector.
pub fn check_sizes(
    collectives: &Collectives,
    ladder: &crate::ladder::Ladder,
    bucket: usize,
) -> Vec<usize> {
    let element = ladder.dtype.size_bytes();
    let largest = (ladder.buckets[bucket].max_bytes / element) as usize;
    let smallest = (ladder.bucket_min_bytes(bucket) / element) as usize;
    let mut sizes = vec![smallest, largest.saturating_sub(3).max(smallest), largest];
    sizes.retain(|&size| size >= 1 && size <= collectives.capacity());
    sizes.dedup();
    sizes
}

/// One checked run's seed: distinct for every run, so consecutive launches never see the same
/// data (a missing barrier would otherwise read a peer's previous, identical input).
fn run_seed(seed: u64, counter: u64) -> u64 {
    seed ^ (counter + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// The data of [`Data::Shared`]: two datasets, their inputs also on the device, and pinned host
/// memory the output and the input are read back into.
struct Shared {
    datasets: Vec<RankDataset>,
    on_device: Vec<DeviceBuffer>,
    read_back: PinnedBytes,
}

impl Shared {
    fn new(
        runtime: &Runtime,
        dtype: Dtype,
        seed: u64,
        elements: usize,
        past_end: usize,
    ) -> Result<Shared, RuntimeError> {
        let rank = runtime.rank();
        let driver = |source| RuntimeError::Driver { rank, source };
        let datasets: Vec<RankDataset> = (1..=2)
            .map(|turn| {
                rank_dataset(
                    dtype,
                    run_seed(seed, u64::MAX - turn),
                    runtime.world() as usize,
                    rank as usize,
                    elements,
                )
            })
            .collect();
        let device = runtime.device();
        let stream = device.new_stream().map_err(driver)?;
        let mut on_device = Vec::new();
        for dataset in &datasets {
            let buffer = device
                .allocate(dataset.input.len().max(1))
                .map_err(driver)?;
            stream.write(&buffer, 0, &dataset.input).map_err(driver)?;
            on_device.push(buffer);
        }
        let read_back = device
            .pinned_bytes(past_end * dtype.size_bytes() as usize)
            .map_err(driver)?;
        Ok(Shared {
            datasets,
            on_device,
            read_back,
        })
    }
}

struct Checker<'a> {
    runtime: &'a Runtime,
    collectives: &'a Collectives,
    dtype: Dtype,
    seed: u64,
    counter: u64,
    /// The data of [`Data::Shared`]; `None` for [`Data::Fresh`].
    shared: Option<Shared>,
}

impl Checker<'_> {
    /// Writes the run's inputs, poisons the output, replays `graph` (entry `id` at `elements`)
    /// and compares. `Ok(Some(problem))` when the output is wrong.
    fn run(
        &mut self,
        stream: &Stream,
        id: EntryId,
        graph: &Graph,
        elements: usize,
        step: &str,
    ) -> Result<Option<String>, RuntimeError> {
        if self.collectives.collective() == Collective::AllReduceAddRmsNorm {
            return self.run_epilogue(stream, id, graph, elements, step);
        }
        let rank = self.runtime.rank();
        let driver = |source| RuntimeError::Driver { rank, source };
        self.counter += 1;
        let dtype = self.dtype;
        let size = dtype.size_bytes() as usize;
        let bytes = elements * size;
        let collectives = self.collectives;
        let world = self.runtime.world();
        // A reduce-scatter reads the whole message and writes its rows; an all-gather reads
        // its rows of one message every rank shares (the reference sum's, or rank 0's input)
        // and writes it whole.
        let collective = collectives.collective();
        let owned = if collectives.has_rows() {
            let message = collectives.startup_message(world, elements)?;
            let own = message.owned_bytes(rank);
            own.start as usize..own.end as usize
        } else {
            0..bytes
        };
        let (input_bytes, output_bytes) = match collective {
            Collective::ReduceScatter => (bytes, owned.len()),
            Collective::AllGather => (owned.len(), bytes),
            _ => (bytes, bytes),
        };
        let output = collectives.output()?;
        let poisoned = (output_bytes / size + PAST_END_ELEMENTS).min(output.len_bytes() / size);
        // Read back into: the output with what follows it, then the input.
        let read_bytes = (poisoned * size).max(input_bytes);
        // The run's input on the device, this rank's input and its expected output on the
        // host, and where the output is read back to.
        let fresh;
        let mut fresh_read_back;
        let (input, expected, read_back): (&[u8], std::borrow::Cow<'_, [u8]>, &mut [u8]) =
            match &mut self.shared {
                None => {
                    fresh = random_rank_inputs(
                        dtype,
                        run_seed(self.seed, self.counter),
                        world as usize,
                        elements,
                    );
                    let views: Vec<&[u8]> = fresh.iter().map(Vec::as_slice).collect();
                    let (input, expected): (&[u8], std::borrow::Cow<'_, [u8]>) = match collective {
                        Collective::AllGather => (&fresh[0][owned.clone()], fresh[0][..].into()),
                        Collective::ReduceScatter => (
                            &fresh[rank as usize],
                            reference_sum(dtype, &views)[owned.clone()].to_vec().into(),
                        ),
                        _ => (&fresh[rank as usize], reference_sum(dtype, &views).into()),
                    };
                    stream
                        .write(collectives.input(), 0, input)
                        .map_err(driver)?;
                    fresh_read_back = vec![0_u8; read_bytes];
                    (input, expected, &mut fresh_read_back)
                }
                Some(shared) => {
                    let turn = self.counter as usize % shared.datasets.len();
                    let dataset = &shared.datasets[turn];
                    let (input, expected): (&[u8], std::borrow::Cow<'_, [u8]>) = match collective {
                        Collective::AllGather => (
                            &dataset.reference[owned.clone()],
                            dataset.reference[..bytes].into(),
                        ),
                        Collective::ReduceScatter => (
                            &dataset.input[..bytes],
                            dataset.reference[owned.clone()].into(),
                        ),
                        _ => (&dataset.input[..bytes], dataset.reference[..bytes].into()),
                    };
                    if collective == Collective::AllGather {
                        stream
                            .write(collectives.input(), 0, input)
                            .map_err(driver)?;
                    } else {
                        stream
                            .copy_device(collectives.input(), 0, &shared.on_device[turn], 0, bytes)
                            .map_err(driver)?;
                    }
                    (input, expected, &mut shared.read_back[..read_bytes])
                }
            };
        stream
            .fill_u16(output, 0..poisoned * size, POISON)
            .map_err(driver)?;
        // No barrier: a peer's kernel reaching the start barrier means its launch began, after
        // its input was written in stream order; NCCL synchronises itself.
        collectives.run_bounded(self.runtime, stream, id, step, || {
            graph.launch().map_err(driver)
        })?;
        stream.read(output, 0, read_back).map_err(driver)?;
        if let Some(past) = (output_bytes / size..poisoned)
            .find(|&index| element(dtype, read_back, index) != poison_bits(dtype))
        {
            return Ok(Some(format!(
                "rank {rank}, {elements} elements: wrote element {past}, past the end of the message"
            )));
        }
        if let Some(message) = mismatch(
            rank,
            dtype,
            &read_back[..output_bytes],
            &expected,
            collective.reference(),
        ) {
            return Ok(Some(message));
        }
        let input_after = &mut read_back[..input_bytes];
        stream
            .read(collectives.input(), 0, input_after)
            .map_err(driver)?;
        if !equal(input_after, input) {
            return Ok(Some(format!(
                "rank {rank}, {elements} elements: changed its input"
            )));
        }
        Ok(None)
    }
}

/// Whether two byte strings are equal, compared on every core.
fn equal(a: &[u8], b: &[u8]) -> bool {
    const PIECE: usize = 1 << 20;
    a.len() == b.len()
        && a.par_chunks(PIECE)
            .zip(b.par_chunks(PIECE))
            .all(|(a, b)| a == b)
}

/// How `got` differs from `expected` (`reference`, as [`Collective::reference`] names it) on rank
/// `rank`, naming how many elements differ and the first; `None` when they are equal.
pub(crate) fn mismatch(
    rank: u32,
    dtype: Dtype,
    got: &[u8],
    expected: &[u8],
    reference: &str,
) -> Option<String> {
    let (first, mismatches) = first_mismatch(dtype, got, expected)?;
    let elements = expected.len() / dtype.size_bytes() as usize;
    let width = 2 + 2 * dtype.size_bytes() as usize;
    Some(format!(
        "rank {rank}, {elements} {dtype} elements: {mismatches} differ from {reference}, \
         the first at {first} (got {:#0width$x}, expected {:#0width$x})",
        element(dtype, got, first),
        element(dtype, expected, first)
    ))
}

/// The first element of `dtype` where `got` and `expected` differ, and how many differ.
fn first_mismatch(dtype: Dtype, got: &[u8], expected: &[u8]) -> Option<(usize, usize)> {
    if equal(got, expected) {
        return None;
    }
    let size = dtype.size_bytes() as usize;
    let mut mismatches = got
        .chunks_exact(size)
        .zip(expected.chunks_exact(size))
        .enumerate()
        .filter(|(_, (a, b))| a != b);
    let (first, _) = mismatches.next()?;
    Some((first, 1 + mismatches.count()))
}

/// Qualifies every entry of `collectives` that no rank has dropped; `log` receives progress
/// lines. Returns the same outcomes on every rank; a peer that stops answering is an error
/// naming it.
#[allow(clippy::too_many_lines)]
pub fn qualify(
    runtime: &Runtime,
    collectives: &mut Collectives,
    ladder: &crate::ladder::Ladder,
    options: QualifyOptions,
    log: &dyn Fn(String),
) -> Result<QualifyReport, RuntimeError> {
    let rank = runtime.rank();
    let driver = move |source| RuntimeError::Driver { rank, source };
    let seed = shared_seed(runtime)?;
    let mut stream = runtime.device().new_stream().map_err(driver)?;
    let count = collectives.entries().len();

    // Capture every live entry at its sizes. A failed capture drops a custom candidate; NCCL
    // failing to capture is a failure of the run.
    let mut local: Vec<Option<DropReason>> = vec![None; count];
    let mut graphs: Vec<Vec<(usize, Graph)>> = (0..count).map(|_| Vec::new()).collect();
    for id in 0..count {
        let entry = &collectives.entries()[id];
        if entry.dropped.is_some() {
            continue;
        }
        let mut sizes = check_sizes(collectives, ladder, entry.bucket);
        if options.sizes == Sizes::Largest {
            sizes.drain(..sizes.len().saturating_sub(1));
        }
        for elements in sizes {
            match collectives.capture(runtime, &mut stream, id, elements, 1) {
                Ok(graph) => graphs[id].push((elements, graph)),
                Err(error) if !entry.nccl => {
                    local[id] = Some(DropReason::CaptureFailed {
                        message: format!("rank {rank}, {elements} elements: {error}"),
                    });
                    break;
                }
                Err(error) => return Err(error),
            }
        }
    }
    let agreed = agree_drops(runtime, &local, "the capture agreement")?;
    collectives.apply_drops(agreed);

    let mut problems: Vec<Option<String>> = vec![None; count];
    let shared = match options.data {
        Data::Fresh => None,
        Data::Shared => {
            let sequence = SEQUENCE_ROWS.map(|rows| rows * SEQUENCE_HIDDEN);
            let longest = graphs
                .iter()
                .flatten()
                .map(|(elements, _)| *elements)
                .chain(
                    sequence
                        .into_iter()
                        .filter(|_| options.sequence_replays > 0),
                )
                .max()
                .unwrap_or(0)
                .min(collectives.capacity());
            let past_end = (longest + PAST_END_ELEMENTS)
                .min(collectives.output()?.len_bytes() / ladder.dtype.size_bytes() as usize);
            Some(Shared::new(runtime, ladder.dtype, seed, longest, past_end)?)
        }
    };
    let mut checker = Checker {
        runtime,
        collectives,
        dtype: ladder.dtype,
        seed,
        counter: 0,
        shared,
    };
    let mut runs = 0_u64;
    for pass in 0..options.repeat {
        for id in 0..count {
            let entry = &collectives.entries()[id];
            if entry.dropped.is_some() {
                continue;
            }
            for (elements, graph) in &graphs[id] {
                let step = format!(
                    "{} in bucket {} at {elements} elements (run {})",
                    entry.profile,
                    entry.bucket,
                    pass + 1
                );
                let problem = checker.run(&stream, id, graph, *elements, &step)?;
                runs += 1;
                if problems[id].is_none() {
                    problems[id] = problem;
                }
            }
        }
    }
    log(format!(
        "{runs} graph replays checked against {}",
        collectives.collective().reference()
    ));
    drop(graphs);

    let sequence =
        if options.sequence_replays > 0 {
            let report = run_sequence(
                &mut checker,
                &mut stream,
                ladder,
                options.sequence_replays,
                &mut problems,
            )?;
            if let Some(report) = &report {
                log(format!(
                "multi-size sequence: {} candidates, {} replays at {:?} elements; device memory \
                 in use {} bytes before, {} after",
                report.candidates, report.replays, report.sizes, report.used_before,
                report.used_after
            ));
            }
            report
        } else {
            None
        };

    // Custom candidates that were wrong anywhere are dropped everywhere; NCCL is kept with
    // whether it matched on every rank.
    let wrong = |nccl: bool| -> Vec<Option<DropReason>> {
        collectives
            .entries()
            .iter()
            .zip(&problems)
            .map(|(entry, problem)| {
                problem
                    .as_ref()
                    .filter(|_| entry.nccl == nccl)
                    .map(|message| DropReason::NotExact {
                        message: message.clone(),
                    })
            })
            .collect()
    };
    let (custom, nccl_wrong) = (wrong(false), wrong(true));
    let agreed = agree_drops(runtime, &custom, "the exactness agreement")?;
    let nccl_agreed = agree_drops(runtime, &nccl_wrong, "the NCCL exactness agreement")?;
    collectives.apply_drops(agreed);
    let outcomes = collectives
        .entries()
        .iter()
        .zip(&nccl_agreed)
        .map(|(entry, nccl_wrong)| match &entry.dropped {
            Some(reason) => Outcome::Dropped(reason.clone()),
            None => Outcome::Qualified {
                exact: nccl_wrong.is_none(),
            },
        })
        .collect();
    Ok(QualifyReport {
        outcomes,
        runs,
        sequence,
    })
}

/// Bytes of device memory in use, after every rank got here.
fn used_memory(runtime: &Runtime, step: &str) -> Result<usize, RuntimeError> {
    runtime.all_gather(&[0], step)?;
    let (free, total) = runtime
        .device()
        .memory_info()
        .map_err(RuntimeError::driver(runtime.rank()))?;
    Ok(total - free)
}

/// The multi-size sequence: per profile that serves all of [`SEQUENCE_ROWS`]' sizes, one graph
/// per size captured first, then `replays` replays alternating the sizes, each checked.
fn run_sequence(
    checker: &mut Checker<'_>,
    stream: &mut Stream,
    ladder: &crate::ladder::Ladder,
    replays: u32,
    problems: &mut [Option<String>],
) -> Result<Option<SequenceReport>, RuntimeError> {
    let runtime = checker.runtime;
    let collectives = checker.collectives;
    let element = ladder.dtype.size_bytes();
    let sizes: Vec<usize> = SEQUENCE_ROWS
        .iter()
        .map(|rows| rows * SEQUENCE_HIDDEN)
        .filter(|&elements| elements <= collectives.capacity())
        .collect();
    let buckets: Option<Vec<usize>> = sizes
        .iter()
        .map(|&elements| ladder.bucket_for(elements as u64 * element))
        .collect();
    let Some(buckets) = buckets.filter(|buckets| !buckets.is_empty()) else {
        return Ok(None);
    };
    // Every profile that is a live candidate for each of the sizes, in ladder order.
    let mut sequences: Vec<Vec<(EntryId, usize, Graph)>> = Vec::new();
    for profile in &ladder.profiles {
        let ids: Option<Vec<EntryId>> = buckets
            .iter()
            .map(|&bucket| collectives.find_live(bucket, &profile.id))
            .collect();
        let Some(ids) = ids else { continue };
        let mut graphs = Vec::new();
        for (&id, &elements) in ids.iter().zip(&sizes) {
            graphs.push((
                id,
                elements,
                collectives.capture(runtime, stream, id, elements, 1)?,
            ));
        }
        sequences.push(graphs);
    }
    let used_before = used_memory(runtime, "the memory barrier before the sequence")?;
    let mut done = 0;
    for replay in 0..replays as usize {
        for graphs in &sequences {
            let (id, elements, graph) = &graphs[replay % graphs.len()];
            let entry = &collectives.entries()[*id];
            let step = format!(
                "{} in the multi-size sequence at {elements} elements (replay {})",
                entry.profile,
                replay + 1
            );
            if let Some(problem) = checker.run(stream, *id, graph, *elements, &step)? {
                if problems[*id].is_none() {
                    problems[*id] = Some(format!("in the multi-size sequence, {problem}"));
                }
            }
            done += 1;
        }
    }
    let used_after = used_memory(runtime, "the memory barrier after the sequence")?;
    Ok(Some(SequenceReport {
        sizes,
        candidates: sequences.len(),
        replays: done,
        used_before,
        used_after,
    }))
}
