//! Ranks that disagree on their message's shape, every rank a stream of one GPU: each
//! reduce-scatter and all-gather kernel of the kernel table at 2, 4 and 8 ranks in bf16, with
//! one rank's rows one more, one rank's width another, or one rank's rows 0. The start barrier's
//! shape check must leave every rank the shape-mismatch abort naming a peer of another shape,
//! well before the deadline, with nothing written: every output and the bytes around it keep
//! their poison, and the scratch after the input region stays zero.

use std::time::{Duration, Instant};

use prepare::abi::{ABORT_FLAG, ABORT_SHAPE_MISMATCH, PARAMS_BYTES};
use prepare::compile::SourceOverrides;
use prepare::gpu::driver::{Device, DeviceBuffer, DeviceMemory, Geometry, ModuleImage};
use prepare::kernels::{
    input_access, kernel_for, scratch_bytes, InputAccess, LaunchParams, MAX_RANKS, SIGNAL_BYTES,
    STATE_WORDS,
};
use prepare::ladder::{Collective, Dtype, Profile};
use prepare::shape::Shape;

use super::checks::{check_connections, compile};
use super::{GUARD_BYTES, POISON, WAIT};

/// Far longer than a shape check takes, so a rank that waited for it is told apart.
const DEADLINE: Duration = Duration::from_secs(5);

struct Rank {
    buffer: DeviceBuffer,
    signals: DeviceBuffer,
    state: DeviceBuffer,
    input: DeviceBuffer,
    output: DeviceBuffer,
}

/// Every disagreement at every world, for every row kernel: a report line per failure.
pub fn check_disagreeing_shapes(device: &Device) -> Result<(), String> {
    let dtype = Dtype::Bf16;
    let element = dtype.size_bytes() as usize;
    let mut failures = Vec::new();
    for world in [2_usize, 4, 8] {
        check_connections(world);
        let base = (world as u64 + 1, 7_u64);
        let cases = [
            (
                "the last rank's rows one more",
                world - 1,
                (base.0 + 1, base.1),
            ),
            ("rank 0's width another", 0, (base.0, 9)),
            ("rank 1 with rows 0", 1, (0, base.1)),
        ];
        for collective in [Collective::ReduceScatter, Collective::AllGather] {
            for transfer in ["pull", "push"] {
                let profile: Profile = serde_json::from_value(serde_json::json!({
                    "id": transfer, "algorithm": "one_shot", "transfer": transfer
                }))
                .unwrap();
                let spec = kernel_for(&profile, collective, dtype, world as u32).unwrap();
                let local = input_access(&spec) == Some(InputAccess::Local);
                let compiled = compile(
                    std::slice::from_ref(&spec),
                    world as u32,
                    &SourceOverrides::new(),
                    "embedded",
                )?;
                let module = device
                    .load_module(ModuleImage::Cubin(&compiled[0].cubin))
                    .unwrap();
                let kernel = module.load(&spec.name, false, PARAMS_BYTES).unwrap();
                for (what, odd, odd_shape) in cases {
                    let shapes: Vec<Shape> = (0..world)
                        .map(|rank| {
                            let (rows, width) = if rank == odd { odd_shape } else { base };
                            Shape::new(rows, width).unwrap()
                        })
                        .collect();
                    let largest = shapes.iter().map(|shape| shape.elements()).max().unwrap()
                        as usize
                        * element;
                    let region = (largest + GUARD_BYTES).next_multiple_of(256);
                    let scratch = scratch_bytes(&spec, largest as u64) as usize;
                    let ranks: Vec<Rank> = (0..world)
                        .map(|_| Rank {
                            buffer: device.allocate(region + scratch + GUARD_BYTES).unwrap(),
                            signals: device.allocate(SIGNAL_BYTES as usize).unwrap(),
                            state: device.allocate(STATE_WORDS * 8).unwrap(),
                            input: device.allocate(largest + 2 * GUARD_BYTES).unwrap(),
                            output: device.allocate(largest + 2 * GUARD_BYTES).unwrap(),
                        })
                        .collect();
                    let streams: Vec<_> =
                        (0..world).map(|_| device.new_stream().unwrap()).collect();
                    let mut buffers = [0_u64; MAX_RANKS];
                    let mut signals = [0_u64; MAX_RANKS];
                    for (rank, memory) in ranks.iter().enumerate() {
                        buffers[rank] = memory.buffer.address();
                        signals[rank] = memory.signals.address();
                        let stream = &streams[rank];
                        for zeroed in [&memory.buffer, &memory.signals, &memory.state] {
                            stream.fill_u8(zeroed, 0..zeroed.len_bytes(), 0).unwrap();
                        }
                        for poisoned in [&memory.input, &memory.output] {
                            stream
                                .fill_u8(poisoned, 0..poisoned.len_bytes(), POISON)
                                .unwrap();
                        }
                        stream.synchronize_within(WAIT).unwrap();
                    }
                    let started = Instant::now();
                    for (rank, memory) in ranks.iter().enumerate() {
                        let shape = shapes[rank];
                        let owned = shape.owned_elements(world as u32, rank as u32).unwrap();
                        let own = owned.end - owned.start;
                        let gather = collective == Collective::AllGather;
                        let input = if local {
                            memory.input.address() + GUARD_BYTES as u64
                        } else {
                            memory.buffer.address()
                        };
                        let params = LaunchParams {
                            buffers,
                            signals,
                            state: memory.state.address(),
                            output: memory.output.address() + GUARD_BYTES as u64,
                            input,
                            input_elements: if gather { own } else { shape.elements() },
                            output_elements: if gather { shape.elements() } else { own },
                            rows: shape.rows(),
                            width: shape.width(),
                            scratch_offset: region as u64,
                            timeout_ns: DEADLINE.as_nanos() as u64,
                            rank: rank as u32,
                            world: world as u32,
                            ..LaunchParams::all_reduce(0)
                        };
                        streams[rank]
                            .launch_loaded(
                                &kernel,
                                Geometry::new(4, 256).unwrap(),
                                &params.to_bytes(),
                            )
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
                            failures
                                .push(format!("{case}, rank {rank}: abort word {:#018x}", word[0]));
                        }
                        let mut output = vec![0_u8; memory.output.len_bytes()];
                        stream.read(&memory.output, 0, &mut output).unwrap();
                        let mut scratch_now = vec![0_u8; memory.buffer.len_bytes() - region];
                        stream
                            .read(&memory.buffer, region, &mut scratch_now)
                            .unwrap();
                        let written = output.iter().filter(|byte| **byte != POISON).count()
                            + scratch_now.iter().filter(|byte| **byte != 0).count();
                        if written != 0 {
                            failures.push(format!("{case}, rank {rank}: wrote {written} bytes"));
                        }
                    }
                }
            }
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}
