//! The GPU runtime on real GPUs: `prepare check` on two GPUs (bootstrap, agreement, IPC peer
//! memory, NCCL and every custom candidate exact), and the faults that must never hang: a rank
//! that never starts, a rank killed or stopped during an NCCL or a custom collective (these at
//! the test world, `PREPARE_TEST_WORLD`, 2 by default), another "host" turning peer kernels
//! off, and a kernel whose peer never arrives.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::support::{
    arch_of, assert_missed, check_on_two_gpus, export, export_file, free_port, gpu_tests,
    h200_ladder, h200_tp2_packages, ladder, launch_on_two_gpus, printed, require_gpus,
    require_world, start_rank, start_ranks, survivors_name_the_victim, written_ladder, Survivor,
};

#[test]
#[ignore = "needs GPUs"]
fn check_passes_on_two_gpus_with_every_h200_tp2_candidate_exact() {
    require_gpus!(2);
    for (name, _dir, package) in h200_tp2_packages() {
        let output = check_on_two_gpus(&package, 30, &[]);
        let stdout = String::from_utf8_lossy(&output.stdout);
        eprintln!("{name}:\n{}", printed(&output));
        assert!(output.status.success(), "{name}: prepare check failed");
        for rank in 0..2 {
            assert!(
                stdout.contains(&format!("[rank {rank}] check passed")),
                "{name}"
            );
            assert!(stdout.contains(&format!("[rank {rank}] rank {rank}/2 on GPU {rank}")));
            assert!(stdout.contains("PeerKernels"));
        }
        assert!(
            !stdout.contains("dropped"),
            "{name}: a candidate was dropped"
        );
        // Every candidate in graphs at three sizes, then the multi-size sequence with device
        // memory unchanged (check fails otherwise).
        assert!(stdout.contains("graph replays checked against the reference sum"));
        assert!(stdout.contains("[rank 1] multi-size sequence:"), "{name}");
    }
}

#[test]
#[ignore = "needs GPUs"]
fn a_rank_that_never_starts_ends_the_other_within_the_timeout_naming_it() {
    let world = require_world!();
    let missing = world as u32 - 1;
    let started = Instant::now();
    let ranks = start_ranks(world, "check", 0..missing, free_port(), &["--timeout", "5"]);
    for rank in ranks {
        let survivor = rank.number;
        let (code, lines, _) = rank.finish(Duration::from_secs(40));
        let survivor = Survivor {
            rank: survivor,
            code,
            lines,
            elapsed: started.elapsed(),
        };
        eprintln!(
            "rank {missing} never started: rank {} exited after {:?}",
            survivor.rank, survivor.elapsed
        );
        assert_missed(&survivor, missing, world);
    }
}

/// Ranks 0 to N - 1 of the test world soak `collective` with its H200 ladder's package; the last
/// is sent `signal`: every other rank must exit naming it.
fn fault_during_soak(collective: &str, signal: Signal) {
    let world = require_world!();
    let port = free_port();
    let (_dir, package) = export(&h200_ladder(world));
    let args = [
        "--timeout",
        "5",
        "--soak",
        "100000000",
        "--soak-collective",
        collective,
        "--package",
        package.to_str().unwrap(),
    ];
    let ranks = start_ranks(world, "check", 0..world as u32, port, &args);
    ranks[0].wait_for("soak:", Duration::from_secs(90));
    ranks[world - 1].wait_for("soak:", Duration::from_secs(10));
    survivors_name_the_victim(ranks, signal, &format!("the {collective} soak"));
}

gpu_tests! {
    a_rank_killed_during_nccl_ends_the_other_within_the_timeout =>
        fault_during_soak("nccl", Signal::SIGKILL);
    a_rank_stopped_during_nccl_ends_the_other_within_the_timeout =>
        fault_during_soak("nccl", Signal::SIGSTOP);
    a_rank_killed_during_a_custom_kernel_ends_the_other_within_the_timeout =>
        fault_during_soak("custom", Signal::SIGKILL);
    a_rank_stopped_during_a_custom_kernel_ends_the_other_within_the_timeout =>
        fault_during_soak("custom", Signal::SIGSTOP);
}

#[test]
#[ignore = "needs GPUs"]
fn nccl_profiles_with_communicator_settings_run_on_their_own_split() {
    require_gpus!(2);
    // The TP2 ladder with a four-CTA NCCL profile in every bucket.
    let mut ladder_value: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ladder("h200_nvlink_tp2.json")).unwrap()).unwrap();
    ladder_value.as_object_mut().unwrap().remove("$schema");
    ladder_value["name"] = "h200_nvlink_tp2_nccl_4cta".into();
    ladder_value["profiles"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"id": "nccl_4cta", "algorithm": "nccl", "max_ctas": 4}));
    for bucket in ladder_value["buckets"].as_array_mut().unwrap() {
        bucket["candidates"]
            .as_array_mut()
            .unwrap()
            .push("nccl_4cta".into());
    }
    let ladder_bytes = serde_json::to_vec_pretty(&ladder_value).unwrap();
    let (_dir, file) = written_ladder("h200_nvlink_tp2_nccl_4cta.json", ladder_bytes);
    let (_package_dir, package) = export_file(&file);
    let output = check_on_two_gpus(&package, 30, &[]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    eprintln!("{}", printed(&output));
    assert!(output.status.success());
    let buckets = ladder_value["buckets"].as_array().unwrap().len();
    for rank in 0..2 {
        let exact = stdout
            .lines()
            .filter(|line| {
                line.starts_with(&format!("[rank {rank}] bucket"))
                    && line.contains(" nccl_4cta ")
                    && line.ends_with(" exact")
            })
            .count();
        assert_eq!(exact, buckets, "rank {rank}");
    }
}

#[test]
#[ignore = "needs GPUs"]
fn ranks_can_meet_through_an_id_file_instead_of_nccl_comm_id() {
    require_gpus!(2);
    let dir = tempfile::tempdir().unwrap();
    let id_file = dir.path().join("nccl.id");
    // Rank 1 starts first and waits for rank 0 to write the id; the port is never used.
    let args = ["--timeout", "30", "--id-file", id_file.to_str().unwrap()];
    let port = free_port();
    let second = start_rank("check", 1, port, "one", &args);
    std::thread::sleep(Duration::from_millis(500));
    let first = start_rank("check", 0, port, "one", &args);
    for rank in [first, second] {
        let (code, lines, _) = rank.finish(Duration::from_secs(120));
        assert_eq!(code, Some(0), "{lines:#?}");
        assert!(
            lines.iter().any(|line| line == "check passed"),
            "{lines:#?}"
        );
    }
    // The header line, then the 128-byte id.
    let written = std::fs::read(&id_file).unwrap();
    let id = written.strip_prefix(prepare::files::ID_FILE_HEADER);
    assert_eq!(id.map(<[u8]>::len), Some(128), "{written:?}");
}

#[test]
#[ignore = "needs GPUs"]
fn a_rank_on_another_host_turns_peer_kernels_off_for_all() {
    require_gpus!(2);
    let port = free_port();
    let (_dir, tp2) = export("h200_nvlink_tp2.json");
    let args = ["--timeout", "30", "--package", tp2.to_str().unwrap()];
    let ranks = [
        start_rank("check", 0, port, "host-a", &args),
        start_rank("check", 1, port, "host-b", &args),
    ];
    for rank in ranks {
        let (code, lines, _) = rank.finish(Duration::from_secs(120));
        assert_eq!(code, Some(0), "{lines:#?}");
        let text = lines.join("\n");
        assert!(
            text.contains("the ranks are on 2 hosts (host-a, host-b)"),
            "{text}"
        );
        assert!(
            lines.iter().any(|line| line.contains(" one_shot_pull ")
                && line.contains("dropped: no peer access: the ranks are on 2 hosts")),
            "{text}"
        );
    }
}

/// A graph of many replays of a real kernel whose peer never launches fails within about one
/// deadline: the first launch records the abort code naming the peer, the rest return at once.
#[test]
#[ignore = "needs GPUs"]
fn a_graph_of_replays_whose_peer_never_arrives_fails_within_one_deadline() {
    use prepare::gpu::abort::{Abort, AbortReason};
    use prepare::gpu::driver::{DeviceMemory, Geometry, ModuleImage};
    use prepare::kernels::{LaunchParams, MAX_RANKS, SIGNAL_WORDS, STATE_WORDS};

    let (driver, [device]) = require_gpus!(1);
    let arch = arch_of(driver, 0);
    let spec = prepare::kernels::all_kernels(prepare::ladder::Dtype::Bf16, 2)
        .into_iter()
        .find(|spec| spec.name == "all_reduce_one_shot_pull_bf16")
        .unwrap();
    let compiled = prepare::compile::compile_kernels(
        std::slice::from_ref(&spec),
        arch,
        &prepare::progress::Silent,
    )
    .unwrap();
    let module = device
        .load_module(ModuleImage::Cubin(&compiled.kernels[0].cubin))
        .unwrap();
    let kernel = module
        .load(&spec.name, false, prepare::abi::PARAMS_BYTES)
        .unwrap();
    let mut stream = device.new_stream().unwrap();

    let elements = 4096_usize;
    let region = 1 << 20;
    // Rank 1's memory lives here too, but no kernel ever runs as rank 1.
    let buffers: Vec<_> = (0..2)
        .map(|_| device.allocate(region * 2).unwrap())
        .collect();
    let signals: Vec<_> = (0..2)
        .map(|_| device.allocate(SIGNAL_WORDS * 8).unwrap())
        .collect();
    let state = device.allocate(STATE_WORDS * 8).unwrap();
    let output = device.allocate(elements * 2).unwrap();
    for memory in signals.iter().chain([&state]) {
        stream.fill_u8(memory, 0..memory.len_bytes(), 0).unwrap();
    }
    stream.synchronize().unwrap();
    let mut buffer_addresses = [0; MAX_RANKS];
    let mut signal_addresses = [0; MAX_RANKS];
    for rank in 0..2 {
        buffer_addresses[rank] = buffers[rank].address();
        signal_addresses[rank] = signals[rank].address();
    }
    let timeout = Duration::from_millis(300);
    let params = LaunchParams {
        buffers: buffer_addresses,
        signals: signal_addresses,
        state: state.address(),
        output: output.address(),
        input: buffer_addresses[0],
        scratch_offset: region as u64,
        timeout_ns: timeout.as_nanos() as u64,
        rank: 0,
        world: 2,
        ..LaunchParams::all_reduce(elements as u64)
    };
    let geometry = Geometry::new(8, 256).unwrap();
    let replays = 32;
    let graph = stream
        .capture(|stream| -> Result<(), prepare::gpu::driver::DriverError> {
            for _ in 0..replays {
                stream.launch_loaded(&kernel, geometry, &params.to_bytes())?;
            }
            Ok(())
        })
        .unwrap();
    let started = Instant::now();
    graph.launch().unwrap();
    stream.synchronize_within(Duration::from_secs(30)).unwrap();
    let elapsed = started.elapsed();
    eprintln!(
        "{replays} replays with a missing peer ended after {elapsed:?} (deadline {timeout:?})"
    );
    let mut word = [0_u64];
    stream.read(&state, 0, &mut word).unwrap();
    let abort = Abort::decode(word[0]).expect("the abort word is set");
    assert_eq!(abort.reason, AbortReason::PeerTimeout);
    assert_eq!(abort.missing_peer(), Some(1));
    // One deadline, not one per replay (32 x 300 ms would be 9.6 s).
    assert!(elapsed < timeout * 4, "{elapsed:?}");
}

/// A serving process that already has a blocking NCCL communicator hands it to the library,
/// which splits its own from it; dropping the runtime leaves the server's communicator working.
/// Both ranks run as threads of this process, as a single-process server would.
#[test]
#[ignore = "needs GPUs"]
// Adopting a raw communicator is the unsafe entry under test.
#[allow(unsafe_code)]
fn a_servers_own_communicator_is_adopted_split_from_and_left_working() {
    use prepare::gpu::driver::Driver;
    use prepare::gpu::nccl::{CommConfig, Communicator, UniqueId};
    use prepare::runtime::{RankSetup, Rendezvous, Runtime};

    require_gpus!(2);
    let id = UniqueId::new().unwrap();
    let ranks: Vec<_> = (0..2_u32)
        .map(|rank| {
            std::thread::spawn(move || {
                let driver = Driver::open().unwrap();
                let device = driver.open_device(rank as usize).unwrap();
                let stream = device.new_stream().unwrap();
                stream.bind_current().unwrap();
                let deadline = Instant::now() + Duration::from_secs(60);
                // The server's own communicator: blocking, as servers make them.
                let server =
                    Communicator::init_with(&id, rank, 2, CommConfig::default(), deadline).unwrap();
                // SAFETY: `server` outlives the runtime and no other thread uses it meanwhile.
                let adopted = unsafe { Communicator::adopt(server.as_raw(), rank, 2, false) };
                let setup = RankSetup {
                    rank,
                    world: 2,
                    gpu: rank as usize,
                    timeout: Duration::from_secs(30),
                    rendezvous: Rendezvous::UniqueId(Box::new(id.to_bytes())),
                    host: "one".to_owned(),
                };
                let runtime = Runtime::start_from_parent(&setup, adopted).unwrap();
                assert_eq!(runtime.records().len(), 2);
                assert_eq!(*runtime.topology(), prepare::agree::Topology::PeerKernels);
                drop(runtime);
                // The server's communicator still sums.
                let elements = 1024;
                let buffer = device.allocate(elements * 2).unwrap();
                stream.fill_u16(&buffer, 0..elements * 2, 0x3F80).unwrap();
                server
                    .all_reduce_bf16(&stream, &buffer, &buffer, elements)
                    .unwrap();
                stream.synchronize_within(Duration::from_secs(30)).unwrap();
                let mut sums = vec![0_u16; elements];
                stream.read(&buffer, 0, &mut sums).unwrap();
                // 1.0 + 1.0 = 2.0 in bf16.
                assert!(sums.iter().all(|&sum| sum == 0x4000), "{:#06x}", sums[0]);
            })
        })
        .collect();
    for rank in ranks {
        rank.join().unwrap();
    }
}

/// Set, to the package's directory, in the rank processes of
/// [`serving_writes_sums_an_output_cannot_take_through_the_input_region`].
const SERVING_PACKAGE: &str = "PREPARE_TEST_SERVING_PACKAGE";

/// Where a served all-reduce's operands lie: the server's two buffers and the zero-copy region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ServedLayout {
    /// From one buffer into the other, 2 bytes on (not 16-byte aligned).
    MisalignedOutput,
    /// From one buffer into the same buffer 4 KiB on: the output partly overlaps the input.
    OverlappingOutput,
    /// From the zero-copy region's start into the other buffer, 2 bytes on.
    ZeroCopyToMisaligned,
    /// From the zero-copy region 64 bytes off its start into the other buffer.
    OffTheRegionStart,
    /// From one buffer into the zero-copy region 64 bytes off its start.
    IntoTheRegion,
    /// In place at the zero-copy region's start.
    ZeroCopyInPlace,
}

const SERVED_LAYOUTS: [ServedLayout; 6] = [
    ServedLayout::MisalignedOutput,
    ServedLayout::OverlappingOutput,
    ServedLayout::ZeroCopyToMisaligned,
    ServedLayout::OffTheRegionStart,
    ServedLayout::IntoTheRegion,
    ServedLayout::ZeroCopyInPlace,
];

/// One rank of the serving test: starts serving the package, checks the device memory it
/// keeps, then forces candidates of every input access and all-reduces in every layout, in a
/// graph of the server's own, each output against the reference sum and each input the handle
/// promises to keep.
fn serve_every_layout(package: &std::path::Path) {
    use prepare::collective::{private_output_bytes, Operands};
    use prepare::gpu::driver::{CallerMemory, DeviceBuffer, DeviceMemory as _};
    use prepare::ladder::{Collective, Dtype};
    use prepare::reference::{random_inputs, reference_sum_bf16};
    use prepare::serve::{Options, Server};

    const MIB: u64 = 1 << 20;
    let package = prepare::package::open_package_retrying(package).unwrap();
    let options = Options {
        timeout: Duration::from_secs(30),
        cache_dir: None,
        ..Options::default()
    };
    let mut handle = Server::from_env(options)
        .unwrap()
        .start(std::slice::from_ref(&package))
        .unwrap();
    let rank = handle.rank();
    let ladder = package.ladder().clone();
    // What the package keeps once selection is done, measured by the device's free memory.
    let kept = handle
        .selection(Collective::AllReduce, Dtype::Bf16)
        .unwrap()
        .load_memory_bytes;
    eprintln!(
        "rank {rank}: the package keeps {:.1} MiB of device memory after selection (peer buffer \
         {:.1} MiB, private output buffer {:.1} MiB)",
        kept as f64 / MIB as f64,
        prepare::kernels::peer_buffer_bytes(&ladder) as f64 / MIB as f64,
        private_output_bytes(&ladder) as f64 / MIB as f64
    );
    let allocated = prepare::kernels::peer_buffer_bytes(&ladder) + private_output_bytes(&ladder);
    assert!(
        kept >= allocated,
        "rank {rank}: {kept} bytes kept, less than the {allocated} bytes of the peer buffer and \
         the private output buffer"
    );

    let region = handle
        .zero_copy_region(Collective::AllReduce, Dtype::Bf16)
        .unwrap()
        .unwrap();
    let region_bytes = region.len_bytes() as u64;
    let private_bytes = private_output_bytes(&ladder);
    let device = handle.runtime().device().clone();
    let mut stream = device.new_stream().unwrap();
    // Local kernels (one-shot push, simple), RSAG pull (its output may be the input region) and
    // one-shot pull (its peers read the region until the end), at sizes below and above the
    // private buffer and above half the region, none a whole number of vectors.
    let cases: [(&str, u64); 6] = [
        ("one_shot_push", MIB - 6),
        ("one_shot_simple", 4 * MIB - 6),
        ("one_shot_simple_256", 40 * MIB),
        ("rsag_pull", 4 * MIB - 6),
        ("rsag_pull", 40 * MIB),
        ("one_shot_pull", MIB - 6),
    ];
    let most = cases.iter().map(|(_, bytes)| *bytes).max().unwrap() as usize;
    let first = device.allocate(most + 8192).unwrap();
    let second = device.allocate(most + 8192).unwrap();
    let mut checked = 0;
    for (case, (profile, bytes)) in cases.into_iter().enumerate() {
        let bucket = ladder.bucket_for(bytes).unwrap();
        handle
            .force(Collective::AllReduce, Dtype::Bf16, bucket, profile)
            .unwrap();
        let elements = (bytes / 2) as usize;
        let at = |buffer: &DeviceBuffer, offset: u64| {
            CallerMemory::prefix(buffer, offset + bytes).offset(offset)
        };
        let in_region = |offset: u64| CallerMemory::prefix(&region, offset + bytes).offset(offset);
        for (index, layout) in SERVED_LAYOUTS.into_iter().enumerate() {
            let (input, output) = match layout {
                ServedLayout::MisalignedOutput => (at(&first, 0), at(&second, 2)),
                ServedLayout::OverlappingOutput => (at(&first, 0), at(&first, 4096)),
                ServedLayout::ZeroCopyToMisaligned => (in_region(0), at(&second, 2)),
                ServedLayout::OffTheRegionStart => (in_region(64), at(&second, 0)),
                ServedLayout::IntoTheRegion => (at(&first, 0), in_region(64)),
                ServedLayout::ZeroCopyInPlace => (in_region(0), in_region(0)),
            };
            // The handle keeps an out-of-place input but where it moves a message off the
            // region's start to it, or sums a zero-copy message over itself for want of room.
            let room = 2 * bytes.next_multiple_of(16) <= region_bytes || bytes <= private_bytes;
            let kept = match layout {
                ServedLayout::MisalignedOutput | ServedLayout::IntoTheRegion => Some(true),
                ServedLayout::ZeroCopyToMisaligned => Some(room),
                _ => None,
            };
            let operands = Operands { input, output };
            let graph = stream
                .capture(|stream| {
                    handle
                        .all_reduce_on(stream, operands, elements, Dtype::Bf16)
                        .map_err(anyhow::Error::from)
                })
                .unwrap();
            let inputs = random_inputs(0x5EED_0000 + (case * 16 + index) as u64, 2, elements);
            let mine = &inputs[rank as usize];
            if output != input {
                stream.fill_u16(&output, 0..elements * 2, 0x7FA5).unwrap();
            }
            stream.write(&input, 0, mine).unwrap();
            graph.launch().unwrap();
            stream.synchronize_within(Duration::from_secs(60)).unwrap();
            handle.check().unwrap();
            let views: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
            let expected = reference_sum_bf16(&views);
            let what = format!("rank {rank}: {profile} at {bytes} bytes, {layout:?}");
            let mut got = vec![0_u16; elements];
            stream.read(&output, 0, &mut got).unwrap();
            assert!(
                got == expected,
                "{what}: the output differs from the reference sum"
            );
            let mut after = vec![0_u16; elements];
            stream.read(&input, 0, &mut after).unwrap();
            match kept {
                Some(true) => assert!(&after == mine, "{what}: the input changed"),
                Some(false) => assert!(after == expected, "{what}: the input is not the sum"),
                None => {}
            }
            eprintln!("{what}: exact");
            checked += 1;
        }
    }
    eprintln!("rank {rank}: {checked} served all-reduces exact");
}

/// A server's all-reduces on two GPUs through forced candidates of every kind of input access
/// (local kernels, RSAG pull, one-shot pull), with outputs a kernel cannot write (misaligned,
/// partly overlapping the input, off the zero-copy region's start), so that sums go through
/// the input region and the private output buffer and moves between overlapping ranges run in
/// chunks: every output exact, every input kept that the handle promises to keep; and the
/// device memory the package keeps after selection, as measured, holds at least its peer buffer
/// and private output buffer (the figure is printed; docs/benchmarks.md records it).
/// Each rank is this test again, in a process of its own.
#[test]
#[ignore = "needs GPUs"]
fn serving_writes_sums_an_output_cannot_take_through_the_input_region() {
    if let Some(package) = std::env::var_os(SERVING_PACKAGE) {
        serve_every_layout(package.as_ref());
        return;
    }
    require_gpus!(2);
    let (_dir, package) = export("h200_nvlink_tp2.json");
    let (launched, lines) = launch_on_two_gpus(
        std::env::current_exe().unwrap(),
        crate::support::process::rerun(&crate::test_name!(
            serving_writes_sums_an_output_cannot_take_through_the_input_region
        ))
        .get_args()
        .map(Into::into)
        .collect(),
        vec![(SERVING_PACKAGE.into(), package.into())],
    );
    launched.unwrap_or_else(|error| panic!("{error}: {lines:#?}"));
    for rank in 0..2 {
        assert!(
            lines
                .iter()
                .any(|line| line
                    == &format!("[rank {rank}] rank {rank}: 36 served all-reduces exact")),
            "{lines:#?}"
        );
    }
}
