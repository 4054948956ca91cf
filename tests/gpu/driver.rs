//! The driver layer on real GPUs, with small kernels of its own (tests/gpu/kernels): device
//! descriptions, peer access, memory, ordinary and cluster launches, occupancy, the parameter
//! check, bounded waits and the abort word, graph capture and replay, events and CUDA IPC
//! between two processes.

use std::time::Duration;

use prepare::abi::PARAMS_BYTES;
use prepare::gpu::abort::{Abort, AbortReason};
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Driver, DriverError, Geometry, IpcHandle, Kernel, Module,
    ModuleImage, Stream,
};
use prepare::kernels::{LaunchParams, SIGNAL_WORDS, STATE_WORDS};

use super::support::{arch_of, compile_ptx, gpu_required, require_gpus, SplitMix};
use crate::support::process::{passed, rerun};
use crate::test_name;

const ABI: &str = include_str!("../../kernels/prepare_abi.cuh");
const SOURCE: &str = include_str!("kernels/driver_test.cu");
const WAIT: Duration = Duration::from_secs(20);

fn test_source() -> String {
    // `#pragma once` in a main file is a warning; the header is pasted in front instead.
    let header = ABI.replace("#pragma once\n", "");
    format!("{header}\n{SOURCE}")
}

fn load(driver: Driver, device: &Device) -> Module {
    let arch = arch_of(driver, device.ordinal());
    let ptx = compile_ptx(&test_source(), arch.name());
    device.load_module(ModuleImage::Ptx(&ptx)).unwrap()
}

fn params(rank: u32, world: u32) -> LaunchParams {
    LaunchParams {
        rank,
        world,
        ..LaunchParams::all_reduce(0)
    }
}

fn read_u32(stream: &Stream, memory: &impl DeviceMemory, offset: usize, count: usize) -> Vec<u32> {
    let mut out = vec![0u32; count];
    stream.read(memory, offset, &mut out).unwrap();
    out
}

fn read_u64(stream: &Stream, memory: &impl DeviceMemory, offset: usize, count: usize) -> Vec<u64> {
    let mut out = vec![0u64; count];
    stream.read(memory, offset, &mut out).unwrap();
    out
}

#[test]
#[ignore = "needs GPUs"]
fn describes_every_visible_gpu() {
    let (driver, _devices) = require_gpus!(1);
    for ordinal in 0..driver.device_count().unwrap() {
        let info = driver.describe(ordinal).unwrap();
        eprintln!("{info:?}");
        assert_eq!(info.ordinal, ordinal);
        assert!(!info.name.is_empty());
        assert!(
            info.uuid.starts_with("GPU-") && info.uuid.len() == 40,
            "{}",
            info.uuid
        );
        assert!(info.sm_count > 0);
        assert!(info.total_memory_bytes > 0);
        assert!(info.arch_name().starts_with("sm_"));
        if info.compute_capability.0 >= 9 {
            assert!(
                info.cluster_launch,
                "compute capability 9+ launches clusters"
            );
        }
    }
    let count = driver.device_count().unwrap();
    let error = driver.describe(count).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!("GPU {count} does not exist: the driver sees {count} GPU(s)")
    );
    eprintln!("driver supports CUDA {}", driver.version());
}

#[test]
#[ignore = "needs GPUs"]
fn memory_round_trips_and_refuses_out_of_bounds() {
    let (driver, [device]) = require_gpus!(1);
    let too_large = 2 * driver.describe(0).unwrap().total_memory_bytes as usize;
    let stream = device.new_stream().unwrap();
    let buffer = device.allocate(4096).unwrap();
    stream.fill_u16(&buffer, 0..4096, 0xffff).unwrap();
    let mut random = SplitMix(1);
    let data: Vec<u32> = (0..256).map(|_| random.next_u32()).collect();
    stream.write(&buffer, 1024, &data).unwrap();
    assert_eq!(read_u32(&stream, &buffer, 1024, 256), data);
    assert_eq!(read_u32(&stream, &buffer, 0, 256), vec![u32::MAX; 256]);
    stream.fill_u8(&buffer, 0..16, 0x5a).unwrap();
    assert_eq!(read_u32(&stream, &buffer, 0, 4), vec![0x5a5a_5a5a; 4]);

    let errors = [
        stream.write(&buffer, 4000, &data).unwrap_err(),
        stream.read(&buffer, 4096, &mut [0u8; 1]).unwrap_err(),
        stream.fill_u8(&buffer, 0..4097, 0).unwrap_err(),
        stream.fill_u16(&buffer, 1..3, 0).unwrap_err(),
        device.allocate(too_large).unwrap_err(),
    ];
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    insta::assert_snapshot!(messages.join("\n"), @r"
    write of bytes 4000..5024 is outside the 4096-byte buffer on GPU 0
    read of bytes 4096..4097 is outside the 4096-byte buffer on GPU 0
    fill of bytes 0..4097 is outside the 4096-byte buffer on GPU 0
    fill_u16 needs a range aligned to 2 bytes, got 1..3 on GPU 0
    cuMemAlloc on GPU 0 failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)
    ");
}

#[test]
#[ignore = "needs GPUs"]
fn refuses_kernels_that_do_not_take_the_launch_contract() {
    let (driver, [device]) = require_gpus!(1);
    let module = load(driver, &device);
    let errors = [
        module
            .kernel("driver_two_parameters", PARAMS_BYTES)
            .unwrap_err(),
        module
            .kernel("driver_small_parameter", PARAMS_BYTES)
            .unwrap_err(),
        module
            .cluster_kernel("driver_no_parameters", PARAMS_BYTES)
            .unwrap_err(),
        module.kernel("no_such_kernel", PARAMS_BYTES).unwrap_err(),
    ];
    let messages: Vec<String> = errors.iter().map(ToString::to_string).collect();
    insta::assert_snapshot!(messages.join("\n"), @r"
    kernel driver_two_parameters on GPU 0 takes more than one parameter, but its launches pass one parameter of 240 bytes by value
    kernel driver_small_parameter on GPU 0 takes one parameter of 4 bytes at offset 0, but its launches pass one parameter of 240 bytes by value
    kernel driver_no_parameters on GPU 0 takes no parameters, but its launches pass one parameter of 240 bytes by value
    cuModuleGetFunction on GPU 0 failed: CUDA_ERROR_NOT_FOUND (named symbol not found)
    ");

    let invalid_cubin = device
        .load_module(ModuleImage::Cubin(
            b"not an ELF file at all, but long enough to hold a header",
        ))
        .unwrap_err();
    assert!(
        matches!(invalid_cubin, DriverError::InvalidImage { .. }),
        "{invalid_cubin}"
    );

    // A cluster kernel paired with a plain geometry never reaches the driver.
    let cluster = module
        .load("driver_cluster_exchange", true, PARAMS_BYTES)
        .unwrap();
    let stream = device.new_stream().unwrap();
    let error = stream
        .launch_loaded(
            &cluster,
            Geometry::new(64, 512).unwrap(),
            &params(0, 1).to_bytes(),
        )
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        "kernel driver_cluster_exchange uses cluster instructions and cannot launch as 64 blocks \
         x 512 threads: it needs cluster dimensions"
    );
}

/// Inputs, scratch and outputs of one rank for the pull/push kernel.
struct RankMemory {
    buffer: DeviceBuffer,
    output: DeviceBuffer,
    input: Vec<u32>,
}

/// Peer access enabled both ways between two GPUs, and on each the test kernel `entry` and a
/// stream of its own.
fn peer_kernels(driver: Driver, devices: &[Device], entry: &str) -> (Vec<Kernel>, Vec<Stream>) {
    devices[0].enable_peer_access(&devices[1]).unwrap();
    devices[1].enable_peer_access(&devices[0]).unwrap();
    let kernels = devices
        .iter()
        .map(|device| load(driver, device).kernel(entry, PARAMS_BYTES).unwrap())
        .collect();
    let streams = devices
        .iter()
        .map(|device| device.new_stream().unwrap())
        .collect();
    (kernels, streams)
}

#[test]
#[ignore = "needs GPUs"]
fn two_gpus_read_and_write_each_other_through_peer_access() {
    let (driver, devices) = require_gpus!(2);
    assert!(
        driver.can_access_peer(0, 1).unwrap() && devices[0].can_access_peer(&devices[1]).unwrap()
    );
    let (kernels, streams) = peer_kernels(driver, &devices, "driver_pull_push");
    // Enabling twice is not an error.
    devices[0].enable_peer_access(&devices[1]).unwrap();

    let elements = 1usize << 20;
    let bytes = elements * 4;
    let mut random = SplitMix(7);
    let ranks: Vec<RankMemory> = devices
        .iter()
        .zip(&streams)
        .map(|(device, stream)| {
            let input: Vec<u32> = (0..elements).map(|_| random.next_u32()).collect();
            let buffer = device.allocate(2 * bytes).unwrap();
            let output = device.allocate(bytes).unwrap();
            stream.write(&buffer, 0, &input).unwrap();
            stream.fill_u8(&buffer, bytes..2 * bytes, 0xee).unwrap();
            stream.fill_u8(&output, 0..bytes, 0xee).unwrap();
            RankMemory {
                buffer,
                output,
                input,
            }
        })
        .collect();
    let expected: Vec<u32> = (0..elements)
        .map(|index| ranks[0].input[index].wrapping_add(ranks[1].input[index]))
        .collect();

    // Plain launch, then the same ordinary kernel under cluster scheduling.
    for geometry in [
        Geometry::new(132, 256).unwrap(),
        Geometry::clustered(64, 512, 8).unwrap().into(),
    ] {
        for (rank, memory) in ranks.iter().enumerate() {
            let mut launch = params(rank as u32, 2);
            launch.buffers[0] = ranks[0].buffer.address();
            launch.buffers[1] = ranks[1].buffer.address();
            launch.output = memory.output.address();
            launch.set_all_reduce_elements(elements as u64);
            launch.scratch_offset = bytes as u64;
            streams[rank]
                .fill_u8(&memory.output, 0..bytes, 0xee)
                .unwrap();
            streams[rank]
                .launch(&kernels[rank], geometry, &launch.to_bytes())
                .unwrap();
        }
        for (rank, memory) in ranks.iter().enumerate() {
            streams[rank].synchronize_within(WAIT).unwrap();
            assert!(
                read_u32(&streams[rank], &memory.output, 0, elements) == expected,
                "rank {rank} sum with {geometry}"
            );
            let scratch = read_u32(&streams[rank], &memory.buffer, bytes, elements);
            let writer = (rank as u32 + 1) % 2;
            let first_wrong =
                (0..elements).find(|&index| scratch[index] != (writer << 24) ^ index as u32);
            assert_eq!(
                first_wrong, None,
                "rank {rank} scratch written by rank {writer} with {geometry}"
            );
        }
    }
}

#[test]
#[ignore = "needs GPUs"]
fn cluster_kernels_share_memory_across_their_cluster_and_fit_the_occupancy_rule() {
    let (driver, [device]) = require_gpus!(1);
    let info = driver.describe(0).unwrap();
    if !info.cluster_launch {
        assert!(!gpu_required() || info.compute_capability.0 < 9);
        eprintln!("skipped: {} does not launch clusters", info.name);
        return;
    }
    let module = load(driver, &device);
    let kernel = module
        .cluster_kernel("driver_cluster_exchange", PARAMS_BYTES)
        .unwrap();
    let geometry = Geometry::clustered(64, 512, 8).unwrap();
    let clusters = kernel.max_active_clusters(geometry).unwrap();
    eprintln!(
        "{}: {clusters} clusters of 8x512 resident at once",
        info.name
    );
    assert!(
        clusters >= 8,
        "a clustered bucket's 8 clusters must all be resident"
    );
    assert!(kernel.max_active_blocks_per_multiprocessor(512).unwrap() >= 1);
    let ordinary = module.kernel("driver_pull_push", PARAMS_BYTES).unwrap();
    let blocks = ordinary.max_active_blocks(1024).unwrap();
    assert!(
        blocks >= info.sm_count && blocks < 1024 * info.sm_count,
        "{blocks} blocks of 1024 threads"
    );

    let elements = 64 * 512;
    let output = device.allocate(elements * 4).unwrap();
    let mut stream = device.new_stream().unwrap();
    let mut launch = params(0, 1);
    launch.output = output.address();
    let expected: Vec<u32> = (0..elements as u32)
        .map(|index| {
            let (block, thread) = (index / 512, index % 512);
            ((block % 8 + 1) % 8) * 100_000 + thread + 8 * 10_000_000
        })
        .collect();

    stream.fill_u8(&output, 0..elements * 4, 0xee).unwrap();
    stream
        .launch_cluster(&kernel, geometry, &launch.to_bytes())
        .unwrap();
    stream.synchronize_within(WAIT).unwrap();
    assert!(
        read_u32(&stream, &output, 0, elements) == expected,
        "cluster launch"
    );

    // The cluster dimensions survive capture into a graph and every replay.
    let graph = stream
        .capture(|stream| {
            stream.fill_u8(&output, 0..elements * 4, 0xee)?;
            stream.launch_cluster(&kernel, geometry, &launch.to_bytes())
        })
        .unwrap();
    graph.upload().unwrap();
    for replay in 0..3 {
        stream.fill_u8(&output, 0..elements * 4, 0x11).unwrap();
        graph.launch().unwrap();
        stream.synchronize_within(WAIT).unwrap();
        assert!(
            read_u32(&stream, &output, 0, elements) == expected,
            "replay {replay}"
        );
    }
    let empty = stream.capture(|_| Ok::<(), DriverError>(())).unwrap_err();
    assert_eq!(
        empty.to_string(),
        "stream capture on GPU 0 recorded no work"
    );
}

/// One rank's signal flags, state words and output for the flag-exchange kernel.
struct FlagMemory {
    signals: DeviceBuffer,
    state: DeviceBuffer,
    output: DeviceBuffer,
}

fn flag_memory(device: &Device, stream: &Stream) -> FlagMemory {
    let memory = FlagMemory {
        signals: device.allocate(SIGNAL_WORDS * 8).unwrap(),
        state: device.allocate(STATE_WORDS * 8).unwrap(),
        output: device.allocate(8).unwrap(),
    };
    stream
        .fill_u8(&memory.signals, 0..SIGNAL_WORDS * 8, 0)
        .unwrap();
    stream
        .fill_u8(&memory.state, 0..STATE_WORDS * 8, 0)
        .unwrap();
    stream.fill_u8(&memory.output, 0..8, 0).unwrap();
    memory
}

#[test]
#[ignore = "needs GPUs"]
fn a_missing_peer_ends_in_the_sticky_abort_word_within_the_deadline() {
    let (driver, [device]) = require_gpus!(1);
    let module = load(driver, &device);
    let kernel = module.kernel("driver_flag_exchange", PARAMS_BYTES).unwrap();
    let stream = device.new_stream().unwrap();
    let own = flag_memory(&device, &stream);
    // Rank 1 never runs: its flags are a local stand-in nobody waits on.
    let absent = flag_memory(&device, &stream);
    let mut launch = params(0, 2);
    launch.signals[0] = own.signals.address();
    launch.signals[1] = absent.signals.address();
    launch.state = own.state.address();
    launch.output = own.output.address();
    launch.timeout_ns = 2_000_000;

    let geometry = Geometry::new(1, 32).unwrap();
    let start = std::time::Instant::now();
    stream
        .launch(&kernel, geometry, &launch.to_bytes())
        .unwrap();
    stream.synchronize_within(WAIT).unwrap();
    let abort = Abort::decode(read_u64(&stream, &own.state, 0, 1)[0]).expect("an abort word");
    assert_eq!(
        (abort.reason, abort.missing_peer()),
        (AbortReason::PeerTimeout, Some(1))
    );
    eprintln!("{abort}, after {:?}", start.elapsed());

    // Sticky: the next launch returns at once, without advancing the epoch.
    stream
        .launch(&kernel, geometry, &launch.to_bytes())
        .unwrap();
    stream.synchronize_within(Duration::from_secs(1)).unwrap();
    assert_eq!(read_u64(&stream, &own.state, 0, 2), vec![abort.word, 1]);
    assert_eq!(read_u64(&stream, &own.output, 0, 1), vec![0]);
}

#[test]
#[ignore = "needs GPUs"]
fn captured_graphs_replay_a_peer_flag_protocol_on_two_gpus() {
    let (driver, devices) = require_gpus!(2);
    let (kernels, mut streams) = peer_kernels(driver, &devices, "driver_flag_exchange");
    let memory: Vec<FlagMemory> = devices
        .iter()
        .zip(&streams)
        .map(|(device, stream)| flag_memory(device, stream))
        .collect();
    for stream in &streams {
        stream.synchronize_within(WAIT).unwrap();
    }
    let geometry = Geometry::new(1, 32).unwrap();
    let mut graphs = Vec::new();
    for rank in 0..2 {
        let mut launch = params(rank as u32, 2);
        launch.signals[0] = memory[0].signals.address();
        launch.signals[1] = memory[1].signals.address();
        launch.state = memory[rank].state.address();
        launch.output = memory[rank].output.address();
        launch.timeout_ns = 5_000_000_000;
        let kernel = &kernels[rank];
        graphs.push(
            streams[rank]
                .capture(|stream| stream.launch(kernel, geometry, &launch.to_bytes()))
                .unwrap(),
        );
    }

    let events: Vec<_> = devices
        .iter()
        .map(|device| {
            (
                device.new_event(true).unwrap(),
                device.new_event(true).unwrap(),
            )
        })
        .collect();
    for rank in 0..2 {
        streams[rank].record(&events[rank].0).unwrap();
    }
    for _ in 0..REPLAYS {
        for graph in &graphs {
            graph.launch().unwrap();
        }
    }
    for rank in 0..2 {
        streams[rank].record(&events[rank].1).unwrap();
    }
    for rank in 0..2 {
        streams[rank].synchronize_within(WAIT).unwrap();
        let state = read_u64(&streams[rank], &memory[rank].state, 0, 2);
        assert_eq!(
            state,
            vec![0, REPLAYS],
            "rank {rank}: abort word and epoch after {REPLAYS} replays"
        );
        assert_eq!(
            read_u64(&streams[rank], &memory[rank].output, 0, 1),
            vec![REPLAYS]
        );
        let milliseconds = events[rank].0.elapsed_ms(&events[rank].1).unwrap();
        assert!(milliseconds > 0.0);
        eprintln!(
            "rank {rank}: {:.2} us per replayed flag exchange",
            milliseconds * 1000.0 / REPLAYS as f32
        );
    }
}

const REPLAYS: u64 = 200;
const IPC_HANDLE_VARIABLE: &str = "PREPARE_TEST_IPC_HANDLE";
const IPC_WORDS: usize = 1 << 16;

/// Another process maps this one's buffer by its IPC handle, checks what is there and writes
/// back; run by starting this test binary again on `ipc_child_helper`.
#[test]
#[ignore = "needs GPUs"]
fn cuda_ipc_shares_a_buffer_with_another_process() {
    let (_driver, devices) = require_gpus!(2);
    let device = &devices[0];
    let stream = device.new_stream().unwrap();
    let buffer = device.allocate(IPC_WORDS * 4).unwrap();
    let pattern: Vec<u32> = (0..IPC_WORDS as u32)
        .map(|index| index.wrapping_mul(2_654_435_761))
        .collect();
    stream.write(&buffer, 0, &pattern).unwrap();
    let handle = buffer.ipc_handle().unwrap();
    let hex: String = handle
        .0
        .iter()
        .fold(String::new(), |hex, byte| hex + &format!("{byte:02x}"));

    let output = rerun(&test_name!(ipc_child_helper))
        .env(IPC_HANDLE_VARIABLE, hex)
        .output()
        .unwrap();
    let log = passed(&output);
    eprintln!(
        "{}",
        log.lines()
            .filter(|line| line.starts_with("child:"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let written = read_u32(&stream, &buffer, 0, IPC_WORDS);
    let first_wrong = (0..IPC_WORDS).find(|&index| written[index] != !pattern[index]);
    assert_eq!(first_wrong, None, "the child's writes through its mapping");
}

/// The other half of `cuda_ipc_shares_a_buffer_with_another_process`; without the handle in
/// its environment there is nothing to map and it returns.
#[test]
#[ignore = "needs GPUs"]
fn ipc_child_helper() {
    let Ok(hex) = std::env::var(IPC_HANDLE_VARIABLE) else {
        return;
    };
    let bytes: Vec<u8> = (0..64)
        .map(|index| u8::from_str_radix(&hex[2 * index..2 * index + 2], 16).unwrap())
        .collect();
    let handle = IpcHandle(bytes.try_into().unwrap());
    let driver = Driver::open().unwrap();
    let device = driver.open_device(1).unwrap();
    let stream = device.new_stream().unwrap();
    let start = std::time::Instant::now();
    let mapping = device.open_ipc(&handle).unwrap();
    eprintln!(
        "child: opened a {}-byte mapping on GPU 1 in {:?}",
        mapping.len_bytes(),
        start.elapsed()
    );
    assert!(mapping.len_bytes() >= IPC_WORDS * 4);
    let seen = read_u32(&stream, &mapping, 0, IPC_WORDS);
    let expected: Vec<u32> = (0..IPC_WORDS as u32)
        .map(|index| index.wrapping_mul(2_654_435_761))
        .collect();
    assert!(seen == expected, "the parent's pattern through the mapping");
    let inverted: Vec<u32> = seen.iter().map(|value| !value).collect();
    stream.write(&mapping, 0, &inverted).unwrap();
}
