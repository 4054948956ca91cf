//! The fused two-shot all-reduce + residual add + RMSNorm
//! (kernels/all_reduce_add_rms_norm_two_shot.cu) on one GPU, every rank a stream of it, as the
//! row kernels (rows.rs): loaded by its `KernelSpec` at 2, 4 and 8 ranks and in every type, at
//! rows 0, 1, world - 1, world + 1 and 65 of hidden 8, 7,168 and 16,384, with a residual and
//! without, `normed` over x (this rank's registered input region) and apart, eagerly with one
//! rank late and in a graph of every rank replayed twice. Ordinary rows take every rank's x;
//! rows of zeros and of any bits (NaN, infinities, signed zeros, subnormals) are rank 0's, every
//! other rank adding -0, so they reach the norm as they are. Every rank's `normed` and
//! `residual_out` must be [`reference_epilogue`]'s bytes, the bytes after them still poison,
//! and x kept unless `normed` is over it.

use std::fmt::Write as _;
use std::time::Instant;

use prepare::abi::PARAMS_BYTES;
use prepare::compile::SourceOverrides;
use prepare::gpu::abort::Abort;
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Event, Geometry, Graph, Kernel, LoadedKernel, Module,
    ModuleImage, Stream,
};
use prepare::kernels::{
    kernel_for, scratch_bytes, KernelSpec, LaunchParams, MAX_BLOCKS, MAX_RANKS, SIGNAL_BYTES,
    STATE_ARRIVAL_WORDS, STATE_WORDS,
};
use prepare::ladder::{Arch, Collective, Dtype, Profile};
use prepare::reference::{reference_epilogue, EpilogueInputs, EpilogueOutputs, SplitMix64};
use prepare::shape::Shape;

use super::checks::{check_connections, HELPERS};
use super::norm::row_data;
use super::{compile, dtype_name, gpu_lock, DEADLINE, GUARD_BYTES, POISON, WAIT};
use crate::gpu::support::{compile_ptx, require_gpus, WORLDS};
use crate::support::one_gpu::{judge_abort, Verdict};

/// Blocks and threads of every launch: eight ranks' blocks fit one to a multiprocessor.
const BLOCKS: u32 = 8;
const THREADS: u32 = 256;
/// How long the late rank waits before its kernel starts.
const LATE: std::time::Duration = std::time::Duration::from_micros(30);
/// Replays of each graph.
const REPLAYS: usize = 2;
const HIDDENS: [u64; 3] = [8, 7168, 16_384];

/// The shapes the kernel is checked at.
fn shapes(world: usize) -> Vec<Shape> {
    let world = world as u64;
    let mut rows = vec![0, 1, world - 1, world + 1, 65];
    rows.dedup();
    rows.into_iter()
        .flat_map(|rows| HIDDENS.map(|hidden| Shape::new(rows, hidden).unwrap()))
        .collect()
}

/// The table's fused two-shot for `dtype` at `world` ranks.
fn two_shot(dtype: Dtype, world: usize) -> KernelSpec {
    let profile: Profile =
        serde_json::from_value(serde_json::json!({ "id": "two_shot", "algorithm": "rsag" }))
            .unwrap();
    kernel_for(
        &profile,
        Collective::AllReduceAddRmsNorm,
        dtype,
        world as u32,
    )
    .expect("the table has the fused two-shot")
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

/// One rank's memory and stream.
struct Rank {
    stream: Stream,
    /// The registered buffer: x in the input region, then the scratch.
    buffer: DeviceBuffer,
    signals: DeviceBuffer,
    state: DeviceBuffer,
    /// The residual, updated in place, and its guard.
    residual: DeviceBuffer,
    /// `normed` apart from x, and its guard.
    normed: DeviceBuffer,
    weight: DeviceBuffer,
    /// This shape's x of this rank and its residual, copied in before every launch.
    x: DeviceBuffer,
    residual_source: DeviceBuffer,
}

/// Every rank of one world on one GPU, with the fused two-shot of one type loaded.
struct TwoShotWorld<'a> {
    device: &'a Device,
    dtype: Dtype,
    size: usize,
    ranks: Vec<Rank>,
    /// The input region of every rank's buffer; the scratch follows it.
    region_bytes: usize,
    kernel: LoadedKernel,
    _module: Module,
    _helpers: Module,
    sleep: Kernel,
    fork: Event,
    joins: Vec<Event>,
}

/// One launch on every rank.
#[derive(Clone, Copy)]
struct Run {
    residual: bool,
    /// `normed` over x, in the registered input region.
    over_x: bool,
}

impl<'a> TwoShotWorld<'a> {
    fn new(device: &'a Device, dtype: Dtype, world: usize) -> TwoShotWorld<'a> {
        check_connections(world);
        let largest = shapes(world)
            .iter()
            .map(|shape| (shape.elements() * dtype.size_bytes()) as usize)
            .max()
            .unwrap_or(0);
        let spec = two_shot(dtype, world);
        let region_bytes = (largest + GUARD_BYTES).next_multiple_of(256);
        let scratch = scratch_bytes(&spec, largest as u64) as usize;
        let compiled = compile(
            std::slice::from_ref(&spec),
            world as u32,
            &SourceOverrides::new(),
            "embedded",
        )
        .unwrap_or_else(|error| panic!("the fused two-shot does not compile: {error}"));
        let module = device
            .load_module(ModuleImage::Cubin(&compiled[0].cubin))
            .unwrap();
        let kernel = module.load(&spec.name, false, PARAMS_BYTES).unwrap();
        let hidden = *HIDDENS.iter().max().unwrap() as usize * dtype.size_bytes() as usize;
        let ranks = (0..world)
            .map(|_| Rank {
                stream: device.new_stream().unwrap(),
                buffer: device.allocate(region_bytes + scratch).unwrap(),
                signals: device.allocate(SIGNAL_BYTES as usize).unwrap(),
                state: device.allocate(STATE_WORDS * 8).unwrap(),
                residual: device.allocate(largest + GUARD_BYTES).unwrap(),
                normed: device.allocate(largest + GUARD_BYTES).unwrap(),
                weight: device.allocate(hidden).unwrap(),
                x: device.allocate(largest.max(16)).unwrap(),
                residual_source: device.allocate(largest.max(16)).unwrap(),
            })
            .collect();
        let helpers = device
            .load_module(ModuleImage::Ptx(&compile_ptx(HELPERS, Arch::Sm90.name())))
            .unwrap();
        let this = TwoShotWorld {
            device,
            dtype,
            size: world,
            ranks,
            region_bytes,
            kernel,
            _module: module,
            sleep: helpers.kernel("one_gpu_sleep", 8).unwrap(),
            _helpers: helpers,
            fork: device.new_event(false).unwrap(),
            joins: (0..world)
                .map(|_| device.new_event(false).unwrap())
                .collect(),
        };
        this.reset();
        this
    }

    /// Zeroes every rank's signals, state and buffer together (no launch in flight).
    fn reset(&self) {
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

    /// Writes a shape's operands to every rank's sources and weight.
    fn load(&self, operands: &Operands) {
        for (rank, memory) in self.ranks.iter().enumerate() {
            let stream = &memory.stream;
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

    /// Queues `run` on every rank, `late` starting late: the outputs and the input region
    /// poisoned, x and the residual copied in, then the kernel.
    fn enqueue(&self, operands: &Operands, run: Run, late: Option<usize>) {
        let bytes = (operands.shape.elements() * self.dtype.size_bytes()) as usize;
        let mut buffers = [0_u64; MAX_RANKS];
        let mut signals = [0_u64; MAX_RANKS];
        for (peer, memory) in self.ranks.iter().enumerate() {
            buffers[peer] = memory.buffer.address();
            signals[peer] = memory.signals.address();
        }
        for (rank, memory) in self.ranks.iter().enumerate() {
            let stream = &memory.stream;
            for target in [&memory.residual, &memory.normed] {
                stream
                    .fill_u8(target, 0..target.len_bytes(), POISON)
                    .unwrap();
            }
            stream
                .fill_u8(&memory.buffer, 0..self.region_bytes, POISON)
                .unwrap();
            if late == Some(rank) {
                let wait = (LATE.as_nanos() as u64).to_ne_bytes();
                stream
                    .launch(&self.sleep, Geometry::new(1, 32).unwrap(), &wait)
                    .unwrap();
            }
            if bytes > 0 {
                stream
                    .copy_device(&memory.buffer, 0, &memory.x, 0, bytes)
                    .unwrap();
                stream
                    .copy_device(&memory.residual, 0, &memory.residual_source, 0, bytes)
                    .unwrap();
            }
            let normed = if run.over_x {
                memory.buffer.address()
            } else {
                memory.normed.address()
            };
            let params = LaunchParams {
                buffers,
                signals,
                state: memory.state.address(),
                output: normed,
                input: memory.buffer.address(),
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
                scratch_offset: self.region_bytes as u64,
                timeout_ns: DEADLINE.as_nanos() as u64,
                rank: rank as u32,
                world: self.size as u32,
                ..LaunchParams::all_reduce(0)
            };
            stream
                .launch_loaded(
                    &self.kernel,
                    Geometry::new(BLOCKS, THREADS).unwrap(),
                    &params.to_bytes(),
                )
                .unwrap();
        }
    }

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

    /// Judges a finished run: the abort words, then every rank's outputs and the bytes after
    /// them, and x where it is kept, against `expected` (each rank's outputs).
    fn judge(
        &self,
        operands: &Operands,
        run: Run,
        before: &[Vec<u64>],
        expected: &[EpilogueOutputs],
    ) -> Result<(), String> {
        for rank in &self.ranks {
            rank.stream
                .synchronize_within(WAIT)
                .map_err(|error| error.to_string())?;
        }
        for (rank, memory) in self.ranks.iter().enumerate() {
            let mut word = [0_u64];
            memory.stream.read(&memory.state, 0, &mut word).unwrap();
            if let Some(abort) = Abort::decode(word[0]) {
                let verdict = judge_abort(
                    before,
                    &self.arrivals(),
                    BLOCKS as usize,
                    &vec![true; self.size],
                    DEADLINE.as_nanos() as u64,
                );
                self.reset();
                return Err(match verdict {
                    Verdict::KernelAborted => format!("rank {rank} aborted: {abort}"),
                    Verdict::NotCoScheduled { never, late } => format!(
                        "not co-scheduled: {} block(s) never began, {} late",
                        never.len(),
                        late.len()
                    ),
                });
            }
        }
        let element = self.dtype.size_bytes() as usize;
        let bytes = operands.shape.elements() as usize * element;
        let differs = |found: &[u8], wanted: &[u8]| {
            (0..bytes / element)
                .find(|&e| found[e * element..][..element] != wanted[e * element..][..element])
        };
        for (rank, memory) in self.ranks.iter().enumerate() {
            let read = |buffer: &DeviceBuffer, guard: usize| {
                let mut found = vec![0_u8; bytes + guard];
                memory.stream.read(buffer, 0, &mut found).unwrap();
                found
            };
            // The input region, with a guard's worth of it after the message.
            let region = read(&memory.buffer, GUARD_BYTES);
            let normed = if run.over_x {
                region.clone()
            } else {
                read(&memory.normed, GUARD_BYTES)
            };
            if let Some(index) = differs(&normed, &expected[rank].normed) {
                return Err(format!("rank {rank}: normed element {index} differs"));
            }
            let residual = read(&memory.residual, GUARD_BYTES);
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
                .chain(&region[bytes..])
                .any(|&byte| byte != POISON);
            if past_outputs {
                return Err(format!("rank {rank}: wrote past its outputs"));
            }
            if !run.over_x && region[..bytes] != operands.x[rank][..] {
                return Err(format!("rank {rank}: x changed"));
            }
        }
        Ok(())
    }

    /// `run` eagerly with rank `late` late, then captured in one graph of every rank and
    /// replayed [`REPLAYS`] times, each judged.
    fn check(
        &self,
        operands: &Operands,
        run: Run,
        late: usize,
        expected: &[EpilogueOutputs],
    ) -> Result<(), String> {
        let before = self.arrivals();
        self.enqueue(operands, run, Some(late));
        self.judge(operands, run, &before, expected)
            .map_err(|why| format!("eager: {why}"))?;
        let (stream, graph) = self.capture(operands, run, Some(late));
        for replay in 0..REPLAYS {
            let before = self.arrivals();
            graph.launch().unwrap();
            stream
                .synchronize_within(WAIT)
                .map_err(|error| error.to_string())?;
            self.judge(operands, run, &before, expected)
                .map_err(|why| format!("graph replay {replay}: {why}"))?;
        }
        Ok(())
    }

    /// `run` on every rank captured into one graph, each rank's stream a branch of it.
    fn capture(&self, operands: &Operands, run: Run, late: Option<usize>) -> (Stream, Graph) {
        let mut stream = self.device.new_stream().unwrap();
        let graph = stream
            .capture(|capturing| {
                capturing.record(&self.fork)?;
                for rank in &self.ranks {
                    rank.stream.wait_for(&self.fork)?;
                }
                self.enqueue(operands, run, late);
                for (rank, join) in self.ranks.iter().zip(&self.joins) {
                    rank.stream.record(join)?;
                    capturing.wait_for(join)?;
                }
                Ok::<(), prepare::gpu::driver::DriverError>(())
            })
            .unwrap();
        (stream, graph)
    }
}

#[test]
#[ignore = "needs a GPU"]
fn the_fused_two_shot_gives_the_reference_on_every_rank_on_one_gpu() {
    let _lock = gpu_lock();
    let (_driver, [device]) = require_gpus!(1);
    let mut table =
        String::from("| world | dtype | runs exact | time |\n| --- | --- | --- | --- |\n");
    let mut failures = Vec::new();
    for world in WORLDS {
        for dtype in Dtype::ALL {
            let two_shot_world = TwoShotWorld::new(&device, dtype, world);
            let started = Instant::now();
            let (mut passed, mut runs) = (0, 0);
            for (index, shape) in shapes(world).into_iter().enumerate() {
                let operands = operands(dtype, world, shape, 100 + index as u64);
                two_shot_world.load(&operands);
                let views: Vec<&[u8]> = operands.x.iter().map(Vec::as_slice).collect();
                for (variant, (residual, over_x)) in
                    [(true, false), (true, true), (false, false), (false, true)]
                        .into_iter()
                        .enumerate()
                {
                    let epilogue = EpilogueInputs {
                        residual: residual.then_some(operands.residual.as_slice()),
                        weight: &operands.weight,
                        eps: operands.eps,
                    };
                    let expected = reference_epilogue(dtype, shape, &views, &epilogue).unwrap();
                    let run = Run { residual, over_x };
                    runs += 1;
                    let late = (index + variant) % world;
                    match two_shot_world.check(&operands, run, late, &expected) {
                        Ok(()) => passed += 1,
                        Err(why) => {
                            let line = format!(
                                "{world} ranks, {}: {} x {}, residual {residual}, normed over x \
                                 {over_x}: {why}",
                                dtype_name(dtype),
                                shape.rows(),
                                shape.width()
                            );
                            eprintln!("{line}");
                            failures.push(line);
                        }
                    }
                }
            }
            let _ = writeln!(
                table,
                "| {world} | {} | {passed} of {runs} | {:.1} s |",
                dtype_name(dtype),
                started.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!("{table}");
    assert!(
        failures.is_empty(),
        "{table}\n{} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
