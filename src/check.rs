//! `prepare check`'s work on one rank: the runtime comes up, NCCL's all-reduce is compared with
//! the reference sum, and with a package every custom candidate of every bucket runs once at
//! the bucket's largest size on fresh random data and must give the reference's exact bytes. An
//! optional soak repeats collectives so that faults (a peer killed or stopped) can be seen to
//! end every other rank within the timeout.

use crate::agree::Topology;
use crate::device::{check_candidate_residency, DropReason};
use crate::gpu::abort::Abort;
use crate::gpu::driver::{DeviceBuffer, DeviceMemory, Geometry, LoadedKernel, ModuleImage};
use crate::gpu::nccl::Communicator;
use crate::kernels;
use crate::ladder::{Bucket, Profile};
use crate::package::Package;
use crate::reference::{random_inputs, reference_sum_bf16};
use crate::runtime::{PeerMemory, Runtime, RuntimeError};

/// Elements of the NCCL check: 512 KiB and an odd tail.
const NCCL_CHECK_ELEMENTS: usize = 262_147;
/// Output poison: a NaN payload no sum produces (the kernels write 0x7FFF for NaN).
const POISON: u16 = 0x7FA5;
/// Operations per soak chunk, each chunk bounded by the timeout.
const SOAK_CHUNK: u32 = 64;

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// The runtime failed (driver, NCCL, a timeout naming the rank).
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    /// The package does not fit this GPU.
    #[error("rank {rank}: the package is for {package}, this GPU is {device}")]
    WrongArchitecture {
        /// This rank.
        rank: u32,
        /// The package's architecture.
        package: String,
        /// The GPU's.
        device: String,
    },
    /// A kernel gave up waiting for a peer.
    #[error("rank {rank}: {what}: {abort}")]
    Aborted {
        /// This rank.
        rank: u32,
        /// The kernel and bucket.
        what: String,
        /// The decoded abort word.
        abort: Abort,
    },
    /// A custom candidate's output differs from the reference.
    #[error("rank {rank}: {what} is not exact: {mismatches} of {elements} elements differ, the first at {first} (got {got:#06x}, expected {expected:#06x})")]
    NotExact {
        /// This rank.
        rank: u32,
        /// The kernel and bucket.
        what: String,
        /// Differing elements.
        mismatches: usize,
        /// Elements compared.
        elements: usize,
        /// First differing index.
        first: usize,
        /// What the kernel wrote there.
        got: u16,
        /// What the reference says.
        expected: u16,
    },
    /// A kernel wrote past the end of its message.
    #[error("rank {rank}: {what} wrote element {index}, past the end of the message")]
    WrotePastTheEnd {
        /// This rank.
        rank: u32,
        /// The kernel and bucket.
        what: String,
        /// The first element written past the end.
        index: usize,
    },
    /// A kernel changed its input.
    #[error("rank {rank}: {what} changed its input")]
    InputChanged {
        /// This rank.
        rank: u32,
        /// The kernel and bucket.
        what: String,
    },
}

/// One candidate's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateCheck {
    /// Bucket index.
    pub bucket: usize,
    /// Profile id.
    pub profile: String,
    /// Elements summed.
    pub elements: usize,
    /// `None` when it ran and was exact, or why it did not run.
    pub skipped: Option<DropReason>,
}

/// What a rank's check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// Whether NCCL's sum equalled the reference.
    pub nccl_exact: bool,
    /// Every custom candidate checked, in ladder order.
    pub candidates: Vec<CandidateCheck>,
    /// Soak operations completed.
    pub soaked: u32,
}

fn first_mismatch(got: &[u16], expected: &[u16]) -> Option<(usize, usize)> {
    let mut mismatches = got
        .iter()
        .zip(expected)
        .enumerate()
        .filter(|(_, (a, b))| a != b);
    let (first, _) = mismatches.next()?;
    Some((first, 1 + mismatches.count()))
}

/// A seed every rank shares: rank 0's clock, gathered.
fn shared_seed(runtime: &Runtime) -> Result<u64, RuntimeError> {
    let mine = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
        ^ u64::from(runtime.rank()).rotate_left(32);
    let gathered = runtime.all_gather(&mine.to_le_bytes(), "the seed all-gather")?;
    let mut first = [0; 8];
    first.copy_from_slice(&gathered[..8]);
    Ok(u64::from_le_bytes(first))
}

/// Runs NCCL's all-reduce on every rank's random input and compares with the reference.
fn check_nccl(
    runtime: &Runtime,
    communicator: &Communicator,
    seed: u64,
) -> Result<bool, RuntimeError> {
    let rank = runtime.rank();
    let driver = |source| RuntimeError::Driver { rank, source };
    let inputs = random_inputs(seed, runtime.world() as usize, NCCL_CHECK_ELEMENTS);
    let buffer = runtime
        .device()
        .allocate(NCCL_CHECK_ELEMENTS * 2)
        .map_err(driver)?;
    runtime
        .stream()
        .write(&buffer, 0, &inputs[rank as usize])
        .map_err(|source| RuntimeError::Driver { rank, source })?;
    nccl_bounded(
        runtime,
        communicator,
        &buffer,
        NCCL_CHECK_ELEMENTS,
        1,
        "the NCCL all-reduce check",
    )?;
    let mut output = vec![0_u16; NCCL_CHECK_ELEMENTS];
    runtime
        .stream()
        .read(&buffer, 0, &mut output)
        .map_err(|source| RuntimeError::Driver { rank, source })?;
    let views: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
    Ok(output == reference_sum_bf16(&views))
}

/// `count` in-place NCCL all-reduces, bounded by the timeout: past it the communicator is
/// aborted and the step names the missing rank where it can be known.
fn nccl_bounded(
    runtime: &Runtime,
    communicator: &Communicator,
    buffer: &DeviceBuffer,
    elements: usize,
    count: u32,
    step: &str,
) -> Result<(), RuntimeError> {
    runtime.bounded(communicator, runtime.stream(), step, || {
        for _ in 0..count {
            communicator.all_reduce_bf16(runtime.stream(), buffer, buffer, elements)?;
        }
        Ok(())
    })
}

/// Replays of the captured NCCL all-reduce.
const GRAPH_REPLAYS: usize = 3;

/// Captures NCCL's all-reduce (out of place, so every replay recomputes the same sum) in a
/// graph on a stream of its own, replays it, and compares every replay with the reference.
fn check_nccl_graph(runtime: &Runtime, seed: u64) -> Result<bool, RuntimeError> {
    let rank = runtime.rank();
    let driver = |source| RuntimeError::Driver { rank, source };
    let inputs = random_inputs(seed, runtime.world() as usize, NCCL_CHECK_ELEMENTS);
    let views: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
    let expected = reference_sum_bf16(&views);
    let device = runtime.device();
    let send = device.allocate(NCCL_CHECK_ELEMENTS * 2).map_err(driver)?;
    let receive = device.allocate(NCCL_CHECK_ELEMENTS * 2).map_err(driver)?;
    let mut stream = device.new_stream().map_err(driver)?;
    stream
        .write(&send, 0, &inputs[rank as usize])
        .map_err(driver)?;
    let graph = stream.capture(|capture| {
        capture.nccl_all_reduce_bf16(runtime.communicator(), &send, &receive, NCCL_CHECK_ELEMENTS)
    })?;
    let mut exact = true;
    for _ in 0..GRAPH_REPLAYS {
        stream
            .fill_u16(&receive, 0..NCCL_CHECK_ELEMENTS * 2, POISON)
            .map_err(driver)?;
        runtime.bounded(
            runtime.communicator(),
            &stream,
            "a replay of the captured NCCL all-reduce",
            || graph.launch().map_err(driver),
        )?;
        let mut output = vec![0_u16; NCCL_CHECK_ELEMENTS];
        stream.read(&receive, 0, &mut output).map_err(driver)?;
        exact &= output == expected;
    }
    Ok(exact)
}

/// A candidate ready to launch.
struct Prepared<'a> {
    bucket_index: usize,
    bucket: &'a Bucket,
    profile: &'a Profile,
    kernel: LoadedKernel,
    geometry: Geometry,
}

fn geometry_for(
    bucket: &Bucket,
    profile: &Profile,
) -> Result<Geometry, crate::gpu::driver::DriverError> {
    match profile.blocks {
        Some(blocks) => Geometry::new(blocks, bucket.threads),
        None => Geometry::of_bucket(bucket),
    }
}

/// Which collective the soak repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoakCollective {
    /// NCCL's all-reduce.
    Nccl,
    /// The first custom candidate that was checked.
    Custom,
}

/// Checks a rank; `log` receives progress lines. `soak` operations of `soak_collective`
/// follow the checks.
pub fn check_rank(
    runtime: &Runtime,
    package: Option<&Package>,
    soak: u32,
    soak_collective: SoakCollective,
    log: &dyn Fn(String),
) -> Result<CheckReport, CheckError> {
    let rank = runtime.rank();
    let driver = move |source| CheckError::Runtime(RuntimeError::Driver { rank, source });
    let seed = shared_seed(runtime)?;
    let verdict = |exact: bool| {
        if exact {
            "equals the reference sum"
        } else {
            "differs from the reference sum (NCCL sums in its own order)"
        }
    };
    let nccl_exact = check_nccl(runtime, runtime.communicator(), seed)?;
    log(format!(
        "NCCL all-reduce of {NCCL_CHECK_ELEMENTS} bf16 elements: {}",
        verdict(nccl_exact)
    ));
    let graph_exact = check_nccl_graph(runtime, seed.rotate_left(17))?;
    log(format!(
        "NCCL all-reduce captured in a graph, {GRAPH_REPLAYS} replays: {}",
        verdict(graph_exact)
    ));
    if let Some(package) = package {
        // Profiles with communicator settings each run on their own split, made in ladder
        // order on every rank.
        for profile in package.ladder().profiles.iter().filter(|profile| {
            profile.is_nccl() && (profile.max_ctas.is_some() || profile.min_ctas.is_some())
        }) {
            let split = runtime.split_nccl(profile.max_ctas, profile.min_ctas)?;
            let exact = check_nccl(runtime, &split, seed.rotate_left(29))?;
            log(format!(
                "NCCL profile {} (max_ctas {:?}, min_ctas {:?}) on its own communicator: {}",
                profile.id,
                profile.max_ctas,
                profile.min_ctas,
                verdict(exact)
            ));
        }
    }

    let mut candidates = Vec::new();
    let mut memory: Option<(PeerMemory, DeviceBuffer)> = None;
    let mut prepared: Vec<Prepared<'_>> = Vec::new();
    if let Some(package) = package {
        let ladder = package.ladder();
        let peer_reason = match runtime.topology() {
            Topology::PeerKernels => None,
            Topology::NcclOnly { reason } => Some(reason.clone()),
        };
        let info = crate::gpu::driver::Driver::open()
            .and_then(|driver| driver.describe(runtime.device().ordinal()))
            .map_err(driver)?;
        if info.arch != Some(package.arch()) {
            return Err(CheckError::WrongArchitecture {
                rank,
                package: package.arch().to_string(),
                device: info.arch_name(),
            });
        }
        if let Some(reason) = peer_reason {
            log(format!("custom kernels are not checked: {reason}"));
        } else {
            let buffer_bytes = kernels::peer_buffer_bytes(ladder) as usize;
            let scratch_offset = kernels::input_region_bytes(ladder) as usize;
            let peer = runtime.map_peer_memory(buffer_bytes, scratch_offset)?;
            let output = runtime
                .device()
                .allocate(scratch_offset.max(2))
                .map_err(driver)?;
            memory = Some((peer, output));
            let mut modules = Vec::new();
            for (record, cubin) in package.kernels() {
                let module = runtime
                    .device()
                    .load_module(ModuleImage::Cubin(cubin))
                    .map_err(driver)?;
                modules.push((record.name.clone(), module));
            }
            for (bucket_index, bucket) in ladder.buckets.iter().enumerate() {
                for id in &bucket.candidates {
                    let Some(profile) = ladder.profile(id) else {
                        continue;
                    };
                    let Some(spec) = kernels::kernel_for(profile, ladder.dtype) else {
                        continue;
                    };
                    let (_, module) = modules
                        .iter()
                        .find(|(name, _)| *name == spec.name)
                        .expect("a verified package holds every kernel its ladder needs");
                    let kernel = module.load(&spec.name, spec.cluster).map_err(driver)?;
                    let geometry = geometry_for(bucket, profile).map_err(driver)?;
                    let resident = kernel.resident_capacity(geometry).map_err(driver)?;
                    if let Err(reason) = check_candidate_residency(bucket, profile, resident) {
                        candidates.push(CandidateCheck {
                            bucket: bucket_index,
                            profile: profile.id.clone(),
                            elements: (bucket.max_bytes / 2) as usize,
                            skipped: Some(reason),
                        });
                        continue;
                    }
                    prepared.push(Prepared {
                        bucket_index,
                        bucket,
                        profile,
                        kernel,
                        geometry,
                    });
                }
            }
        }
    }

    if let Some((peer, output)) = &memory {
        let ladder = package
            .map(Package::ladder)
            .expect("peer memory comes with a package");
        let capacity = output.len_bytes() / 2;
        for (index, candidate) in prepared.iter().enumerate() {
            let largest = (candidate.bucket.max_bytes / 2) as usize;
            let smallest = (ladder.bucket_min_bytes(candidate.bucket_index) / 2) as usize;
            // The bucket's smallest and largest messages, and one whose tail is not a whole
            // 16-byte vector.
            let mut sizes = vec![smallest, largest.saturating_sub(3).max(smallest), largest];
            sizes.dedup();
            for (size_index, &elements) in sizes.iter().enumerate() {
                let what = format!(
                    "{} in bucket {} ({elements} elements)",
                    candidate.profile.id, candidate.bucket_index
                );
                let inputs = random_inputs(
                    seed ^ ((index * 3 + size_index) as u64 + 1)
                        .wrapping_mul(0x9E37_79B9_7F4A_7C15),
                    runtime.world() as usize,
                    elements,
                );
                let stream = runtime.stream();
                stream
                    .write(peer.buffer(), 0, &inputs[rank as usize])
                    .map_err(driver)?;
                // The whole output is poisoned, so a write past the message shows too.
                stream
                    .fill_u16(output, 0..capacity * 2, POISON)
                    .map_err(driver)?;
                // No barrier here: a peer's block reaching the kernel's start barrier means its
                // launch began, after its input was written in stream order.
                let params = peer.params(output, elements as u64, runtime.timeout());
                stream
                    .launch_loaded(&candidate.kernel, candidate.geometry, &params)
                    .map_err(driver)?;
                stream
                    .synchronize_within(runtime.timeout() * 2)
                    .map_err(driver)?;
                let mut word = [0_u64; 1];
                stream.read(peer.state(), 0, &mut word).map_err(driver)?;
                if let Some(abort) = Abort::decode(word[0]) {
                    return Err(CheckError::Aborted { rank, what, abort });
                }
                // The message and what follows it, up to 4096 elements.
                let mut got = vec![0_u16; capacity.min(elements + 4096)];
                stream.read(output, 0, &mut got).map_err(driver)?;
                if let Some(past) = got[elements..].iter().position(|&value| value != POISON) {
                    return Err(CheckError::WrotePastTheEnd {
                        rank,
                        what,
                        index: elements + past,
                    });
                }
                got.truncate(elements);
                let views: Vec<&[u16]> = inputs.iter().map(Vec::as_slice).collect();
                let expected = reference_sum_bf16(&views);
                if let Some((first, mismatches)) = first_mismatch(&got, &expected) {
                    return Err(CheckError::NotExact {
                        rank,
                        what,
                        mismatches,
                        elements,
                        first,
                        got: got[first],
                        expected: expected[first],
                    });
                }
                let mut input_after = vec![0_u16; elements];
                stream
                    .read(peer.buffer(), 0, &mut input_after)
                    .map_err(driver)?;
                if input_after != inputs[rank as usize] {
                    return Err(CheckError::InputChanged { rank, what });
                }
            }
            candidates.push(CandidateCheck {
                bucket: candidate.bucket_index,
                profile: candidate.profile.id.clone(),
                elements: largest,
                skipped: None,
            });
        }
        candidates.sort_by_key(|candidate| candidate.bucket);
        log(format!(
            "custom candidates: {} exact, {} not resident",
            candidates
                .iter()
                .filter(|candidate| candidate.skipped.is_none())
                .count(),
            candidates
                .iter()
                .filter(|candidate| candidate.skipped.is_some())
                .count()
        ));
    }

    let mut soaked = 0;
    if soak > 0 {
        let soak_elements = 1 << 19;
        let buffer = runtime
            .device()
            .allocate(soak_elements * 2)
            .map_err(driver)?;
        runtime
            .stream()
            .fill_u16(&buffer, 0..soak_elements * 2, 0x3F80)
            .map_err(driver)?;
        let custom = match (soak_collective, &memory, prepared.first()) {
            (SoakCollective::Custom, Some((peer, output)), Some(candidate)) => {
                Some((peer, output, candidate))
            }
            (SoakCollective::Custom, _, _) => {
                return Err(CheckError::Runtime(RuntimeError::Setup {
                    rank,
                    message: "a custom soak needs a package and peer kernels".to_owned(),
                }))
            }
            (SoakCollective::Nccl, _, _) => None,
        };
        log(format!("soak: {soak} operations"));
        while soaked < soak {
            let chunk = SOAK_CHUNK.min(soak - soaked);
            if let Some((peer, output, candidate)) = custom {
                let elements = (candidate.bucket.max_bytes / 2) as usize;
                let params = peer.params(output, elements as u64, runtime.timeout());
                for _ in 0..chunk {
                    runtime
                        .stream()
                        .launch_loaded(&candidate.kernel, candidate.geometry, &params)
                        .map_err(driver)?;
                }
                runtime
                    .stream()
                    .synchronize_within(runtime.timeout() * 2)
                    .map_err(driver)?;
                let mut word = [0_u64; 1];
                runtime
                    .stream()
                    .read(peer.state(), 0, &mut word)
                    .map_err(driver)?;
                if let Some(abort) = Abort::decode(word[0]) {
                    return Err(CheckError::Aborted {
                        rank,
                        what: format!("{} in the soak", candidate.profile.id),
                        abort,
                    });
                }
            } else {
                nccl_bounded(
                    runtime,
                    runtime.communicator(),
                    &buffer,
                    soak_elements,
                    chunk,
                    "an NCCL all-reduce of the soak",
                )?;
            }
            soaked += chunk;
        }
        log(format!("soak: {soaked} operations done"));
    }
    Ok(CheckReport {
        nccl_exact,
        candidates,
        soaked,
    })
}
