//! Smoke test of the shipped H200 TP2 ladders on two GPUs in one process (peer access, no
//! IPC): every custom candidate of every bucket is compiled with NVRTC, launched once on both
//! GPUs at once at the bucket's largest size and at an odd size just under it, on fresh random
//! bf16 inputs, and each rank's output, poisoned before the launch, must equal the reference
//! sum byte for byte and stay poisoned past the message's end. It prints a table of kernel x
//! bucket x size with the first mismatch of every failure.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use prepare::collective::{geometry_for, resident_capacity};
use prepare::compile::{compile_kernels, compile_ladder};
use prepare::device::{check_candidate_residency, check_package_fits, DeviceDescription};
use prepare::gpu::abort::Abort;
use prepare::gpu::driver::{
    Device, DeviceBuffer, DeviceMemory, Driver, Geometry, LoadedKernel, ModuleImage, Stream,
};
use prepare::kernels::{
    input_region_bytes, kernels_for_ladder, peer_buffer_bytes, LaunchParams, SIGNAL_BYTES,
    STATE_WORDS,
};
use prepare::ladder::{validate_ladder_file, Bucket, Ladder, Profile};
use prepare::progress::Silent;
use prepare::reference::{random_bf16, reference_sum_bf16};
use rayon::prelude::*;

use super::support::{custom_candidates, ladder, require_gpus, H200_TP2_LADDERS};

/// Every spin's deadline in the kernels: long enough for any message here, short enough that a
/// missing peer fails the test in seconds.
const SPIN_DEADLINE_NS: u64 = 500_000_000;
/// How long the host waits for a launch before giving up on the run.
const WAIT: Duration = Duration::from_secs(30);
/// Written over every output before a launch; a NaN that the reference (canonical NaN 0x7FFF)
/// never produces, so an unwritten element always fails.
const POISON: u16 = 0xFFFF;
/// Elements past the message checked to be still poison: a kernel must not write past its
/// tail.
const GUARD_ELEMENTS: usize = 256;

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
                (
                    name.clone(),
                    module
                        .load(name, *cluster, prepare::abi::PARAMS_BYTES)
                        .unwrap(),
                )
            })
            .collect();
        let rank = Rank {
            buffer: device.allocate(peer_buffer_bytes(ladder) as usize).unwrap(),
            signals: device.allocate(SIGNAL_BYTES as usize).unwrap(),
            state: device.allocate(STATE_WORDS * 8).unwrap(),
            output: device
                .allocate(input_region_bytes(ladder) as usize + 2 * GUARD_ELEMENTS)
                .unwrap(),
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
    Overrun {
        rank: usize,
        index: usize,
        found: u16,
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
            Outcome::Overrun { rank, index, found } => format!(
                "FAIL rank {rank}: wrote {found:#06x} at element {index}, past the message's end"
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

/// Elements generated or summed per task: the largest buckets hold 32 Mi elements per rank.
const CHUNK: usize = 1 << 16;

/// One input per rank from the reference module's generator, each chunk from its own seed so
/// the work spreads over every core.
fn fresh_inputs(seed: u64, world: usize, elements: usize) -> Vec<Vec<u16>> {
    (0..world)
        .map(|rank| {
            let mut input = vec![0u16; elements];
            input
                .par_chunks_mut(CHUNK)
                .enumerate()
                .for_each(|(chunk, values)| {
                    let chunk_seed = seed
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                        .wrapping_add(((rank as u64) << 40) | chunk as u64);
                    values.copy_from_slice(&random_bf16(chunk_seed, values.len()));
                });
            input
        })
        .collect()
}

/// [`reference_sum_bf16`] over the inputs, chunk by chunk in parallel (it is element-wise).
fn reference(inputs: &[Vec<u16>]) -> Vec<u16> {
    let mut sum = vec![0u16; inputs[0].len()];
    sum.par_chunks_mut(CHUNK)
        .enumerate()
        .for_each(|(chunk, values)| {
            let start = chunk * CHUNK;
            let views: Vec<&[u16]> = inputs
                .iter()
                .map(|input| &input[start..start + values.len()])
                .collect();
            values.copy_from_slice(&reference_sum_bf16(&views));
        });
    sum
}

/// The geometry a candidate launches with: the bucket's, or the profile's own block count in
/// an unclustered bucket.
fn candidate_geometry(bucket: &Bucket, profile: &Profile) -> Geometry {
    geometry_for(bucket, profile).unwrap()
}

fn launch_once(
    ranks: &[Rank],
    ladder: &Ladder,
    kernel_name: &str,
    geometry: Geometry,
    elements: usize,
    seed: u64,
) -> Outcome {
    let world = ranks.len();
    let inputs = fresh_inputs(seed, world, elements);
    let expected = reference(&inputs);
    for (rank, memory) in ranks.iter().enumerate() {
        memory
            .stream
            .write(&memory.buffer, 0, &inputs[rank])
            .unwrap();
        memory
            .stream
            .fill_u16(&memory.output, 0..memory.output.len_bytes(), POISON)
            .unwrap();
    }
    let scratch_offset = input_region_bytes(ladder);
    for (rank, memory) in ranks.iter().enumerate() {
        let mut params = LaunchParams {
            state: memory.state.address(),
            output: memory.output.address(),
            input: memory.buffer.address(),
            scratch_offset,
            timeout_ns: SPIN_DEADLINE_NS,
            rank: rank as u32,
            world: world as u32,
            ..LaunchParams::all_reduce(elements as u64)
        };
        for (peer, peer_memory) in ranks.iter().enumerate() {
            params.buffers[peer] = peer_memory.buffer.address();
            params.signals[peer] = peer_memory.signals.address();
        }
        let kernel = &memory.kernels[kernel_name];
        if let Err(error) = memory
            .stream
            .launch_loaded(kernel, geometry, &params.to_bytes())
        {
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
        let guard = elements..elements + GUARD_ELEMENTS;
        let mut output = vec![0u16; guard.end];
        memory.stream.read(&memory.output, 0, &mut output).unwrap();
        if let Some(index) = guard.clone().find(|&index| output[index] != POISON) {
            return Outcome::Overrun {
                rank,
                index,
                found: output[index],
            };
        }
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

/// Compiles a ladder's kernels for sm_90. NVRTC runs before the driver is opened in this
/// process: once CUDA work has run here, its ptxas log has been seen to come back empty.
fn compile_for_sm90(
    file: &str,
    setup_failures: &mut Vec<String>,
) -> (Ladder, Vec<prepare::compile::CompiledKernel>) {
    let path = ladder(file);
    let ladder =
        validate_ladder_file(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let arch = prepare::ladder::Arch::Sm90;
    let compiled = match compile_ladder(&ladder, arch, &Silent) {
        Ok(compilation) => compilation.kernels,
        Err(error) => {
            // Recorded as a failure; the kernels are still checked, compiled one at a time.
            let failure = format!("{file}: compile_ladder for {arch}: {error}");
            eprintln!("FAIL {failure}");
            setup_failures.push(failure);
            kernels_for_ladder(&ladder)
                .into_iter()
                .flat_map(|spec| {
                    compile_kernels(&[spec], arch, &Silent)
                        .unwrap_or_else(|error| panic!("compiling alone: {error}"))
                        .kernels
                })
                .collect()
        }
    };
    (ladder, compiled)
}

fn run_ladder(
    driver: Driver,
    devices: &[Device],
    file: &str,
    (ladder, compiled): &(Ladder, Vec<prepare::compile::CompiledKernel>),
    seed: &mut u64,
    rows: &mut Vec<Row>,
) {
    assert_eq!(ladder.world_size as usize, devices.len(), "{file}");
    let info = driver.describe(0).unwrap();
    let description = DeviceDescription::of_gpu(
        0,
        &info.name,
        info.compute_capability,
        info.sm_count,
        info.cluster_launch,
    )
    .unwrap();
    if let Err(refusal) = check_package_fits(ladder, &description) {
        panic!("{file} does not fit GPU 0: {refusal}");
    }
    let cubins: Vec<(String, bool, Vec<u8>)> = compiled
        .iter()
        .map(|kernel| (kernel.name.clone(), kernel.cluster, kernel.cubin.clone()))
        .collect();
    let ranks: Vec<Rank> = devices
        .iter()
        .map(|device| Rank::new(device, ladder, &cubins))
        .collect();

    for (index, bucket, profile, spec) in custom_candidates(ladder) {
        let id = &profile.id;
        let geometry = candidate_geometry(bucket, profile);
        let largest = (bucket.max_bytes / 2) as usize;
        // Just under the largest, odd: a tail past the last whole vector on every rank.
        let odd = (largest - 3).max((ladder.bucket_min_bytes(index) / 2) as usize);
        for elements in [largest, odd] {
            *seed += 1;
            let kernel = &ranks[0].kernels[&spec.name];
            let outcome = match resident_capacity(kernel, geometry)
                .map(|capacity| check_candidate_residency(bucket, profile, capacity))
            {
                Err(error) => Outcome::Failed(error.to_string()),
                Ok(Err(reason)) => Outcome::Dropped(reason.to_string()),
                Ok(Ok(())) => launch_once(&ranks, ladder, &spec.name, geometry, elements, *seed),
            };
            let row = Row {
                ladder: ladder.name.clone(),
                bucket: index,
                bytes: elements as u64 * 2,
                profile: id.clone(),
                kernel: spec.name.clone(),
                geometry: geometry.to_string(),
                outcome,
            };
            // Each row as it happens, so a run cut short still shows what it reached.
            eprintln!("{}", row.line());
            rows.push(row);
        }
    }
}

fn header() -> String {
    format!(
        "{:<26} {:>6} {:>9} {:<16} {:<30} {:<40} result",
        "ladder", "bucket", "bytes", "profile", "kernel", "geometry"
    )
}

impl Row {
    fn line(&self) -> String {
        format!(
            "{:<26} {:>6} {:>9} {:<16} {:<30} {:<40} {}",
            self.ladder,
            self.bucket,
            self.bytes,
            self.profile,
            self.kernel,
            self.geometry,
            self.outcome.describe()
        )
    }
}

/// Passes per ladder and kernel, then every failure's row.
fn summary(rows: &[Row]) -> String {
    let mut counts: BTreeMap<(&str, &str), (usize, usize)> = BTreeMap::new();
    for row in rows {
        let count = counts.entry((&row.ladder, &row.kernel)).or_default();
        count.0 += usize::from(row.outcome.passed());
        count.1 += 1;
    }
    let mut text = String::new();
    for ((ladder, kernel), (passed, total)) in counts {
        let _ = writeln!(text, "{ladder:<26} {kernel:<30} {passed}/{total} passed");
    }
    let failures: Vec<String> = rows
        .iter()
        .filter(|row| !row.outcome.passed())
        .map(Row::line)
        .collect();
    if !failures.is_empty() {
        let _ = writeln!(text, "failures:\n{}\n{}", header(), failures.join("\n"));
    }
    text
}

#[test]
#[ignore = "needs GPUs"]
fn every_custom_candidate_of_the_h200_tp2_ladders_gives_the_reference_sum() {
    let mut setup_failures = Vec::new();
    let compiled: Vec<_> = H200_TP2_LADDERS
        .iter()
        .map(|file| compile_for_sm90(file, &mut setup_failures))
        .collect();
    let (driver, devices) = require_gpus!(2);
    let info = driver.describe(0).unwrap();
    if info.compute_capability != (9, 0) {
        eprintln!(
            "skipped: the H200 ladders target sm_90, GPU 0 is {}",
            info.arch_name()
        );
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
    eprintln!("{}", header());
    for (file, ladder) in H200_TP2_LADDERS.iter().zip(&compiled) {
        run_ladder(driver, &devices, file, ladder, &mut seed, &mut rows);
    }
    let summary = summary(&rows);
    eprintln!("\n{summary}");
    for failure in &setup_failures {
        eprintln!("FAIL {failure}");
    }
    let failures = rows.iter().filter(|row| !row.outcome.passed()).count();
    assert!(!rows.is_empty(), "no custom candidates were launched");
    assert!(
        failures == 0 && setup_failures.is_empty(),
        "{failures} of {} launches failed; {} ladder(s) failed to compile as a whole",
        rows.len(),
        setup_failures.len()
    );
}
