//! Smoke test of the shipped H200 TP2 ladders on two GPUs in one process (peer access, no
//! IPC): every custom candidate of every bucket is compiled with NVRTC, launched once on both
//! GPUs at once at the bucket's largest size and at an odd size just under it, on fresh random
//! bf16 inputs, and each rank's output must equal the reference sum byte for byte. It prints a
//! table of kernel x bucket with the first mismatch of every failure.
#![allow(clippy::print_stderr)]

mod gpu_support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use prepare::compile::compile_ladder;
use prepare::device::{check_candidate_residency, check_package_fits};
use prepare::gpu::abort::Abort;
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Driver, Geometry, LoadedKernel, ModuleImage, Stream,
};
use prepare::kernels::{
    input_region_bytes, kernel_for, peer_buffer_bytes, AllReduceParams, MAX_RANKS, SIGNAL_BYTES,
    STATE_WORDS,
};
use prepare::ladder::{validate_ladder_file, Bucket, Ladder, Profile};
use prepare::progress::Silent;
use prepare::reference::{random_inputs, reference_sum_bf16};

use gpu_support::gpus;

const LADDERS: [&str; 2] = ["h200_nvlink_tp2.json", "h200_nvlink_tp2_clustered.json"];
/// Every spin's deadline in the kernels: long enough for any message here, short enough that a
/// missing peer fails the test in seconds.
const SPIN_DEADLINE_NS: u64 = 2_000_000_000;
/// How long the host waits for a launch before giving up on the run.
const WAIT: Duration = Duration::from_secs(30);
/// Written over every output before a launch; a NaN that the reference (canonical NaN 0x7FFF)
/// never produces, so an unwritten element always fails.
const POISON: u16 = 0xFFFF;

fn ladder_path(file: &str) -> PathBuf {
    std::env::var_os("PREPARE_LADDERS")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("ladders"), PathBuf::from)
        .join(file)
}

/// One rank's registered memory and loaded kernels for one ladder.
struct Rank {
    stream: Stream,
    buffer: DeviceBuffer,
    signals: DeviceBuffer,
    state: DeviceBuffer,
    output: DeviceBuffer,
    kernels: BTreeMap<String, LoadedKernel>,
}

impl Rank {
    fn new(device: &Device, ladder: &Ladder, cubins: &[(String, bool, Vec<u8>)]) -> Rank {
        let stream = device.new_stream().unwrap();
        let kernels = cubins
            .iter()
            .map(|(name, cluster, cubin)| {
                let module = device.load_module(ModuleImage::Cubin(cubin)).unwrap();
                (name.clone(), module.load(name, *cluster).unwrap())
            })
            .collect();
        let rank = Rank {
            buffer: device.allocate(peer_buffer_bytes(ladder) as usize).unwrap(),
            signals: device.allocate(SIGNAL_BYTES as usize).unwrap(),
            state: device.allocate(STATE_WORDS * 8).unwrap(),
            output: device.allocate(input_region_bytes(ladder) as usize).unwrap(),
            stream,
            kernels,
        };
        rank.reset_flags();
        rank
    }

    /// Zeroes the signal flags and state words: once at allocation, and again after an abort
    /// left the ranks' epochs apart.
    fn reset_flags(&self) {
        self.stream
            .fill_u8(&self.signals, 0..self.signals.len_bytes(), 0)
            .unwrap();
        self.stream
            .fill_u8(&self.state, 0..self.state.len_bytes(), 0)
            .unwrap();
        self.stream.synchronize_within(WAIT).unwrap();
    }
}

/// What one launch of one candidate on every rank came to.
enum Outcome {
    Pass,
    Mismatch {
        rank: usize,
        index: usize,
        found: u16,
        expected: u16,
        wrong: usize,
    },
    Aborted {
        rank: usize,
        abort: Abort,
    },
    Dropped(String),
    Failed(String),
}

impl Outcome {
    fn passed(&self) -> bool {
        matches!(self, Outcome::Pass)
    }

    fn describe(&self) -> String {
        match self {
            Outcome::Pass => "pass".to_owned(),
            Outcome::Mismatch {
                rank,
                index,
                found,
                expected,
                wrong,
            } => format!(
                "FAIL rank {rank}: element {index} is {found:#06x}, the reference {expected:#06x} \
                 ({wrong} elements wrong)"
            ),
            Outcome::Aborted { rank, abort } => format!("FAIL rank {rank} aborted: {abort}"),
            Outcome::Dropped(reason) => format!("FAIL dropped: {reason}"),
            Outcome::Failed(error) => format!("FAIL {error}"),
        }
    }
}

struct Row {
    ladder: String,
    bucket: usize,
    bytes: u64,
    profile: String,
    kernel: String,
    geometry: String,
    outcome: Outcome,
}

/// The geometry a candidate launches with: the bucket's, or the profile's own block count in
/// an unclustered bucket.
fn candidate_geometry(bucket: &Bucket, profile: &Profile) -> Geometry {
    match (bucket.cluster_size, profile.blocks) {
        (None, Some(blocks)) => Geometry::new(blocks, bucket.threads).unwrap(),
        _ => Geometry::of_bucket(bucket).unwrap(),
    }
}

#[allow(clippy::too_many_arguments)]
fn launch_once(
    ranks: &[Rank],
    ladder: &Ladder,
    kernel_name: &str,
    geometry: Geometry,
    elements: usize,
    seed: u64,
) -> Outcome {
    let world = ranks.len();
    let inputs = random_inputs(seed, world, elements);
    let views: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
    let expected = reference_sum_bf16(&views);
    let bytes = elements * 2;
    for (rank, memory) in ranks.iter().enumerate() {
        memory.stream.write(&memory.buffer, 0, &inputs[rank]).unwrap();
        memory
            .stream
            .fill_u16(&memory.output, 0..bytes.next_multiple_of(2), POISON)
            .unwrap();
    }
    let scratch_offset = input_region_bytes(ladder);
    for (rank, memory) in ranks.iter().enumerate() {
        let mut params = AllReduceParams {
            buffers: [0; MAX_RANKS],
            signals: [0; MAX_RANKS],
            state: memory.state.address(),
            output: memory.output.address(),
            elements: elements as u64,
            scratch_offset,
            timeout_ns: SPIN_DEADLINE_NS,
            rank: rank as u32,
            world: world as u32,
        };
        for (peer, peer_memory) in ranks.iter().enumerate() {
            params.buffers[peer] = peer_memory.buffer.address();
            params.signals[peer] = peer_memory.signals.address();
        }
        let kernel = &memory.kernels[kernel_name];
        if let Err(error) = memory.stream.launch_loaded(kernel, geometry, &params) {
            // The ranks already launched wait for this one until their deadline.
            for launched in &ranks[..rank] {
                launched.stream.synchronize_within(WAIT).unwrap();
            }
            for memory in ranks {
                memory.reset_flags();
            }
            return Outcome::Failed(format!("rank {rank}: {error}"));
        }
    }
    for (rank, memory) in ranks.iter().enumerate() {
        if let Err(error) = memory.stream.synchronize_within(WAIT) {
            return Outcome::Failed(format!("rank {rank}: {error}"));
        }
    }
    for (rank, memory) in ranks.iter().enumerate() {
        let mut word = [0u64];
        memory.stream.read(&memory.state, 0, &mut word).unwrap();
        if let Some(abort) = Abort::decode(word[0]) {
            for memory in ranks {
                memory.reset_flags();
            }
            return Outcome::Aborted { rank, abort };
        }
    }
    for (rank, memory) in ranks.iter().enumerate() {
        let mut output = vec![0u16; elements];
        memory.stream.read(&memory.output, 0, &mut output).unwrap();
        let wrong: Vec<usize> = (0..elements)
            .filter(|&index| output[index] != expected[index])
            .collect();
        if let Some(&index) = wrong.first() {
            return Outcome::Mismatch {
                rank,
                index,
                found: output[index],
                expected: expected[index],
                wrong: wrong.len(),
            };
        }
    }
    Outcome::Pass
}

fn run_ladder(driver: Driver, devices: &[Device], file: &str, seed: &mut u64, rows: &mut Vec<Row>) {
    let path = ladder_path(file);
    let ladder = validate_ladder_file(&path)
        .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    assert_eq!(ladder.world_size as usize, devices.len(), "{file}");
    let description = driver.describe(0).unwrap().description().unwrap();
    if let Err(refusal) = check_package_fits(&ladder, &description) {
        panic!("{file} does not fit GPU 0: {refusal}");
    }
    let compilation = compile_ladder(&ladder, description.arch, &Silent)
        .unwrap_or_else(|error| panic!("compiling {file} for {}: {error}", description.arch));
    let cubins: Vec<(String, bool, Vec<u8>)> = compilation
        .kernels
        .iter()
        .map(|kernel| (kernel.name.clone(), kernel.cluster, kernel.cubin.clone()))
        .collect();
    let ranks: Vec<Rank> = devices
        .iter()
        .map(|device| Rank::new(device, &ladder, &cubins))
        .collect();

    for (index, bucket) in ladder.buckets.iter().enumerate() {
        for id in &bucket.candidates {
            let profile = ladder.profile(id).expect("validated candidates name profiles");
            let Some(spec) = kernel_for(profile, ladder.dtype) else {
                continue;
            };
            let geometry = candidate_geometry(bucket, profile);
            let largest = (bucket.max_bytes / 2) as usize;
            // Just under the largest, odd: a tail past the last whole vector on every rank.
            let odd = (largest - 3).max((ladder.bucket_min_bytes(index) / 2) as usize);
            for elements in [largest, odd] {
                *seed += 1;
                let kernel = &ranks[0].kernels[&spec.name];
                let outcome = match kernel
                    .resident_capacity(geometry)
                    .map(|capacity| check_candidate_residency(bucket, profile, capacity))
                {
                    Err(error) => Outcome::Failed(error.to_string()),
                    Ok(Err(reason)) => Outcome::Dropped(reason.to_string()),
                    Ok(Ok(())) => {
                        launch_once(&ranks, &ladder, &spec.name, geometry, elements, *seed)
                    }
                };
                rows.push(Row {
                    ladder: ladder.name.clone(),
                    bucket: index,
                    bytes: elements as u64 * 2,
                    profile: id.clone(),
                    kernel: spec.name.clone(),
                    geometry: geometry.to_string(),
                    outcome,
                });
            }
        }
    }
}

fn table(rows: &[Row]) -> String {
    let mut text = String::new();
    let _ = writeln!(
        text,
        "{:<26} {:>6} {:>9} {:<16} {:<30} {:<40} result",
        "ladder", "bucket", "bytes", "profile", "kernel", "geometry"
    );
    for row in rows {
        let _ = writeln!(
            text,
            "{:<26} {:>6} {:>9} {:<16} {:<30} {:<40} {}",
            row.ladder,
            row.bucket,
            row.bytes,
            row.profile,
            row.kernel,
            row.geometry,
            row.outcome.describe()
        );
    }
    text
}

#[test]
#[ignore = "needs GPUs"]
fn every_custom_candidate_of_the_h200_tp2_ladders_gives_the_reference_sum() {
    let Some((driver, devices)) = gpus(2) else {
        return;
    };
    let info = driver.describe(0).unwrap();
    if info.arch != Some(prepare::ladder::Arch::Sm90) {
        eprintln!("skipped: the H200 ladders target sm_90, GPU 0 is {}", info.arch_name());
        return;
    }
    for (device, peer) in [(0, 1), (1, 0)] {
        assert!(
            devices[device].can_access_peer(&devices[peer]).unwrap(),
            "GPU {device} cannot map GPU {peer}'s memory"
        );
        devices[device].enable_peer_access(&devices[peer]).unwrap();
    }
    let mut rows = Vec::new();
    let mut seed = 0x5eed_0000;
    for file in LADDERS {
        run_ladder(driver, &devices, file, &mut seed, &mut rows);
    }
    let table = table(&rows);
    eprintln!("{table}");
    let failures = rows.iter().filter(|row| !row.outcome.passed()).count();
    assert!(rows.len() > 0, "no custom candidates were launched");
    assert_eq!(failures, 0, "{failures} of {} launches failed:\n{table}", rows.len());
}
