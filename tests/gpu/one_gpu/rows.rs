//! The reduce-scatter and all-gather kernels on one GPU, every rank a stream of it, as the
//! all-reduce's world (mod.rs) but without a ladder: each row kernel of the kernel table,
//! loaded by its `KernelSpec` (pull and push with barriers, push with `ll`, the all-gather's
//! copy engine with its copies on a second stream of each rank, as the serving handle enqueues
//! them), at 2, 4 and 8 ranks and in every type, at rows 0, 1, world - 1,
//! world + 1, 2047 and 2048 of widths 1, 7 and 4096, out of place and in place, eagerly with one
//! rank late and in a graph of every rank replayed twice. Every rank's output must be
//! `prepare::reference::reference_outputs`'s, the bytes after it still poison, and its input
//! unchanged (but for a reduce-scatter in place, whose output is its rows of its input).
//! A shipped reduce-scatter or all-gather ladder's custom candidates run the same way at their
//! buckets' geometry and sizes ([`check_row_ladder`]).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use prepare::abi::PARAMS_BYTES;
use prepare::collective::{gather_copies, geometry_for, resident_capacity, RowMessage};
use prepare::compile::SourceOverrides;
use prepare::device::required_residency;
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Driver, Event, Geometry, LoadedKernel, Module, ModuleImage,
    Stream,
};
use prepare::kernels::{
    input_access, is_double_buffered, kernel_for, scratch_bytes, InputAccess, KernelSpec,
    LaunchParams,
};
use prepare::ladder::{Bucket, Collective, Dtype, Ladder, Profile};
use prepare::reference::{random_rank_inputs, reference_outputs};
use prepare::shape::Shape;

use super::ranks::Ranks;
use super::{compile, dtype_name, DEADLINE, GUARD_BYTES, POISON, REGION_POISON, WAIT};
use crate::gpu::support::WORLDS;
use crate::support::one_gpu::{plan_launch, LaunchPlan};

/// Blocks and threads of every launch of the kernel table's check: eight ranks' blocks fit one
/// to a multiprocessor.
pub(super) const BLOCKS: u32 = 8;
pub(super) const THREADS: u32 = 256;

/// The shapes every row kernel is checked at.
pub(super) fn shapes(world: usize) -> Vec<Shape> {
    let world = world as u64;
    [0, 1, world - 1, world + 1, 2047, 2048]
        .into_iter()
        .flat_map(|rows| [1, 7, 4096].map(|width| Shape::new(rows, width).unwrap()))
        .collect()
}

/// The row kernels of the table: (collective, kernel), both transfers of each collective with
/// barriers, the push with `ll`, and the all-gather's copy engine.
pub(super) fn row_kernels(dtype: Dtype, world: usize) -> Vec<(Collective, KernelSpec)> {
    let mut kernels = Vec::new();
    for collective in [Collective::ReduceScatter, Collective::AllGather] {
        let copy_engine =
            (collective == Collective::AllGather).then_some(("copy_engine", "barrier"));
        let forms = [("pull", "barrier"), ("push", "barrier"), ("push", "ll")];
        for (transfer, protocol) in forms.into_iter().chain(copy_engine) {
            let profile: Profile = serde_json::from_value(serde_json::json!({
                "id": transfer, "algorithm": "one_shot", "transfer": transfer,
                "protocol": protocol
            }))
            .unwrap();
            let spec = kernel_for(&profile, collective, dtype, world as u32).unwrap_or_else(|| {
                panic!("the table has no {collective} {transfer} {protocol} kernel")
            });
            kernels.push((collective, spec));
        }
    }
    kernels
}

/// One rank's operands (its stream and registered memory are the `Ranks`').
struct Rank {
    /// Room for the whole message and its guard (the all-gather's output, the local
    /// reduce-scatter's input).
    whole: DeviceBuffer,
    /// Room for this rank's rows and their guard, out of place (the reduce-scatter's output,
    /// the local all-gather's input).
    own: DeviceBuffer,
    /// This shape's input of this rank, the whole message.
    source: DeviceBuffer,
    /// A chained run's input: what the run before it wrote, at this rank's rows
    /// (identity.rs).
    chained: DeviceBuffer,
    /// The copy engine's second stream, and the events that fork it from the rank's stream and
    /// join it back.
    copies: Stream,
    fork: Event,
    join: Event,
}

/// Every rank of one world on one GPU, with the row kernels of one type loaded.
pub(super) struct RowWorld<'a> {
    pub(super) world: Ranks<'a>,
    pub(super) dtype: Dtype,
    pub(super) size: usize,
    ranks: Vec<Rank>,
    /// The input region of every rank's buffer; the barrier kernels' shared scratch follows it,
    /// then each double-buffered kernel's own region.
    region_bytes: usize,
    /// Where each kernel's scratch starts in the buffer, by kernel name.
    scratch_offsets: HashMap<String, u64>,
    kernels: HashMap<String, LoadedKernel>,
    /// A copy-engine kernel's start and end barriers, by the kernel's name.
    barriers: HashMap<String, [LoadedKernel; 2]>,
    _modules: Vec<Module>,
}

/// One launch of a kernel on every rank: what each rank's parameters and memory are.
pub(super) struct Run<'s> {
    pub(super) collective: Collective,
    pub(super) spec: &'s KernelSpec,
    pub(super) shape: Shape,
    pub(super) in_place: bool,
    pub(super) blocks: u32,
    pub(super) threads: u32,
    /// The input comes from the rank's chained buffer, not its source (identity.rs).
    pub(super) chained: bool,
}

impl Run<'_> {
    fn gather(&self) -> bool {
        self.collective == Collective::AllGather
    }

    fn local(&self) -> bool {
        input_access(self.spec) == Some(InputAccess::Local)
    }

    fn copy_engine(&self) -> bool {
        self.spec.copy_engine_barriers().is_some()
    }

    pub(super) fn describe(&self) -> String {
        format!(
            "{} {} x {}{} on {} x {}",
            self.spec.name,
            self.shape.rows(),
            self.shape.width(),
            if self.in_place { " in place" } else { "" },
            self.blocks,
            self.threads
        )
    }
}

/// Where a rank's input and output are, as (memory, byte offset) and element counts.
pub(super) struct Places<'r> {
    input: (&'r DeviceBuffer, usize),
    input_elements: u64,
    pub(super) output: (&'r DeviceBuffer, usize),
    pub(super) output_elements: u64,
    /// Where the test writes the caller's input (the input itself, but for a pulled all-gather,
    /// whose input region gets a copy of it).
    values: (&'r DeviceBuffer, usize),
    /// This rank's first element of the message.
    pub(super) first: u64,
}

impl<'a> RowWorld<'a> {
    /// Every rank of `world` with `specs` loaded, for messages up to `largest` bytes.
    pub(super) fn new(
        device: &'a Device,
        dtype: Dtype,
        world: usize,
        specs: &[KernelSpec],
        largest: usize,
    ) -> RowWorld<'a> {
        let region_bytes = (largest + GUARD_BYTES).next_multiple_of(256);
        // As the host lays them out: the barrier kernels share one region, and each
        // double-buffered kernel has one no other kernel touches.
        let bytes = |spec: &KernelSpec| {
            (scratch_bytes(spec, largest as u64) as usize).next_multiple_of(256)
        };
        let shared = specs
            .iter()
            .filter(|spec| !is_double_buffered(spec))
            .map(bytes)
            .max()
            .unwrap_or(0);
        let mut scratch_offsets = HashMap::new();
        let mut scratch = shared;
        for spec in specs {
            if is_double_buffered(spec) {
                scratch_offsets.insert(spec.name.clone(), (region_bytes + scratch) as u64);
                scratch += bytes(spec);
            } else {
                scratch_offsets.insert(spec.name.clone(), region_bytes as u64);
            }
        }
        let compiled = compile(specs, world as u32, &SourceOverrides::new(), "embedded")
            .unwrap_or_else(|error| panic!("the row kernels do not compile: {error}"));
        let mut modules = Vec::new();
        let mut kernels = HashMap::new();
        let mut barriers = HashMap::new();
        for kernel in &compiled {
            let module = device
                .load_module(ModuleImage::Cubin(&kernel.cubin))
                .unwrap();
            let loaded = module.load(&kernel.name, false, PARAMS_BYTES).unwrap();
            kernels.insert(kernel.name.clone(), loaded);
            let spec = specs.iter().find(|spec| spec.name == kernel.name);
            if let Some(names) = spec.and_then(KernelSpec::copy_engine_barriers) {
                let load = |name: &String| module.load(name, false, PARAMS_BYTES).unwrap();
                barriers.insert(kernel.name.clone(), names.each_ref().map(load));
            }
            modules.push(module);
        }
        let ranks = (0..world)
            .map(|_| Rank {
                whole: device.allocate(largest + 2 * GUARD_BYTES).unwrap(),
                own: device.allocate(largest + 2 * GUARD_BYTES).unwrap(),
                source: device.allocate(largest.max(16)).unwrap(),
                chained: device.allocate(largest.max(16)).unwrap(),
                copies: device.new_stream().unwrap(),
                fork: device.new_event(false).unwrap(),
                join: device.new_event(false).unwrap(),
            })
            .collect();
        RowWorld {
            world: Ranks::new(device, world, region_bytes + scratch),
            dtype,
            size: world,
            ranks,
            region_bytes,
            scratch_offsets,
            kernels,
            barriers,
            _modules: modules,
        }
    }

    /// Rank `rank`'s chained buffer: a chained run's input, at the rank's rows.
    pub(super) fn chained(&self, rank: usize) -> &DeviceBuffer {
        &self.ranks[rank].chained
    }

    pub(super) fn places<'r>(&'r self, run: &Run<'_>, rank: usize) -> Places<'r> {
        let me = &self.ranks[rank];
        let buffer = &self.world.members[rank].buffer;
        let element = self.dtype.size_bytes();
        let owned = run
            .shape
            .owned_elements(self.size as u32, rank as u32)
            .unwrap();
        let (first, own) = (owned.start, owned.end - owned.start);
        let whole = run.shape.elements();
        let at = (first * element) as usize;
        if run.gather() {
            let values = if run.in_place {
                (&me.whole, GUARD_BYTES + at)
            } else {
                (&me.own, GUARD_BYTES)
            };
            // The copy engine's own-rows copy reads them where they are in place, as the
            // serving handle gives it; its peers read them from the input region.
            let own_rows = run.local() || (run.copy_engine() && run.in_place);
            Places {
                input: if own_rows { values } else { (buffer, 0) },
                input_elements: own,
                output: (&me.whole, GUARD_BYTES),
                output_elements: whole,
                values,
                first,
            }
        } else {
            let input = if run.local() {
                (&me.whole, GUARD_BYTES)
            } else {
                (buffer, 0)
            };
            Places {
                input,
                input_elements: whole,
                output: if run.in_place {
                    (input.0, input.1 + at)
                } else {
                    (&me.own, GUARD_BYTES)
                },
                output_elements: own,
                values: input,
                first,
            }
        }
    }

    /// Queues `run` on every rank, `late` starting late: the output poisoned (and the bytes
    /// before and after it), the input copied from the rank's source (or its chained buffer),
    /// then the kernel.
    pub(super) fn enqueue(&self, run: &Run<'_>, late: Option<usize>) {
        let element = self.dtype.size_bytes() as usize;
        let kernel = &self.kernels[&run.spec.name];
        let (buffers, signals) = self.world.peers();
        for (rank, (memory, registered)) in self.ranks.iter().zip(&self.world.members).enumerate() {
            let places = self.places(run, rank);
            let stream = &registered.stream;
            for target in [&memory.whole, &memory.own] {
                stream
                    .fill_u8(target, 0..target.len_bytes(), POISON)
                    .unwrap();
            }
            let region = if run.local() { REGION_POISON } else { POISON };
            stream
                .fill_u8(&registered.buffer, 0..self.region_bytes, region)
                .unwrap();
            self.world.wait_if_late(rank, late);
            // A rank's input: the whole message of its source, or its own rows of it.
            let (from, bytes) = if run.gather() {
                (
                    places.first as usize * element,
                    places.input_elements as usize * element,
                )
            } else {
                (0, places.input_elements as usize * element)
            };
            let (values, offset) = places.values;
            let source = if run.chained {
                &memory.chained
            } else {
                &memory.source
            };
            if bytes > 0 {
                stream
                    .copy_device(values, offset, source, from, bytes)
                    .unwrap();
                // A pulled all-gather's peers read this rank's rows from its input region.
                if run.gather() && !run.local() {
                    stream
                        .copy_device(&registered.buffer, 0, source, from, bytes)
                        .unwrap();
                }
            }
            let params = LaunchParams {
                buffers,
                signals,
                state: registered.state.address(),
                output: places.output.0.address() + places.output.1 as u64,
                input: places.input.0.address() + places.input.1 as u64,
                input_elements: places.input_elements,
                output_elements: places.output_elements,
                rows: run.shape.rows(),
                width: run.shape.width(),
                scratch_offset: self.scratch_offsets[&run.spec.name],
                timeout_ns: DEADLINE.as_nanos() as u64,
                rank: rank as u32,
                world: self.size as u32,
                ..LaunchParams::all_reduce(0)
            };
            let geometry = Geometry::new(run.blocks, run.threads).unwrap();
            if let Some([start, end]) = self.barriers.get(&run.spec.name) {
                self.enqueue_copy_engine(run, rank, &params, (kernel, geometry), [start, end]);
            } else {
                stream
                    .launch_loaded(kernel, geometry, &params.to_bytes())
                    .unwrap();
            }
        }
    }

    /// Rank `rank`'s copy-engine all-gather as the serving handle enqueues it
    /// (src/collective/copy_engine.rs): the start barrier; on the rank's copy stream, forked
    /// after it, `gather_copies` from each owner's registered buffer to the output; the own-rows
    /// copy; the join; the end barrier.
    fn enqueue_copy_engine(
        &self,
        run: &Run<'_>,
        rank: usize,
        params: &LaunchParams,
        (own_rows, geometry): (&LoadedKernel, Geometry),
        [start, end]: [&LoadedKernel; 2],
    ) {
        let memory = &self.ranks[rank];
        let stream = &self.world.members[rank].stream;
        let (output, at) = self.places(run, rank).output;
        let message = RowMessage::new(
            run.collective,
            run.shape,
            self.size as u32,
            rank as u32,
            self.dtype,
        )
        .unwrap();
        let bytes = params.to_bytes();
        let one_block = Geometry::new(1, 32).unwrap();
        stream.launch_loaded(start, one_block, &bytes).unwrap();
        stream.record(&memory.fork).unwrap();
        memory.copies.wait_for(&memory.fork).unwrap();
        for copy in gather_copies(&message) {
            let from = &self.world.members[copy.owner as usize].buffer;
            memory
                .copies
                .copy_device(output, at + copy.to as usize, from, 0, copy.bytes as usize)
                .unwrap();
        }
        stream.launch_loaded(own_rows, geometry, &bytes).unwrap();
        memory.copies.record(&memory.join).unwrap();
        stream.wait_for(&memory.join).unwrap();
        stream.launch_loaded(end, one_block, &bytes).unwrap();
    }

    /// Judges a finished run: the abort words, then every rank's output, the bytes around it
    /// and its input, against `expected` (each rank's output) and `inputs` (each rank's).
    pub(super) fn judge(
        &self,
        run: &Run<'_>,
        before: &[Vec<u64>],
        expected: &[Vec<u8>],
        inputs: &[Vec<u8>],
    ) -> Result<(), String> {
        self.world.finished(before, run.blocks as usize)?;
        let element = self.dtype.size_bytes() as usize;
        for (rank, memory) in self.world.members.iter().enumerate() {
            let places = self.places(run, rank);
            let (output, offset) = places.output;
            let bytes = places.output_elements as usize * element;
            let mut found = vec![0_u8; bytes + GUARD_BYTES];
            memory.stream.read(output, offset, &mut found).unwrap();
            if let Some(index) = (0..bytes / element.max(1)).find(|&e| {
                found[e * element..][..element] != expected[rank][e * element..][..element]
            }) {
                return Err(format!("rank {rank}: output element {index} differs"));
            }
            // In place, a reduce-scatter's output is followed by the next rank's rows of its
            // input, which the input's check covers.
            let in_place_scatter = run.in_place && !run.gather();
            if !in_place_scatter && found[bytes..].iter().any(|&byte| byte != POISON) {
                return Err(format!("rank {rank}: wrote past its output"));
            }
            let input_bytes = places.input_elements as usize * element;
            if input_bytes > 0 && (!run.in_place || in_place_scatter) {
                let (input, offset) = places.input;
                let bytes = input_bytes;
                let mut kept = vec![0_u8; bytes];
                memory.stream.read(input, offset, &mut kept).unwrap();
                let own = if in_place_scatter {
                    places.first as usize * element
                        ..(places.first + places.output_elements) as usize * element
                } else {
                    0..0
                };
                let changed = (0..bytes).find(|&b| !own.contains(&b) && kept[b] != inputs[rank][b]);
                if let Some(byte) = changed {
                    return Err(format!("rank {rank}: input byte {byte} changed"));
                }
            }
        }
        Ok(())
    }

    /// `run` eagerly with rank `late` late, then in a graph of every rank replayed, each judged.
    fn check(
        &self,
        run: &Run<'_>,
        late: usize,
        expected: &[Vec<u8>],
        inputs: &[Vec<u8>],
    ) -> Result<(), String> {
        self.world
            .eager_then_graph(late, &|late| self.enqueue(run, late), &|before| {
                self.judge(run, before, expected, inputs)
            })
    }
}

/// One shape's data: every rank's whole message (in its source buffer too) and its own rows.
pub(super) struct ShapeData {
    inputs: Vec<Vec<u8>>,
    own_rows: Vec<Vec<u8>>,
}

impl ShapeData {
    /// Every rank's input of `collective` and the reference outputs.
    pub(super) fn of(
        &self,
        collective: Collective,
        dtype: Dtype,
        shape: Shape,
    ) -> (&[Vec<u8>], Vec<Vec<u8>>) {
        let inputs = match collective {
            Collective::AllGather => &self.own_rows,
            _ => &self.inputs,
        };
        let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
        let expected = reference_outputs(collective, dtype, shape, &views).unwrap();
        (inputs, expected)
    }
}

impl RowWorld<'_> {
    /// Draws `shape`'s inputs from `seed` and writes each rank's to its source buffer.
    pub(super) fn load(&self, shape: Shape, seed: u64) -> ShapeData {
        let (world, element) = (self.size, self.dtype.size_bytes() as usize);
        let elements = shape.elements() as usize;
        let inputs = random_rank_inputs(self.dtype, seed, world, elements);
        for (rank, input) in inputs.iter().enumerate().filter(|_| elements > 0) {
            let stream = &self.world.members[rank].stream;
            stream.write(&self.ranks[rank].source, 0, input).unwrap();
            stream.synchronize_within(WAIT).unwrap();
        }
        let own_rows = inputs
            .iter()
            .enumerate()
            .map(|(rank, input)| {
                let owned = shape.owned_elements(world as u32, rank as u32).unwrap();
                input[owned.start as usize * element..owned.end as usize * element].to_vec()
            })
            .collect();
        ShapeData { inputs, own_rows }
    }
}

/// Every row kernel at 2, 4 and 8 ranks, in every type and shape, in place and not, eager and
/// in graphs: the table of what passed, and every failure.
pub fn check_every_row_kernel(device: &Device) -> Result<String, String> {
    let mut table = String::from(
        "| world | dtype | kernel | runs exact | time |\n| --- | --- | --- | --- | --- |\n",
    );
    let mut failures = Vec::new();
    for world in WORLDS {
        for dtype in Dtype::ALL {
            let largest = shapes(world)
                .iter()
                .map(|shape| (shape.elements() * dtype.size_bytes()) as usize)
                .max()
                .unwrap_or(0);
            let specs: Vec<KernelSpec> = row_kernels(dtype, world)
                .into_iter()
                .map(|(_, spec)| spec)
                .collect();
            let row_world = RowWorld::new(device, dtype, world, &specs, largest);
            let mut exact: HashMap<String, (usize, usize, f64)> = HashMap::new();
            for (index, shape) in shapes(world).into_iter().enumerate() {
                let data = row_world.load(shape, 1000 + index as u64);
                for (collective, spec) in row_kernels(dtype, world) {
                    let (rank_inputs, expected) = data.of(collective, dtype, shape);
                    for in_place in [false, true] {
                        let run = Run {
                            collective,
                            spec: &spec,
                            shape,
                            in_place,
                            blocks: BLOCKS,
                            threads: THREADS,
                            chained: false,
                        };
                        let started = Instant::now();
                        let outcome = row_world.check(&run, index % world, &expected, rank_inputs);
                        let entry = exact.entry(spec.name.clone()).or_default();
                        entry.1 += 1;
                        entry.2 += started.elapsed().as_secs_f64();
                        match outcome {
                            Ok(()) => entry.0 += 1,
                            Err(why) => {
                                let line = format!("{world} ranks: {}: {why}", run.describe());
                                eprintln!("{line}");
                                failures.push(line);
                            }
                        }
                    }
                }
            }
            let mut names: Vec<&String> = exact.keys().collect();
            names.sort();
            // Printed as each world and type ends too, so a run cut short by its time limit
            // still says what passed.
            let mut rows = String::new();
            for name in names {
                let (passed, runs, seconds) = exact[name];
                let _ = writeln!(
                    rows,
                    "| {world} | {} | {name} | {passed} of {runs} | {seconds:.1} s |",
                    dtype_name(dtype)
                );
            }
            eprint!("{rows}");
            table.push_str(&rows);
        }
    }
    verdict(table, &failures)
}

/// A check's table when nothing failed; else the table and every failure.
pub(super) fn verdict(table: String, failures: &[String]) -> Result<String, String> {
    if failures.is_empty() {
        Ok(table)
    } else {
        Err(format!(
            "{table}\n{} failure(s):\n{}",
            failures.len(),
            failures.join("\n")
        ))
    }
}

/// What a shipped ladder's check on one GPU came to (a reduce-scatter or all-gather ladder's,
/// here; an all-reduce + RMSNorm ladder's fused candidates', fused.rs).
#[derive(Debug, Default)]
pub struct LadderReport {
    /// (bucket, profile) pairs run.
    pub candidates: usize,
    /// Of those, the ones exact in every run.
    pub exact: usize,
    /// Every failed run, named.
    pub failures: Vec<String>,
    /// The candidates run on fewer blocks than their own, so that every rank's fit at once.
    pub reduced: Vec<String>,
}

impl LadderReport {
    /// Counts candidate `profile` of bucket `index` and plans its launch of `kernel`: every
    /// rank's blocks resident at once on the one GPU of `sms` multiprocessors, as the
    /// all-reduce's world runs them (`plan_launch`), the bucket's geometry or fewer blocks
    /// where it does not fit (noted as reduced). The blocks and threads, or `None` (a failure
    /// noted) where not one block per rank fits.
    pub fn plan(
        &mut self,
        kernel: &LoadedKernel,
        (index, bucket): (usize, &Bucket),
        profile: &Profile,
        world: u32,
        sms: u32,
    ) -> Option<(u32, u32)> {
        let id = &profile.id;
        self.candidates += 1;
        let own = geometry_for(bucket, profile).unwrap();
        let capacity = resident_capacity(kernel, own).unwrap();
        let needed = required_residency(bucket, Some(profile));
        let plan = plan_launch(needed, capacity, world, None, sms);
        let Some(blocks) = plan.blocks(own.blocks()) else {
            let line = format!("bucket {index} {id}: not one block per rank fits ({capacity})");
            self.failures.push(line);
            return None;
        };
        if plan != LaunchPlan::Own {
            self.reduced
                .push(format!("bucket {index} {id}: {blocks} blocks"));
        }
        Some((blocks, own.threads()))
    }
}

/// The shapes a bucket of a row ladder is checked at: its smallest message of width 1, a
/// middle one of width 7 and its largest of width 4,096 rows (each where it lands inside the
/// bucket), so that the full message's bytes pick the bucket and rows do not divide evenly.
fn bucket_shapes(ladder: &Ladder, bucket: usize) -> Vec<Shape> {
    let element = ladder.dtype.size_bytes();
    let smallest = (ladder.bucket_min_bytes(bucket) / element).max(1);
    let largest = ladder.buckets[bucket].max_bytes / element;
    let middle = smallest + (largest - smallest) / 2;
    [(smallest, 1), (middle, 7), (largest, 4096)]
        .into_iter()
        .map(|(elements, width)| Shape::new(elements / width, width).unwrap())
        .filter(|shape| (smallest..=largest).contains(&shape.elements()))
        .collect()
}

/// One candidate of a ladder: its bucket's index, the bucket, its profile and its kernel.
pub type Candidate<'l> = (usize, &'l Bucket, &'l Profile, KernelSpec);

/// The candidates of `ladder`, bucket by bucket, whose kernel `kernel_of` gives (`None`: not
/// run here), and their distinct kernels.
pub fn ladder_candidates(
    ladder: &Ladder,
    kernel_of: impl Fn(&Profile) -> Option<KernelSpec>,
) -> (Vec<KernelSpec>, Vec<Candidate<'_>>) {
    let mut specs: Vec<KernelSpec> = Vec::new();
    let mut candidates = Vec::new();
    for (index, bucket) in ladder.buckets.iter().enumerate() {
        for id in &bucket.candidates {
            let profile = ladder.profile(id).expect("a validated ladder");
            let Some(spec) = kernel_of(profile) else {
                continue;
            };
            if !specs.iter().any(|known| known.name == spec.name) {
                specs.push(spec.clone());
            }
            candidates.push((index, bucket, profile, spec));
        }
    }
    (specs, candidates)
}

/// Every custom candidate of a reduce-scatter or all-gather `ladder` at its bucket's geometry
/// (its own blocks where it has them; fewer where every rank's do not fit the GPU at once) and
/// at [`bucket_shapes`], alternately in place, eagerly
/// with a rank late and in a graph replayed: every rank's output the reference, nothing
/// written past it, its input kept.
pub fn check_row_ladder(device: &Device, ladder: &Ladder, seed: u64) -> LadderReport {
    let (world, dtype) = (ladder.world_size, ladder.dtype);
    let mut report = LadderReport::default();
    // NCCL's candidates are not on one GPU.
    let (specs, candidates) = ladder_candidates(ladder, |profile| {
        kernel_for(profile, ladder.collective, dtype, world)
    });
    let largest = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes) as usize;
    let row_world = RowWorld::new(device, dtype, world as usize, &specs, largest);
    let sms = Driver::open()
        .and_then(|driver| driver.describe(device.ordinal()))
        .unwrap()
        .sm_count;
    let mut loaded: Option<(Shape, ShapeData)> = None;
    for (index, bucket, profile, spec) in candidates {
        let id = &profile.id;
        let kernel = &row_world.kernels[&spec.name];
        let Some((blocks, threads)) = report.plan(kernel, (index, bucket), profile, world, sms)
        else {
            continue;
        };
        let mut exact = true;
        for (turn, shape) in bucket_shapes(ladder, index).into_iter().enumerate() {
            if loaded.as_ref().is_none_or(|(held, _)| *held != shape) {
                let data = row_world.load(shape, seed + 31 * index as u64 + turn as u64);
                loaded = Some((shape, data));
            }
            let data = &loaded.as_ref().expect("loaded").1;
            let (rank_inputs, expected) = data.of(ladder.collective, dtype, shape);
            let run = Run {
                collective: ladder.collective,
                spec: &spec,
                shape,
                in_place: turn % 2 == 1,
                blocks,
                threads,
                chained: false,
            };
            let late = (index + turn) % world as usize;
            if let Err(why) = row_world.check(&run, late, &expected, rank_inputs) {
                let line = format!("bucket {index} {id}: {}: {why}", run.describe());
                eprintln!("{}: {line}", ladder.name);
                report.failures.push(line);
                exact = false;
            }
        }
        report.exact += usize::from(exact);
    }
    report
}
