//! Every rank of a world on one GPU: one process and one context; every rank's registered
//! buffer, signal flags and state words in that GPU's memory, where every rank's kernel reads
//! and writes its peers' as it would through peer mappings; each rank on its own stream, with
//! the launch contract and parameters of a real rank (the layout of `PeerLayout`, each
//! candidate's geometry and scratch offset as loading a package computes them). What it shows
//! and what it cannot (no NVLink or PCIe, no IPC mapping, no ordering between GPUs, no NCCL, no
//! timing) is in docs/testing.md.
//!
//! Kernels on different streams are not promised to run at once. Every block stamps an
//! arrival word with the time it began (`STATE_ARRIVAL_WORDS`), so a run whose waits passed the
//! deadline while some block had not begun is reported as not co-scheduled, neither a pass nor
//! the kernel's failure.

mod checks;
pub mod fused;
pub mod identity;
pub mod invariance;
mod norm;
mod ranks;
pub mod rows;
pub mod shapes;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use prepare::abi::PARAMS_BYTES;
use prepare::collective::{geometry_for, resident_capacity, PeerLayout};
use prepare::compile::CompiledKernel;
use prepare::device::required_residency;
use prepare::gpu::abort::{Abort, AbortReason};
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Driver, Event, Geometry, Graph, Kernel, LoadedKernel,
    Module, ModuleImage, Stream,
};
use prepare::kernels::{
    LaunchParams, MAX_BLOCKS, MAX_RANKS, SIGNAL_BYTES, STATE_ARRIVAL_WORDS, STATE_WORDS,
};
use prepare::ladder::{Arch, Ladder};
use prepare::reference::{random_rank_inputs, reference_sum};

use super::support::{compile_ptx, custom_candidates};
use crate::support::one_gpu::{judge_abort, plan_launch, LaunchPlan, Verdict};

pub use checks::{bucket_sizes, compile, dtype_name, gpu_lock, load_compiled, Outcome};
use checks::{check_connections, hex, COMPARE_PARAMS_BYTES, HELPERS, RESULT_WORDS};

/// The deadline of every spin in a checked run: long for any message here, short enough that
/// a hang fails in seconds.
pub const DEADLINE: Duration = Duration::from_millis(500);
/// How long the host waits for a run's streams; kernels end by their deadline well before.
const WAIT: Duration = Duration::from_secs(60);
/// Written over every output before a run: a NaN pattern the reference never produces.
const POISON: u8 = 0xFF;
/// Written over a local-input kernel's registered input region, which it must not touch.
const REGION_POISON: u8 = 0x5A;
/// Bytes past a message's end that must stay poison.
const GUARD_BYTES: usize = 512;
/// How long the late rank of a run waits before its input lands and its kernel starts.
const LATE: Duration = Duration::from_micros(30);
/// Datasets at the ladder's largest message; consecutive runs never use the same one, so a
/// kernel that reads a peer's previous input finds different values.
const DATASETS: usize = 3;

/// One candidate of one bucket, ready to launch on every rank.
pub struct Case {
    pub bucket: usize,
    pub profile: String,
    /// The kernel's entry name.
    pub kernel_name: String,
    kernel: LoadedKernel,
    /// Blocks that record their arrival in a launch: all of an ordinary kernel's, the first
    /// cluster's of a cluster kernel (the others return at once).
    recording: usize,
    /// The bucket's geometry for this candidate.
    pub own: Geometry,
    /// What every rank launches: `own`, or fewer blocks where not every rank's fit at once.
    pub geometry: Geometry,
    scratch_offset: u64,
}

impl Case {
    /// Whether every rank launches the bucket's own geometry.
    pub fn is_own_geometry(&self) -> bool {
        self.geometry.blocks() == self.own.blocks()
    }
}

/// One rank's memory and stream.
struct Rank {
    stream: Stream,
    buffer: DeviceBuffer,
    signals: DeviceBuffer,
    state: DeviceBuffer,
    output: DeviceBuffer,
    result: DeviceBuffer,
    /// Rank r's input of each dataset, at the ladder's largest message.
    inputs: Vec<DeviceBuffer>,
}

/// Every rank of one ladder's world on one GPU.
pub struct World<'a> {
    device: &'a Device,
    pub ladder: Ladder,
    /// Ranks in the world.
    pub size: usize,
    ranks: Vec<Rank>,
    fork: Event,
    joins: Vec<Event>,
    /// The reference sum of each dataset.
    references: Vec<DeviceBuffer>,
    /// The kernels' modules, kept loaded.
    _modules: Vec<Module>,
    _helpers: Module,
    compare: Kernel,
    sleep: Kernel,
    pub cases: Vec<Case>,
    /// Candidates no rank can launch on one GPU: (bucket, profile, why).
    pub impossible: Vec<(usize, String, String)>,
    runs: u64,
}

impl<'a> World<'a> {
    /// `ladder`'s world on `device`, its custom candidates loaded from `kernels` (compiled for
    /// the ladder's dtype and world) and planned to fit at once on the GPU, and every dataset
    /// made.
    pub fn new(
        device: &'a Device,
        ladder: Ladder,
        kernels: &[CompiledKernel],
        seed: u64,
    ) -> World<'a> {
        let world = ladder.world_size as usize;
        check_connections(world);
        let layout = PeerLayout::of(&ladder);
        let element = ladder.dtype.size_bytes() as usize;
        let capacity_bytes = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes) as usize;
        let capacity = capacity_bytes / element;
        let sms = Driver::open()
            .and_then(|driver| driver.describe(device.ordinal()))
            .unwrap()
            .sm_count;
        let mut modules = Vec::new();
        let mut loaded = HashMap::new();
        for kernel in kernels {
            let module = device
                .load_module(ModuleImage::Cubin(&kernel.cubin))
                .unwrap();
            loaded.insert(kernel.name.clone(), (module.clone(), kernel.cluster));
            modules.push(module);
        }
        let mut cases = Vec::new();
        let mut impossible = Vec::new();
        for (bucket_index, bucket, profile, spec) in custom_candidates(&ladder) {
            let id = &profile.id;
            if spec.copy_engine_barriers().is_some() {
                impossible.push((
                    bucket_index,
                    id.clone(),
                    "copy-engine kernels are not run here".to_owned(),
                ));
                continue;
            }
            let (module, cluster) = &loaded[&spec.name];
            let kernel = module.load(&spec.name, *cluster, PARAMS_BYTES).unwrap();
            let own = geometry_for(bucket, profile).unwrap();
            let capacity = resident_capacity(&kernel, own).unwrap();
            let needed = required_residency(bucket, Some(profile));
            let plan = plan_launch(needed, capacity, world as u32, own.cluster_size(), sms);
            let Some(blocks) = plan.blocks(own.blocks()) else {
                impossible.push((
                    bucket_index,
                    id.clone(),
                    format!("not one block per rank fits: the GPU holds {capacity}"),
                ));
                continue;
            };
            let geometry = match (plan, own.cluster_size()) {
                (LaunchPlan::Own, _) => own,
                (_, Some(size)) => Geometry::clustered(blocks, own.threads(), size)
                    .unwrap()
                    .into(),
                (_, None) => Geometry::new(blocks, own.threads()).unwrap(),
            };
            let recording = if *cluster {
                own.cluster_size().unwrap_or(1) as usize
            } else {
                geometry.blocks() as usize
            };
            cases.push(Case {
                bucket: bucket_index,
                profile: id.clone(),
                kernel_name: spec.name.clone(),
                kernel,
                recording,
                own,
                geometry,
                scratch_offset: layout.scratch_offset(&ladder, &spec),
            });
        }
        let datasets: Vec<Vec<Vec<u8>>> = (0..DATASETS as u64)
            .map(|dataset| random_rank_inputs(ladder.dtype, seed + dataset, world, capacity))
            .collect();
        let stream = device.new_stream().unwrap();
        let upload = |bytes: &[u8]| {
            let buffer = device.allocate(bytes.len().max(16)).unwrap();
            stream.write(&buffer, 0, bytes).unwrap();
            buffer
        };
        let references = datasets
            .iter()
            .map(|inputs| {
                let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
                upload(&reference_sum(ladder.dtype, &views))
            })
            .collect();
        let ranks = (0..world)
            .map(|rank| Rank {
                stream: device.new_stream().unwrap(),
                buffer: device.allocate(layout.buffer_bytes() as usize).unwrap(),
                signals: device.allocate(SIGNAL_BYTES as usize).unwrap(),
                state: device.allocate(STATE_WORDS * 8).unwrap(),
                output: device.allocate(capacity_bytes + GUARD_BYTES).unwrap(),
                result: device.allocate(2 * RESULT_WORDS * 8).unwrap(),
                inputs: datasets
                    .iter()
                    .map(|inputs| upload(&inputs[rank]))
                    .collect(),
            })
            .collect();
        let helpers = device
            .load_module(ModuleImage::Ptx(&compile_ptx(HELPERS, Arch::Sm90.name())))
            .unwrap();
        let this = World {
            compare: helpers
                .kernel("one_gpu_compare", COMPARE_PARAMS_BYTES)
                .unwrap(),
            sleep: helpers.kernel("one_gpu_sleep", 8).unwrap(),
            _helpers: helpers,
            device,
            ranks,
            fork: device.new_event(false).unwrap(),
            joins: (0..world)
                .map(|_| device.new_event(false).unwrap())
                .collect(),
            references,
            _modules: modules,
            cases,
            impossible,
            runs: 0,
            size: world,
            ladder,
        };
        this.reset();
        this
    }

    /// Bytes of each rank's output, guard included.
    pub fn output_bytes(&self) -> usize {
        self.ranks[0].output.len_bytes()
    }

    fn element_bytes(&self) -> usize {
        self.ladder.dtype.size_bytes() as usize
    }

    /// Zeroes every rank's signals, state words and whole buffer together (no launch in
    /// flight): after an abort, the only way the kernels are usable again.
    pub fn reset(&self) {
        for rank in &self.ranks {
            rank.stream.synchronize_within(WAIT).unwrap();
        }
        for rank in &self.ranks {
            for memory in [&rank.signals, &rank.state, &rank.buffer] {
                rank.stream
                    .fill_u8(memory, 0..memory.len_bytes(), 0)
                    .unwrap();
            }
            rank.stream.synchronize_within(WAIT).unwrap();
        }
    }

    /// The parameters rank `rank` launches `case` with, for a message of `elements` already in
    /// its buffer, summed into its output at `output_offset`.
    fn params(
        &self,
        case: &Case,
        rank: usize,
        elements: usize,
        output_offset: usize,
        deadline: Duration,
    ) -> LaunchParams {
        let mut buffers = [0_u64; MAX_RANKS];
        let mut signals = [0_u64; MAX_RANKS];
        for (peer, memory) in self.ranks.iter().enumerate() {
            buffers[peer] = memory.buffer.address();
            signals[peer] = memory.signals.address();
        }
        let me = &self.ranks[rank];
        LaunchParams {
            buffers,
            signals,
            state: me.state.address(),
            output: me.output.address() + output_offset as u64,
            input: me.buffer.address(),
            scratch_offset: case.scratch_offset,
            timeout_ns: deadline.as_nanos() as u64,
            rank: rank as u32,
            world: self.size as u32,
            ..LaunchParams::all_reduce(elements as u64)
        }
    }

    /// Queues one all-reduce of `elements` of `dataset` on every rank in `present`, each on its
    /// own stream: the output poisoned, the late rank's wait, the input copied into the rank's
    /// buffer, then the kernel.
    fn enqueue(&self, step: &Step<'_>, present: &[bool], late: Option<usize>, deadline: Duration) {
        let bytes = step.elements * self.element_bytes();
        for (rank, memory) in self.ranks.iter().enumerate() {
            if !present[rank] {
                continue;
            }
            let stream = &memory.stream;
            let output = step.output_offset..step.output_offset + bytes + GUARD_BYTES;
            stream.fill_u8(&memory.output, output, POISON).unwrap();
            if late == Some(rank) {
                let wait = (LATE.as_nanos() as u64).to_ne_bytes();
                stream
                    .launch(&self.sleep, Geometry::new(1, 32).unwrap(), &wait)
                    .unwrap();
            }
            stream
                .copy_device(&memory.buffer, 0, &memory.inputs[step.dataset], 0, bytes)
                .unwrap();
            let params = self.params(step.case, rank, step.elements, step.output_offset, deadline);
            stream
                .launch_loaded(&step.case.kernel, step.case.geometry, &params.to_bytes())
                .unwrap();
        }
    }

    /// Every rank's arrival words.
    fn arrivals(&self) -> Vec<Vec<u64>> {
        self.ranks
            .iter()
            .map(|rank| {
                let mut words = vec![0_u64; MAX_BLOCKS];
                rank.stream
                    .read(&rank.state, STATE_ARRIVAL_WORDS * 8, &mut words)
                    .unwrap();
                words
            })
            .collect()
    }

    /// Every rank's abort word.
    pub fn aborts(&self) -> Vec<Option<Abort>> {
        self.ranks
            .iter()
            .map(|rank| {
                let mut word = [0_u64];
                rank.stream.read(&rank.state, 0, &mut word).unwrap();
                Abort::decode(word[0])
            })
            .collect()
    }

    fn synchronize(&self, present: &[bool]) -> Result<(), String> {
        for (rank, memory) in self.ranks.iter().enumerate() {
            if present[rank] {
                memory
                    .stream
                    .synchronize_within(WAIT)
                    .map_err(|error| format!("rank {rank}: {error}"))?;
            }
        }
        Ok(())
    }

    /// Judges a finished run of `steps` on every rank: the abort words (with the arrivals
    /// from `before`), then every step's output, guard and input against the references.
    fn judge(&self, steps: &[Step<'_>], before: &[Vec<u64>]) -> Outcome {
        let everyone = vec![true; self.size];
        if let Some((rank, abort)) = self
            .aborts()
            .into_iter()
            .enumerate()
            .find_map(|(rank, abort)| abort.map(|abort| (rank, abort)))
        {
            let recording = steps
                .iter()
                .map(|step| step.case.recording)
                .max()
                .unwrap_or(0);
            let deadline = DEADLINE.as_nanos() as u64;
            let verdict = judge_abort(before, &self.arrivals(), recording, &everyone, deadline);
            self.reset();
            return match verdict {
                Verdict::NotCoScheduled { never, late } => Outcome::NotCoScheduled { never, late },
                Verdict::KernelAborted => Outcome::Aborted {
                    rank,
                    abort: abort.to_string(),
                },
            };
        }
        let after = self.arrivals();
        let recording = steps
            .iter()
            .map(|step| step.case.recording)
            .max()
            .unwrap_or(0);
        for (rank, (before, after)) in before.iter().zip(&after).enumerate() {
            if let Some(block) = (0..recording).find(|&block| after[block] == before[block]) {
                return Outcome::Failed(format!(
                    "rank {rank} block {block}: its arrival word did not change, yet no rank \
                     aborted"
                ));
            }
        }
        for (index, step) in steps.iter().enumerate() {
            // The buffer holds the last step's input; earlier steps' were overwritten.
            let outcome = self.compare(step, index + 1 == steps.len());
            if !outcome.passed() {
                return outcome;
            }
        }
        Outcome::Pass
    }

    /// One step's output on every rank against the reference, its guard still poison, and its
    /// input still the dataset's.
    fn compare(&self, step: &Step<'_>, input_kept: bool) -> Outcome {
        let element = self.element_bytes();
        for memory in &self.ranks {
            let stream = &memory.stream;
            stream
                .fill_u8(&memory.result, 0..memory.result.len_bytes(), 0)
                .unwrap();
            for first in [1, RESULT_WORDS + 1] {
                stream
                    .fill_u8(&memory.result, first * 8..first * 8 + 8, 0xFF)
                    .unwrap();
            }
            let comparisons = [
                (
                    memory.output.address() + step.output_offset as u64,
                    self.references[step.dataset].address(),
                    GUARD_BYTES,
                ),
                (
                    memory.buffer.address(),
                    memory.inputs[step.dataset].address(),
                    0,
                ),
            ];
            for (index, (found, expected, guard)) in comparisons.into_iter().enumerate() {
                let words = [
                    found,
                    expected,
                    step.elements as u64,
                    element as u64,
                    guard as u64,
                    memory.result.address() + (index * RESULT_WORDS * 8) as u64,
                ];
                let params: Vec<u8> = words.iter().flat_map(|word| word.to_ne_bytes()).collect();
                stream
                    .launch(&self.compare, Geometry::new(264, 256).unwrap(), &params)
                    .unwrap();
            }
        }
        for (rank, memory) in self.ranks.iter().enumerate() {
            let mut result = [0_u64; 2 * RESULT_WORDS];
            memory.stream.read(&memory.result, 0, &mut result).unwrap();
            let [wrong, first, guard, input_wrong, input_first, _] = result;
            if wrong > 0 {
                let mut found = vec![0_u8; element];
                let mut expected = vec![0_u8; element];
                let at = first as usize * element;
                memory
                    .stream
                    .read(&memory.output, step.output_offset + at, &mut found)
                    .unwrap();
                memory
                    .stream
                    .read(&self.references[step.dataset], at, &mut expected)
                    .unwrap();
                return Outcome::Mismatch {
                    rank,
                    index: first,
                    wrong,
                    found: hex(&found),
                    expected: hex(&expected),
                };
            }
            if guard > 0 {
                return Outcome::Overrun { rank, bytes: guard };
            }
            if input_kept && input_wrong > 0 {
                return Outcome::InputChanged {
                    rank,
                    index: input_first,
                };
            }
        }
        Outcome::Pass
    }

    /// The next dataset: never the one the previous run used.
    fn next_dataset(&mut self) -> usize {
        self.runs += 1;
        (self.runs % DATASETS as u64) as usize
    }

    /// The rank that starts late in the next run, in turn.
    fn next_late(&self) -> usize {
        (self.runs % self.size as u64) as usize
    }

    /// One eager all-reduce of `elements` by `case` on every rank, one rank late.
    pub fn run_eager(&mut self, case: usize, elements: usize) -> Outcome {
        let dataset = self.next_dataset();
        let late = Some(self.next_late());
        let case = &self.cases[case];
        let step = Step {
            case,
            elements,
            dataset,
            output_offset: 0,
        };
        let before = self.arrivals();
        self.enqueue(&step, &vec![true; self.size], late, DEADLINE);
        if let Err(message) = self.synchronize(&vec![true; self.size]) {
            return Outcome::Failed(message);
        }
        self.judge(&[step], &before)
    }

    /// Replays a captured graph and judges it.
    fn replay(&self, captured: &Captured, steps: &[Step<'_>]) -> Outcome {
        let before = self.arrivals();
        captured.graph.launch().unwrap();
        if let Err(error) = captured.stream.synchronize_within(WAIT) {
            return Outcome::Failed(format!("replay: {error}"));
        }
        self.judge(steps, &before)
    }

    /// `case` at `elements` captured in two graphs of different datasets, replayed in turn
    /// `replays` times each, every replay judged.
    pub fn run_graphs(&mut self, case: usize, elements: usize, replays: usize) -> Outcome {
        let datasets = [self.next_dataset(), self.next_dataset()];
        let late = Some(self.next_late());
        let this = &*self;
        let steps: Vec<[Step<'_>; 1]> = datasets
            .iter()
            .map(|&dataset| {
                [Step {
                    case: &this.cases[case],
                    elements,
                    dataset,
                    output_offset: 0,
                }]
            })
            .collect();
        let graphs: Vec<Captured> = steps
            .iter()
            .map(|step| capture_with(this, step, late))
            .collect();
        for _ in 0..replays {
            for (graph, step) in graphs.iter().zip(&steps) {
                let outcome = this.replay(graph, step);
                if !outcome.passed() {
                    return outcome;
                }
            }
        }
        Outcome::Pass
    }

    /// One graph of every `(case, elements)` in turn on every rank, each into its own part of
    /// the output, replayed `replays` times: every output exact after each replay, and the
    /// device's free memory the same after the replays as before.
    pub fn run_sequence(&mut self, sequence: &[(usize, usize)], replays: usize) -> Outcome {
        let element = self.element_bytes();
        let mut offset = 0;
        let mut steps = Vec::new();
        for &(case, elements) in sequence {
            let dataset = self.next_dataset();
            let output_offset = offset;
            offset = (offset + elements * element + GUARD_BYTES).next_multiple_of(256);
            steps.push((case, elements, dataset, output_offset));
        }
        let output_bytes = self.ranks[0].output.len_bytes();
        if offset > output_bytes {
            return Outcome::Failed(format!(
                "the sequence needs {offset} bytes of output; each rank has {output_bytes}"
            ));
        }
        let this = &*self;
        let steps: Vec<Step<'_>> = steps
            .into_iter()
            .map(|(case, elements, dataset, output_offset)| Step {
                case: &this.cases[case],
                elements,
                dataset,
                output_offset,
            })
            .collect();
        let graph = capture_with(this, &steps, None);
        graph.graph.upload().unwrap();
        let free_before = this.device.memory_info().unwrap().0;
        for replay in 0..replays {
            let outcome = this.replay(&graph, &steps);
            if !outcome.passed() {
                return Outcome::Failed(format!("replay {replay}: {outcome}"));
            }
        }
        let free_after = this.device.memory_info().unwrap().0;
        if free_after != free_before {
            return Outcome::Failed(format!(
                "free device memory went from {free_before} to {free_after} bytes over {replays} \
                 replays"
            ));
        }
        Outcome::Pass
    }

    /// `case` at `elements` with the last rank never launching, under a deadline of
    /// `deadline`: every other rank must return within it (with a second's slack), its abort
    /// word naming the last rank; then three launches on every rank return within one
    /// deadline, the others' abort words unchanged (they return at once) and the last rank's
    /// naming another (it waits for them in vain). The ranks' memory is zeroed after.
    pub fn run_missing_rank(
        &mut self,
        case: usize,
        elements: usize,
        deadline: Duration,
    ) -> Outcome {
        let outcome = self.missing_rank(case, elements, deadline);
        self.reset();
        outcome
    }

    fn missing_rank(&mut self, case: usize, elements: usize, deadline: Duration) -> Outcome {
        let missing = self.size - 1;
        let dataset = self.next_dataset();
        let step = Step {
            case: &self.cases[case],
            elements,
            dataset,
            output_offset: 0,
        };
        let slack = Duration::from_secs(1);
        let mut present = vec![true; self.size];
        present[missing] = false;
        let started = Instant::now();
        self.enqueue(&step, &present, None, deadline);
        if let Err(message) = self.synchronize(&present) {
            return Outcome::Failed(message);
        }
        let waited = started.elapsed();
        if waited > deadline + slack {
            return Outcome::Failed(format!(
                "the ranks that launched took {waited:?} to return, past the {deadline:?} \
                 deadline"
            ));
        }
        let first = self.aborts();
        for (rank, abort) in first.iter().enumerate().take(missing) {
            if !names(abort.as_ref(), |peer| peer == missing) {
                return Outcome::Failed(format!(
                    "rank {rank}: abort word {abort:?}, not a timeout naming rank {missing}"
                ));
            }
        }
        let everyone = vec![true; self.size];
        let started = Instant::now();
        for _ in 0..3 {
            self.enqueue(&step, &everyone, None, deadline);
        }
        if let Err(message) = self.synchronize(&everyone) {
            return Outcome::Failed(message);
        }
        let waited = started.elapsed();
        let after = self.aborts();
        for rank in 0..missing {
            if after[rank] != first[rank] {
                return Outcome::Failed(format!(
                    "rank {rank}: abort word {:?} became {:?}",
                    first[rank], after[rank]
                ));
            }
        }
        if !names(after[missing].as_ref(), |peer| peer < missing) {
            return Outcome::Failed(format!(
                "rank {missing}: abort word {:?}, not a timeout naming another rank",
                after[missing]
            ));
        }
        if waited > deadline + slack {
            return Outcome::Failed(format!(
                "three launches after the abort took {waited:?}, more than one deadline"
            ));
        }
        Outcome::Pass
    }
}

/// Whether `abort` is a peer timeout naming a rank `peer` accepts.
fn names(abort: Option<&Abort>, peer: impl Fn(usize) -> bool) -> bool {
    abort.is_some_and(|abort| abort.reason == AbortReason::PeerTimeout && peer(abort.rank as usize))
}

/// One all-reduce of a run: a case, its message, the dataset and where its sum goes.
struct Step<'c> {
    case: &'c Case,
    elements: usize,
    dataset: usize,
    output_offset: usize,
}

/// A graph and the stream it replays on.
struct Captured {
    stream: Stream,
    graph: Graph,
}

/// Captures `steps` on every rank into one graph with one branch per rank: each rank's stream
/// forked from a capture stream of its own and joined back.
fn capture_with(world: &World<'_>, steps: &[Step<'_>], late: Option<usize>) -> Captured {
    let everyone = vec![true; world.size];
    let mut stream = world.device.new_stream().unwrap();
    let graph = stream
        .capture(|capturing| {
            capturing.record(&world.fork)?;
            for rank in &world.ranks {
                rank.stream.wait_for(&world.fork)?;
            }
            for step in steps {
                world.enqueue(step, &everyone, late, DEADLINE);
            }
            for (rank, join) in world.ranks.iter().zip(&world.joins) {
                rank.stream.record(join)?;
                capturing.wait_for(join)?;
            }
            Ok::<(), prepare::gpu::driver::DriverError>(())
        })
        .unwrap();
    Captured { stream, graph }
}
