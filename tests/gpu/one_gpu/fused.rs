//! The fused all-reduce + residual add + RMSNorm kernels on one GPU, every rank a stream of it,
//! as the row kernels (rows.rs): the one-shot push `ll` and `simple`
//! (kernels/all_reduce_add_rms_norm_one_shot.cu) and the two-shot
//! (kernels/all_reduce_add_rms_norm_two_shot.cu), each loaded by its `KernelSpec` at 2, 4 and 8
//! ranks and in every type, at rows 0, 1, world - 1, world + 1 and 64 of hidden 8, 7,168 and
//! 16,384, with a residual and without, `normed` over x and apart (two of those four a shape,
//! every four in two shapes), eagerly with one rank late and in a graph of every rank replayed
//! twice. x is where the kernel reads it: the rank's registered input region for the two-shot,
//! local memory for the one-shot (whose input region, which it must not touch, is poisoned).
//! Ordinary rows take every rank's x; rows of zeros and of any bits (NaN, infinities, signed
//! zeros, subnormals) are rank 0's, every other rank adding -0, so they reach the norm as they
//! are. Every rank's `normed` and `residual_out` must be [`reference_epilogue`]'s bytes, the
//! bytes after them still poison, and x kept unless `normed` is over it. The same run with a
//! planted mutation must fail in every kernel it touches. A shipped all-reduce + add + RMSNorm
//! ladder's fused candidates run the same way at their buckets' geometry and sizes
//! ([`check_epilogue_ladder`]).

use std::fmt::Write as _;
use std::time::Instant;

use prepare::compile::SourceOverrides;
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Driver, Geometry, LoadedKernel, Module,
};
use prepare::kernels::{
    epilogue_kernel_for, input_access, kernel_for, scratch_bytes, InputAccess, KernelSpec,
    LaunchParams,
};
use prepare::ladder::{Collective, Dtype, Ladder, Profile};
use prepare::reference::{reference_epilogue, EpilogueInputs, EpilogueOutputs, SplitMix64};
use prepare::shape::Shape;

use super::norm::row_data;
use super::ranks::Ranks;
use super::rows::{ladder_candidates, LadderReport};
use super::{
    compile, dtype_name, gpu_lock, load_compiled, DEADLINE, GUARD_BYTES, POISON, REGION_POISON,
    WAIT,
};
use crate::gpu::support::{require_gpus, WORLDS};
use crate::support::mutations::{overrides, Mutation};

/// Blocks and threads of every launch: eight ranks' blocks fit one to a multiprocessor.
const BLOCKS: u32 = 8;
const THREADS: u32 = 256;
const HIDDENS: [u64; 3] = [8, 7168, 16_384];
/// The (residual, `normed` over x) combinations; shape i runs two of them, i % 2 and i % 2 + 2,
/// one with a residual and one without.
const RUNS: [(bool, bool); 4] = [(true, false), (true, true), (false, false), (false, true)];

/// The shapes every fused kernel is checked at.
fn shapes(world: usize) -> Vec<Shape> {
    let world = world as u64;
    let mut rows = vec![0, 1, world - 1, world + 1, 64];
    rows.dedup();
    rows.into_iter()
        .flat_map(|rows| HIDDENS.map(|hidden| Shape::new(rows, hidden).unwrap()))
        .collect()
}

/// The table's fused kernels for `dtype` at `world` ranks: the one-shot `ll` and `simple` and
/// the two-shot, as their profiles name them.
fn fused_kernels(dtype: Dtype, world: usize) -> Vec<KernelSpec> {
    [
        serde_json::json!({
            "id": "one_shot_ll", "algorithm": "one_shot", "transfer": "push", "protocol": "ll"
        }),
        serde_json::json!({
            "id": "one_shot_simple", "algorithm": "one_shot", "transfer": "push",
            "protocol": "simple"
        }),
        serde_json::json!({ "id": "two_shot", "algorithm": "rsag" }),
    ]
    .into_iter()
    .map(|profile| {
        let profile: Profile = serde_json::from_value(profile).unwrap();
        kernel_for(
            &profile,
            Collective::AllReduceAddRmsNorm,
            dtype,
            world as u32,
        )
        .unwrap_or_else(|| panic!("the table has no fused kernel for {}", profile.id))
    })
    .collect()
}

/// One shape's operands: every rank's x, the residual and the weight.
struct Operands {
    shape: Shape,
    x: Vec<Vec<u8>>,
    residual: Vec<u8>,
    weight: Vec<u8>,
    eps: f32,
}

fn operands(dtype: Dtype, world: usize, shape: Shape, seed: u64) -> Operands {
    let hidden = shape.width() as usize;
    let size = dtype.size_bytes() as usize;
    let negative_zero: Vec<u8> = match dtype {
        Dtype::Fp32 => 0x8000_0000_u32.to_le_bytes().to_vec(),
        _ => 0x8000_u16.to_le_bytes().to_vec(),
    };
    let x = (0..world)
        .map(|rank| {
            (0..shape.rows())
                .flat_map(|row| match row % 4 {
                    // Zeros and any bits: rank 0's row, -0 from every other rank.
                    2 | 3 if rank > 0 => negative_zero.repeat(hidden),
                    2 | 3 => row_data(dtype, seed, row, hidden),
                    _ => row_data(dtype, seed + 7 * rank as u64, row, hidden),
                })
                .collect()
        })
        .collect();
    let residual = (0..shape.rows())
        .flat_map(|row| row_data(dtype, seed + 1, row, hidden))
        .collect();
    let mut draws = SplitMix64::new(seed + 2);
    let weight = (0..hidden)
        .flat_map(|_| {
            let unit = (draws.next_u64() >> 40) as f32 / (1_u64 << 24) as f32;
            prepare::reference::from_f32(dtype, 0.5 + unit).to_le_bytes()[..size].to_vec()
        })
        .collect();
    Operands {
        shape,
        x,
        residual,
        weight,
        eps: [1e-5, 1e-6, 0.0][(seed % 3) as usize],
    }
}

/// Every rank's expected outputs of `operands`, with the residual (index 0) and without (1).
fn references(dtype: Dtype, operands: &Operands) -> [Vec<EpilogueOutputs>; 2] {
    let views: Vec<&[u8]> = operands.x.iter().map(Vec::as_slice).collect();
    [true, false].map(|residual| {
        let epilogue = EpilogueInputs {
            residual: residual.then_some(operands.residual.as_slice()),
            weight: &operands.weight,
            eps: operands.eps,
        };
        reference_epilogue(dtype, operands.shape, &views, &epilogue).unwrap()
    })
}

/// One rank's operands (its stream and registered memory are the `Ranks`').
struct Rank {
    /// x where a kernel that reads it locally finds it, and its guard.
    local: DeviceBuffer,
    /// The residual, updated in place, and its guard.
    residual: DeviceBuffer,
    /// `normed` apart from x, and its guard.
    normed: DeviceBuffer,
    weight: DeviceBuffer,
    /// This shape's x of this rank and its residual, copied in before every launch.
    x: DeviceBuffer,
    residual_source: DeviceBuffer,
}

/// A fused kernel, loaded, and where its scratch lies in every rank's buffer (each kernel a
/// region of its own, as a package places the double-buffered kernels' regions).
struct Fused {
    spec: KernelSpec,
    kernel: LoadedKernel,
    scratch_offset: u64,
}

impl Fused {
    fn local(&self) -> bool {
        input_access(&self.spec) == Some(InputAccess::Local)
    }
}

/// Every rank of one world on one GPU, with the fused kernels of one type loaded.
struct FusedWorld<'a> {
    world: Ranks<'a>,
    dtype: Dtype,
    ranks: Vec<Rank>,
    /// The input region of every rank's buffer; the scratch regions follow it.
    region_bytes: usize,
    kernels: Vec<Fused>,
    _modules: Vec<Module>,
}

/// One launch of a kernel on every rank.
#[derive(Clone, Copy)]
struct Run<'k> {
    kernel: &'k Fused,
    residual: bool,
    /// `normed` over x: where the kernel reads x.
    over_x: bool,
    /// Every rank's launch geometry.
    blocks: u32,
    threads: u32,
}

impl<'a> FusedWorld<'a> {
    /// Every rank of `world` with the fused kernels `specs` of `dtype` compiled from `sources`
    /// (cached under `key`) and loaded, for messages of up to `largest` bytes and hidden sizes
    /// up to `widest`.
    fn new(
        device: &'a Device,
        dtype: Dtype,
        world: usize,
        specs: Vec<KernelSpec>,
        (largest, widest): (usize, u64),
        sources: &SourceOverrides,
        key: &str,
    ) -> FusedWorld<'a> {
        let region_bytes = (largest + GUARD_BYTES).next_multiple_of(256);
        let compiled = compile(&specs, world as u32, sources, key)
            .unwrap_or_else(|error| panic!("the fused kernels do not compile: {error}"));
        let mut modules = Vec::new();
        let mut kernels = Vec::new();
        let mut offset = region_bytes;
        for spec in specs {
            let (module, kernel) = load_compiled(device, &compiled, &spec);
            let scratch = scratch_bytes(&spec, largest as u64) as usize;
            kernels.push(Fused {
                spec,
                kernel,
                scratch_offset: offset as u64,
            });
            offset = (offset + scratch).next_multiple_of(256);
            modules.push(module);
        }
        let hidden = widest as usize * dtype.size_bytes() as usize;
        let ranks = (0..world)
            .map(|_| Rank {
                local: device.allocate(largest + GUARD_BYTES).unwrap(),
                residual: device.allocate(largest + GUARD_BYTES).unwrap(),
                normed: device.allocate(largest + GUARD_BYTES).unwrap(),
                weight: device.allocate(hidden).unwrap(),
                x: device.allocate(largest.max(16)).unwrap(),
                residual_source: device.allocate(largest.max(16)).unwrap(),
            })
            .collect();
        FusedWorld {
            world: Ranks::new(device, world, offset),
            dtype,
            ranks,
            region_bytes,
            kernels,
            _modules: modules,
        }
    }

    /// Writes a shape's operands to every rank's sources and weight.
    fn load(&self, operands: &Operands) {
        for (rank, (memory, registered)) in self.ranks.iter().zip(&self.world.members).enumerate() {
            let stream = &registered.stream;
            if operands.shape.elements() > 0 {
                stream.write(&memory.x, 0, &operands.x[rank]).unwrap();
                stream
                    .write(&memory.residual_source, 0, &operands.residual)
                    .unwrap();
            }
            stream.write(&memory.weight, 0, &operands.weight).unwrap();
            stream.synchronize_within(WAIT).unwrap();
        }
    }

    /// Where rank `rank` holds x for `run`'s kernel: its registered input region, or local
    /// memory.
    fn x_of(&self, run: Run<'_>, rank: usize) -> &DeviceBuffer {
        if run.kernel.local() {
            &self.ranks[rank].local
        } else {
            &self.world.members[rank].buffer
        }
    }

    /// Queues `run` on every rank, `late` starting late: the outputs, x's place and the input
    /// region poisoned, x and the residual copied in, then the kernel.
    fn enqueue(&self, operands: &Operands, run: Run<'_>, late: Option<usize>) {
        let bytes = (operands.shape.elements() * self.dtype.size_bytes()) as usize;
        let (buffers, signals) = self.world.peers();
        for (rank, (memory, registered)) in self.ranks.iter().zip(&self.world.members).enumerate() {
            let stream = &registered.stream;
            for target in [&memory.residual, &memory.normed, &memory.local] {
                stream
                    .fill_u8(target, 0..target.len_bytes(), POISON)
                    .unwrap();
            }
            let region = if run.kernel.local() {
                REGION_POISON
            } else {
                POISON
            };
            stream
                .fill_u8(&registered.buffer, 0..self.region_bytes, region)
                .unwrap();
            self.world.wait_if_late(rank, late);
            let x = self.x_of(run, rank);
            if bytes > 0 {
                stream.copy_device(x, 0, &memory.x, 0, bytes).unwrap();
                stream
                    .copy_device(&memory.residual, 0, &memory.residual_source, 0, bytes)
                    .unwrap();
            }
            let normed = if run.over_x {
                x.address()
            } else {
                memory.normed.address()
            };
            let params = LaunchParams {
                buffers,
                signals,
                state: registered.state.address(),
                output: normed,
                input: x.address(),
                input_elements: operands.shape.elements(),
                output_elements: operands.shape.elements(),
                rows: operands.shape.rows(),
                width: operands.shape.width(),
                residual: if run.residual {
                    memory.residual.address()
                } else {
                    0
                },
                weight: memory.weight.address(),
                normed,
                eps: operands.eps,
                scratch_offset: run.kernel.scratch_offset,
                timeout_ns: DEADLINE.as_nanos() as u64,
                rank: rank as u32,
                world: self.world.size() as u32,
                ..LaunchParams::all_reduce(0)
            };
            stream
                .launch_loaded(
                    &run.kernel.kernel,
                    Geometry::new(run.blocks, run.threads).unwrap(),
                    &params.to_bytes(),
                )
                .unwrap();
        }
    }

    /// Judges a finished run: the abort words, then every rank's outputs and the bytes after
    /// them, x where it is kept, and a local kernel's input region where x would be untouched, against
    /// `expected` (each rank's outputs).
    fn judge(
        &self,
        operands: &Operands,
        run: Run<'_>,
        before: &[Vec<u64>],
        expected: &[EpilogueOutputs],
    ) -> Result<(), String> {
        self.world.finished(before, run.blocks as usize)?;
        let element = self.dtype.size_bytes() as usize;
        let bytes = operands.shape.elements() as usize * element;
        let differs = |found: &[u8], wanted: &[u8]| {
            (0..bytes / element)
                .find(|&e| found[e * element..][..element] != wanted[e * element..][..element])
        };
        for (rank, (memory, registered)) in self.ranks.iter().zip(&self.world.members).enumerate() {
            let stream = &registered.stream;
            let read = |buffer: &DeviceBuffer, length: usize| {
                let mut found = vec![0_u8; length];
                stream.read(buffer, 0, &mut found).unwrap();
                found
            };
            // x's place, with a guard's worth of it after the message.
            let x = read(self.x_of(run, rank), bytes + GUARD_BYTES);
            let normed = if run.over_x {
                x.clone()
            } else {
                read(&memory.normed, bytes + GUARD_BYTES)
            };
            if let Some(index) = differs(&normed, &expected[rank].normed) {
                return Err(format!("rank {rank}: normed element {index} differs"));
            }
            let residual = read(&memory.residual, bytes + GUARD_BYTES);
            if run.residual {
                if let Some(index) = differs(&residual, &expected[rank].residual_out) {
                    return Err(format!("rank {rank}: residual_out element {index} differs"));
                }
            } else if residual[..bytes] != operands.residual[..] {
                return Err(format!("rank {rank}: the residual, not given, was written"));
            }
            let past_outputs = normed[bytes..]
                .iter()
                .chain(&residual[bytes..])
                .chain(&x[bytes..])
                .any(|&byte| byte != POISON);
            if past_outputs {
                return Err(format!("rank {rank}: wrote past its outputs"));
            }
            if !run.over_x && x[..bytes] != operands.x[rank][..] {
                return Err(format!("rank {rank}: x changed"));
            }
            // Where x would lie in the input region, and its guard.
            if run.kernel.local()
                && read(&registered.buffer, bytes + GUARD_BYTES)
                    .iter()
                    .any(|&byte| byte != REGION_POISON)
            {
                return Err(format!("rank {rank}: wrote its registered input region"));
            }
        }
        Ok(())
    }

    /// `run` eagerly with rank `late` late, then in a graph of every rank replayed, each judged.
    fn check(
        &self,
        operands: &Operands,
        run: Run<'_>,
        late: usize,
        expected: &[EpilogueOutputs],
    ) -> Result<(), String> {
        self.world
            .eager_then_graph(late, &|late| self.enqueue(operands, run, late), &|before| {
                self.judge(operands, run, before, expected)
            })
    }
}

/// Each fused kernel's verdicts at one world and type: (entry name, runs exact, runs, seconds).
type Tally = Vec<(String, usize, usize, f64)>;

/// Every fused kernel of `dtype` at `world` ranks, compiled from `sources` (cached under
/// `key`), at every shape and two runs a shape: the tally, and every failed run named.
fn check_fused_kernels(
    device: &Device,
    dtype: Dtype,
    world: usize,
    sources: &SourceOverrides,
    key: &str,
) -> (Tally, Vec<String>) {
    let largest = shapes(world)
        .iter()
        .map(|shape| (shape.elements() * dtype.size_bytes()) as usize)
        .max()
        .unwrap_or(0);
    let widest = *HIDDENS.iter().max().unwrap();
    let specs = fused_kernels(dtype, world);
    let fused_world = FusedWorld::new(device, dtype, world, specs, (largest, widest), sources, key);
    let mut tally: Tally = fused_world
        .kernels
        .iter()
        .map(|kernel| (kernel.spec.name.clone(), 0, 0, 0.0))
        .collect();
    let mut failures = Vec::new();
    for (index, shape) in shapes(world).into_iter().enumerate() {
        let operands = operands(dtype, world, shape, 100 + index as u64);
        fused_world.load(&operands);
        let expected = references(dtype, &operands);
        for (kernel, entry) in fused_world.kernels.iter().zip(&mut tally) {
            for variant in [index % 2, index % 2 + 2] {
                let (residual, over_x) = RUNS[variant];
                let run = Run {
                    kernel,
                    residual,
                    over_x,
                    blocks: BLOCKS,
                    threads: THREADS,
                };
                let late = (index + variant) % world;
                let started = Instant::now();
                let outcome =
                    fused_world.check(&operands, run, late, &expected[usize::from(!residual)]);
                entry.2 += 1;
                entry.3 += started.elapsed().as_secs_f64();
                match outcome {
                    Ok(()) => entry.1 += 1,
                    Err(why) => failures.push(format!(
                        "{} at {world} ranks: {} x {}, residual {residual}, normed over x \
                         {over_x}: {why}",
                        kernel.spec.name,
                        shape.rows(),
                        shape.width()
                    )),
                }
            }
        }
    }
    (tally, failures)
}

/// The hidden size of the bucket shapes: DeepSeek-V3's, as the ladders' descriptions count rows.
const LADDER_HIDDEN: u64 = 7168;

/// The shapes a bucket of an all-reduce + add + RMSNorm ladder is checked at: its smallest
/// message in rows of hidden 8, and its middle and largest in whole rows of hidden 7,168 where
/// the bucket holds one (rows of 8 otherwise), each inside the bucket.
fn epilogue_bucket_shapes(ladder: &Ladder, bucket: usize) -> Vec<Shape> {
    let element = ladder.dtype.size_bytes();
    let smallest = ladder.bucket_min_bytes(bucket).div_ceil(element).max(8);
    let largest = ladder.buckets[bucket].max_bytes / element;
    let middle = smallest + (largest - smallest) / 2;
    let mut shapes: Vec<Shape> = [
        (smallest, 8),
        (middle, LADDER_HIDDEN),
        (largest, LADDER_HIDDEN),
    ]
    .into_iter()
    .map(|(elements, hidden)| {
        let hidden = if elements >= hidden { hidden } else { 8 };
        let rows = if hidden == 8 && elements == smallest {
            elements.div_ceil(8)
        } else {
            elements / hidden
        };
        Shape::new(rows, hidden).unwrap()
    })
    .filter(|shape| (smallest..=largest).contains(&shape.elements()))
    .collect();
    shapes.dedup();
    shapes
}

/// Every fused candidate of an all-reduce + add + RMSNorm `ladder` at its bucket's geometry (its
/// own blocks where every rank's fit the GPU at once, fewer otherwise, as the all-reduce's world
/// plans them) and at [`epilogue_bucket_shapes`], each shape twice (with a residual and without,
/// `normed` over x in one of them), eagerly with a rank late and in a graph replayed: every
/// rank's outputs the reference's bytes. The separate candidates (an all-reduce kernel, then
/// `add_rms_norm`) are the all-reduce's kernels and the epilogue's, checked on their own.
pub fn check_epilogue_ladder(device: &Device, ladder: &Ladder, seed: u64) -> LadderReport {
    let (world, dtype) = (ladder.world_size as usize, ladder.dtype);
    let mut report = LadderReport::default();
    // The fused candidates: not NCCL's, not the separate ones.
    let (specs, candidates) = ladder_candidates(ladder, |profile| {
        if profile.has_separate_epilogue() {
            return None;
        }
        epilogue_kernel_for(profile, dtype, world as u32)
    });
    let largest = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes) as usize;
    let fused_world = FusedWorld::new(
        device,
        dtype,
        world,
        specs,
        (largest, LADDER_HIDDEN),
        &SourceOverrides::new(),
        "embedded",
    );
    let sms = Driver::open()
        .and_then(|driver| driver.describe(device.ordinal()))
        .unwrap()
        .sm_count;
    // Bucket by bucket: each shape's operands and references made once for its candidates.
    for (index, bucket) in ladder.buckets.iter().enumerate() {
        let mut runs = Vec::new();
        for (_, _, profile, spec) in candidates.iter().filter(|(at, ..)| *at == index) {
            let kernel = fused_world
                .kernels
                .iter()
                .find(|kernel| kernel.spec.name == spec.name)
                .expect("every candidate's kernel loaded");
            let planned = report.plan(&kernel.kernel, (index, bucket), profile, world as u32, sms);
            if let Some((blocks, threads)) = planned {
                runs.push((&profile.id, kernel, blocks, threads, true));
            }
        }
        for (turn, shape) in epilogue_bucket_shapes(ladder, index)
            .into_iter()
            .enumerate()
        {
            let operands = operands(dtype, world, shape, seed + 31 * index as u64 + turn as u64);
            fused_world.load(&operands);
            let expected = references(dtype, &operands);
            for (id, kernel, blocks, threads, exact) in &mut runs {
                for variant in [turn % 2, turn % 2 + 2] {
                    let (residual, over_x) = RUNS[variant];
                    let run = Run {
                        kernel,
                        residual,
                        over_x,
                        blocks: *blocks,
                        threads: *threads,
                    };
                    let late = (index + turn + variant) % world;
                    let outcome =
                        fused_world.check(&operands, run, late, &expected[usize::from(!residual)]);
                    if let Err(why) = outcome {
                        let line = format!(
                            "bucket {index} {id}: {} x {}, residual {residual}, normed over x \
                             {over_x}, {blocks} x {threads}: {why}",
                            shape.rows(),
                            shape.width()
                        );
                        eprintln!("{}: {line}", ladder.name);
                        report.failures.push(line);
                        *exact = false;
                    }
                }
            }
        }
        report.exact += runs.iter().filter(|run| run.4).count();
    }
    report
}

#[test]
#[ignore = "needs a GPU"]
fn every_fused_kernel_gives_the_reference_on_every_rank_on_one_gpu() {
    let _lock = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    let started = Instant::now();
    let mut table = String::from(
        "| world | dtype | kernel | runs exact | time |\n| --- | --- | --- | --- | --- |\n",
    );
    let mut failures = Vec::new();
    for world in WORLDS {
        for dtype in Dtype::ALL {
            let (tally, failed) =
                check_fused_kernels(&device, dtype, world, &SourceOverrides::new(), "embedded");
            for (name, passed, runs, seconds) in tally {
                let _ = writeln!(
                    table,
                    "| {world} | {} | {name} | {passed} of {runs} | {seconds:.1} s |",
                    dtype_name(dtype)
                );
            }
            for line in &failed {
                eprintln!("{line}");
            }
            failures.extend(failed);
        }
    }
    eprintln!("{table}\nin {:.1} s", started.elapsed().as_secs_f64());
    assert!(
        failures.is_empty(),
        "{table}\n{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The residual added to the sum before it is rounded (`Mutation::ResidualBeforeRounding`),
/// planted in the fused kernels: at 2, 4 and 8 ranks every fused kernel of every type it touches
/// gives some wrong output in the runs of
/// [`every_fused_kernel_gives_the_reference_on_every_rank_on_one_gpu`], and nothing else goes
/// wrong (no abort, no write past the outputs).
#[test]
#[ignore = "needs a GPU"]
fn the_residual_added_before_the_sum_is_rounded_is_caught_in_every_fused_kernel_on_one_gpu() {
    let _lock = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    let mutation = Mutation::ResidualBeforeRounding;
    let touched = mutation.kernels();
    let sources = overrides(mutation);
    let mut problems = Vec::new();
    for world in WORLDS {
        for dtype in [Dtype::Bf16, Dtype::Fp16] {
            let (tally, failures) =
                check_fused_kernels(&device, dtype, world, &sources, mutation.name());
            for (name, passed, runs, _) in tally {
                assert!(touched.contains(&name), "{mutation} does not touch {name}");
                if passed == runs {
                    problems.push(format!("{name} at {world} ranks: every run exact"));
                }
            }
            // A wrong element is the mutation's doing; anything else is not.
            problems.extend(
                failures
                    .into_iter()
                    .filter(|line| !(line.contains(" element ") && line.ends_with(" differs"))),
            );
        }
    }
    assert!(problems.is_empty(), "{mutation}:\n{}", problems.join("\n"));
}
