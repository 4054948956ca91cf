//! Ranks that disagree on their message's shape, every rank a stream of one GPU: every kernel
//! of the kernel table that checks the shape (every reduce-scatter, all-gather, fused and
//! all-reduce kernel but the copy engine's, whose start barrier is block_barrier's, and the
//! unfused norm and the rank-order sum, which exchange nothing) at 2, 4 and 8 ranks in bf16,
//! with one rank's rows one more, one rank's width another, or one rank's rows 0 (an
//! all-reduce's message is one row of rows x width elements). The shape check must leave every
//! rank the shape-mismatch abort naming a peer of another shape, well before the deadline. A
//! kernel with the start barrier or the cluster kernels' start exchange writes nothing: every
//! output and the bytes around it keep their poison, and the scratch after the input region
//! stays zero. A double-buffered kernel checks while it moves data, so its output (a fused
//! one's residual) and its scratch region may change, nothing else: the poison around them,
//! the weight, and the zeroes after the scratch stay.

use std::time::{Duration, Instant};

use prepare::abi::{ABORT_FLAG, ABORT_SHAPE_MISMATCH};
use prepare::compile::SourceOverrides;
use prepare::gpu::driver::{Device, DeviceBuffer, DeviceMemory, Geometry};
use prepare::kernels::{
    all_kernels, input_access, is_double_buffered, scratch_bytes, InputAccess, KernelSpec,
    LaunchParams, MAX_RANKS, SIGNAL_BYTES, STATE_WORDS,
};
use prepare::ladder::Dtype;
use prepare::shape::Shape;

use super::checks::{check_connections, compile, load_compiled};
use super::{GUARD_BYTES, POISON, WAIT};

/// Far longer than a shape check takes, so a rank that waited for it is told apart.
const DEADLINE: Duration = Duration::from_secs(5);

struct Rank {
    buffer: DeviceBuffer,
    signals: DeviceBuffer,
    state: DeviceBuffer,
    input: DeviceBuffer,
    output: DeviceBuffer,
    residual: DeviceBuffer,
    weight: DeviceBuffer,
}

/// What a kernel's launch takes, as the shapes mode of the host emulation names it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    AllReduce,
    ReduceScatter,
    AllGather,
    /// The fused all-reduce + residual add + RMSNorm: x, residual, weight, normed.
    Fused,
}

/// Every kernel that checks the shape, with what its launch takes.
fn shape_checked_kernels(world: u32) -> Vec<(KernelSpec, Side)> {
    all_kernels(Dtype::Bf16, world)
        .into_iter()
        .filter_map(|spec| {
            let name = spec.name.as_str();
            let side = if name.starts_with("all_reduce_add_rms_norm_") {
                Side::Fused
            } else if spec.copy_engine_barriers().is_some() {
                // The copy engines' start barrier is block_barrier, which the others run.
                return None;
            } else if name.starts_with("all_reduce_") {
                Side::AllReduce
            } else if name.starts_with("reduce_scatter_") {
                Side::ReduceScatter
            } else if name.starts_with("all_gather_") {
                Side::AllGather
            } else {
                return None;
            };
            Some((spec, side))
        })
        .collect()
}

/// Bytes of `found` that are not `expected`.
fn differing(found: &[u8], expected: u8) -> usize {
    found.iter().filter(|byte| **byte != expected).count()
}

/// Every disagreement at every world, for every kernel that checks: a report line per failure.
pub fn check_disagreeing_shapes(device: &Device) -> Result<(), String> {
    let dtype = Dtype::Bf16;
    let element = dtype.size_bytes() as usize;
    let mut failures = Vec::new();
    let mut checked = 0;
    for world in [2_usize, 4, 8] {
        check_connections(world);
        let kernels = shape_checked_kernels(world as u32);
        let specs: Vec<KernelSpec> = kernels.iter().map(|(spec, _)| spec.clone()).collect();
        let compiled = compile(&specs, world as u32, &SourceOverrides::new(), "embedded")?;
        for (spec, side) in &kernels {
            let side = *side;
            let fused = side == Side::Fused;
            let (_module, kernel) = load_compiled(device, &compiled, spec);
            let local = input_access(spec) == Some(InputAccess::Local);
            let moving = is_double_buffered(spec);
            // Rows with a short rank; widths off a vector (the fused norm's: a multiple of 8).
            let base = (world as u64 + 1, if fused { 16 } else { 7 });
            let cases = [
                (
                    "the last rank's rows one more",
                    world - 1,
                    (base.0 + 1, base.1),
                ),
                (
                    "rank 0's width another",
                    0,
                    (base.0, if fused { 24 } else { 9 }),
                ),
                ("rank 1 with rows 0", 1, (0, base.1)),
            ];
            for (what, odd, odd_shape) in cases {
                checked += 1;
                let shapes: Vec<Shape> = (0..world)
                    .map(|rank| {
                        let (rows, width) = if rank == odd { odd_shape } else { base };
                        Shape::new(rows, width).unwrap()
                    })
                    .collect();
                let largest =
                    shapes.iter().map(|shape| shape.elements()).max().unwrap() as usize * element;
                let widest = shapes.iter().map(|shape| shape.width()).max().unwrap() as usize;
                let region = (largest + GUARD_BYTES).next_multiple_of(256);
                let scratch = scratch_bytes(spec, largest as u64) as usize;
                let ranks: Vec<Rank> = (0..world)
                    .map(|_| Rank {
                        buffer: device.allocate(region + scratch + GUARD_BYTES).unwrap(),
                        signals: device.allocate(SIGNAL_BYTES as usize).unwrap(),
                        state: device.allocate(STATE_WORDS * 8).unwrap(),
                        input: device.allocate(largest + 2 * GUARD_BYTES).unwrap(),
                        output: device.allocate(largest + 2 * GUARD_BYTES).unwrap(),
                        residual: device.allocate(largest + 2 * GUARD_BYTES).unwrap(),
                        weight: device.allocate(widest * element + 2 * GUARD_BYTES).unwrap(),
                    })
                    .collect();
                let streams: Vec<_> = (0..world).map(|_| device.new_stream().unwrap()).collect();
                let mut buffers = [0_u64; MAX_RANKS];
                let mut signals = [0_u64; MAX_RANKS];
                for (rank, memory) in ranks.iter().enumerate() {
                    buffers[rank] = memory.buffer.address();
                    signals[rank] = memory.signals.address();
                    let stream = &streams[rank];
                    for zeroed in [&memory.buffer, &memory.signals, &memory.state] {
                        stream.fill_u8(zeroed, 0..zeroed.len_bytes(), 0).unwrap();
                    }
                    for poisoned in [
                        &memory.input,
                        &memory.output,
                        &memory.residual,
                        &memory.weight,
                    ] {
                        stream
                            .fill_u8(poisoned, 0..poisoned.len_bytes(), POISON)
                            .unwrap();
                    }
                    stream.synchronize_within(WAIT).unwrap();
                }
                let started = Instant::now();
                let mut output_bytes = vec![0_usize; world];
                for (rank, memory) in ranks.iter().enumerate() {
                    let shape = shapes[rank];
                    let owned = shape.owned_elements(world as u32, rank as u32).unwrap();
                    let own = owned.end - owned.start;
                    let whole = shape.elements();
                    let (input_elements, output_elements, rows, width) = match side {
                        Side::AllReduce => (whole, whole, 1, whole),
                        Side::ReduceScatter => (whole, own, shape.rows(), shape.width()),
                        Side::AllGather => (own, whole, shape.rows(), shape.width()),
                        Side::Fused => (whole, whole, shape.rows(), shape.width()),
                    };
                    output_bytes[rank] = output_elements as usize * element;
                    let input = if local {
                        memory.input.address() + GUARD_BYTES as u64
                    } else {
                        memory.buffer.address()
                    };
                    let output = memory.output.address() + GUARD_BYTES as u64;
                    let mut params = LaunchParams {
                        buffers,
                        signals,
                        state: memory.state.address(),
                        output,
                        input,
                        input_elements,
                        output_elements,
                        rows,
                        width,
                        scratch_offset: region as u64,
                        timeout_ns: DEADLINE.as_nanos() as u64,
                        rank: rank as u32,
                        world: world as u32,
                        ..LaunchParams::all_reduce(0)
                    };
                    if fused {
                        params.residual = memory.residual.address() + GUARD_BYTES as u64;
                        params.weight = memory.weight.address() + GUARD_BYTES as u64;
                        params.normed = output;
                        params.eps = 1e-6;
                    }
                    let geometry = if spec.cluster {
                        Geometry::clustered(2, 256, 2).unwrap().into()
                    } else {
                        Geometry::new(4, 256).unwrap()
                    };
                    streams[rank]
                        .launch_loaded(&kernel, geometry, &params.to_bytes())
                        .unwrap();
                }
                for stream in &streams {
                    stream.synchronize_within(WAIT).unwrap();
                }
                let seconds = started.elapsed().as_secs_f64();
                let case = format!("{} world {world}, {what}", spec.name);
                if seconds > DEADLINE.as_secs_f64() / 2.0 {
                    failures.push(format!("{case}: took {seconds:.2} s"));
                }
                for (rank, memory) in ranks.iter().enumerate() {
                    let stream = &streams[rank];
                    let mut word = [0_u64; 1];
                    stream.read(&memory.state, 0, &mut word).unwrap();
                    let named = (word[0] & 0xffff_ffff) as usize;
                    let code = ABORT_FLAG | (ABORT_SHAPE_MISMATCH << 32);
                    if word[0] & !0xffff_ffff != code
                        || named >= world
                        || shapes[named] == shapes[rank]
                    {
                        failures.push(format!("{case}, rank {rank}: abort word {:#018x}", word[0]));
                    }
                    let read = |memory: &DeviceBuffer| {
                        let mut bytes = vec![0_u8; memory.len_bytes()];
                        stream.read(memory, 0, &mut bytes).unwrap();
                        bytes
                    };
                    let mut buffer = read(&memory.buffer);
                    let after_scratch = buffer.split_off(region + scratch);
                    let scratch_now = buffer.split_off(region);
                    let mut written =
                        differing(&after_scratch, 0) + differing(&read(&memory.weight), POISON);
                    // The output (and a fused kernel's residual): a double-buffered kernel may
                    // have stored part of it, never around it.
                    let mut operands = vec![(read(&memory.output), output_bytes[rank])];
                    if fused {
                        operands.push((
                            read(&memory.residual),
                            shapes[rank].elements() as usize * element,
                        ));
                    }
                    for (mut bytes, inside) in operands {
                        let after = bytes.split_off(GUARD_BYTES + inside);
                        let inside = bytes.split_off(GUARD_BYTES);
                        written += differing(&bytes, POISON) + differing(&after, POISON);
                        if !moving {
                            written += differing(&inside, POISON);
                        }
                    }
                    if !moving {
                        written += differing(&scratch_now, 0);
                    }
                    if written != 0 {
                        failures.push(format!("{case}, rank {rank}: wrote {written} bytes"));
                    }
                }
            }
        }
    }
    // 18 kernels at each of three worlds, three disagreements each.
    if checked != 18 * 3 * 3 {
        failures.push(format!("{checked} cases checked, not every kernel's"));
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
