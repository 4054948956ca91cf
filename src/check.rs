//! `prepare check`'s work on one rank: the runtime comes up, NCCL's all-reduce is compared with
//! the reference sum, directly and in a graph, and with a package every candidate is qualified
//! in CUDA graphs (see [`crate::qualify`]); every custom candidate must give the reference's
//! exact bytes. An optional soak repeats collectives so that faults (a peer killed or stopped) can be seen to
//! end every other rank within the timeout.

mod epilogue;
mod error;

pub use error::CheckError;

use crate::collective::{Collectives, Operands};
use crate::device::DropReason;
use crate::gpu::driver::{CallerMemory, DeviceBuffer};
use crate::gpu::nccl::Communicator;
use crate::ladder::Collective;
use crate::package::{Outcome, Package};
use crate::qualify::{mismatch, qualify, shared_seed, QualifyOptions, SequenceReport, POISON};
use crate::reference::{
    random_inputs, random_rank_inputs, reference_outputs, reference_sum, reference_sum_bf16,
};
use crate::runtime::{Runtime, RuntimeError};
use crate::shape::Shape;

/// Elements of the NCCL check: 512 KiB and an odd tail.
const NCCL_CHECK_ELEMENTS: usize = 262_147;
/// Operations per soak chunk, each chunk bounded by the timeout.
const SOAK_CHUNK: u32 = 64;

/// One candidate's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CandidateCheck {
    /// Bucket index.
    pub bucket: usize,
    /// Profile id.
    pub profile: String,
    /// Qualified (exact or, for NCCL, whether it matched), or why it could not run here.
    pub outcome: Outcome,
}

/// What a rank's check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// Whether NCCL's sum equalled the reference.
    pub nccl_exact: bool,
    /// Every candidate, in ladder order.
    pub candidates: Vec<CandidateCheck>,
    /// The multi-size graph sequence, when it ran.
    pub sequence: Option<SequenceReport>,
    /// Soak operations completed.
    pub soaked: u32,
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
    let graph = stream.capture(|stream| {
        runtime
            .communicator()
            .all_reduce_bf16(stream, &send, &receive, NCCL_CHECK_ELEMENTS)
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

/// Which collective the soak repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SoakCollective {
    /// NCCL's all-reduce.
    Nccl,
    /// The first custom candidate that was checked.
    Custom,
}

/// A message above the ladder in pieces ([`Collectives::enqueue_chunked`]) through every custom
/// candidate of the largest bucket that qualified, out of place and in place, each compared
/// with the reference sum on fresh random data: twice the bucket's largest message and three
/// elements, so the last piece is short.
fn check_pieces(
    runtime: &Runtime,
    collectives: &Collectives,
    package: &Package,
    seed: u64,
    log: &dyn Fn(String),
) -> Result<(), CheckError> {
    let rank = runtime.rank();
    let driver = move |source| CheckError::Runtime(RuntimeError::Driver { rank, source });
    let ladder = package.ladder();
    let Some(last) = ladder.buckets.len().checked_sub(1) else {
        return Ok(());
    };
    let live = collectives.live_custom_entries(last);
    if live.is_empty() {
        return Ok(());
    }
    if collectives.has_rows() {
        return check_row_pieces(runtime, collectives, &live, seed, log);
    }
    if collectives.collective() == Collective::AllReduceAddRmsNorm {
        return epilogue::check_epilogue_pieces(runtime, collectives, &live, seed, log);
    }
    let dtype = ladder.dtype;
    let elements = 2 * collectives.piece_elements() + 3;
    let bytes = elements * dtype.size_bytes() as usize;
    let inputs = random_rank_inputs(dtype, seed, runtime.world() as usize, elements);
    let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let expected = reference_sum(dtype, &views);
    let input = runtime.device().allocate(bytes).map_err(driver)?;
    let output = runtime.device().allocate(bytes).map_err(driver)?;
    let stream = runtime.stream();
    let mut result = vec![0_u8; bytes];
    for id in live {
        let entry = &collectives.entries()[id];
        for in_place in [false, true] {
            stream
                .write(&input, 0, &inputs[rank as usize])
                .map_err(driver)?;
            let target = if in_place { &input } else { &output };
            let operands = Operands {
                input: CallerMemory::whole(&input),
                output: CallerMemory::whole(target),
            };
            let step = format!("{} in pieces", entry.profile);
            collectives.run_bounded(runtime, stream, id, &step, || {
                collectives.enqueue_chunked(runtime, stream, elements, operands, |_| id)
            })?;
            stream.read(target, 0, &mut result).map_err(driver)?;
            if let Some(message) = mismatch(
                rank,
                dtype,
                &result,
                &expected,
                Collective::AllReduce.reference(),
            ) {
                return Err(CheckError::NotExact {
                    rank,
                    what: format!(
                        "{} in pieces ({})",
                        entry.profile,
                        if in_place { "in place" } else { "out of place" }
                    ),
                    message,
                });
            }
        }
        log(format!(
            "{} in pieces, {elements} elements out of place and in place: equals the reference sum",
            entry.profile
        ));
    }
    Ok(())
}

/// A reduce-scatter or all-gather above the ladder in pieces
/// ([`Collectives::enqueue_rows_in_pieces`]) through each of `live`, out of place and in place,
/// each rank's output compared with the reference on fresh random data: rows of the width
/// start-up times pieces at (`crate::pieces::timing_shape`), two pieces' worth and three rows
/// more, so the rows do not divide among the ranks and the last piece is short.
fn check_row_pieces(
    runtime: &Runtime,
    collectives: &Collectives,
    live: &[crate::collective::EntryId],
    seed: u64,
    log: &dyn Fn(String),
) -> Result<(), CheckError> {
    let (rank, world) = (runtime.rank(), runtime.world());
    let driver = move |source| CheckError::Runtime(RuntimeError::Driver { rank, source });
    let dtype = collectives.dtype();
    let piece = collectives.piece_elements() as u64;
    let width = crate::pieces::timing_shape(piece, piece, world).width();
    let shape = Shape::new(2 * (piece / width) + 3, width).map_err(|source| {
        CheckError::Runtime(RuntimeError::Operands {
            rank,
            source: source.into(),
        })
    })?;
    let message = collectives.row_message(world, shape)?;
    let elements = shape.elements() as usize;
    let whole = random_rank_inputs(dtype, seed, world as usize, elements);
    let own = message.owned_bytes(rank);
    let own = own.start as usize..own.end as usize;
    let inputs: Vec<Vec<u8>> = match message.collective() {
        Collective::ReduceScatter => whole,
        _ => (0..world)
            .map(|peer| {
                let bytes = message.owned_bytes(peer);
                whole[peer as usize][bytes.start as usize..bytes.end as usize].to_vec()
            })
            .collect(),
    };
    let views: Vec<&[u8]> = inputs.iter().map(Vec::as_slice).collect();
    let expected =
        reference_outputs(message.collective(), dtype, shape, &views).map_err(|error| {
            CheckError::NotExact {
                rank,
                what: "the reference of a message in pieces".to_owned(),
                message: error.to_string(),
            }
        })?;
    let bytes = message.message_bytes() as usize;
    let device = runtime.device();
    let whole_buffer = device.allocate(bytes.max(16)).map_err(driver)?;
    let own_buffer = device.allocate(own.len().max(16)).map_err(driver)?;
    let staging = device
        .allocate((piece * dtype.size_bytes()) as usize)
        .map_err(driver)?;
    let stream = runtime.stream();
    let scatter = message.collective() == Collective::ReduceScatter;
    let mut result = vec![0_u8; message.output_bytes() as usize];
    for &id in live {
        let profile = &collectives.entries()[id].profile;
        for in_place in [false, true] {
            let whole_memory = CallerMemory::whole(&whole_buffer);
            let own_memory = if in_place {
                CallerMemory::prefix(&whole_memory.offset(own.start as u64), own.len() as u64)
            } else {
                CallerMemory::prefix(&own_buffer, own.len() as u64)
            };
            let (input, output) = if scatter {
                (whole_memory, own_memory)
            } else {
                (own_memory, whole_memory)
            };
            stream
                .write(&input, 0, &inputs[rank as usize])
                .map_err(driver)?;
            let step = format!("{profile} in pieces");
            collectives.run_bounded(runtime, stream, id, &step, || {
                collectives.enqueue_rows_in_pieces(
                    runtime,
                    stream,
                    &message,
                    Operands { input, output },
                    CallerMemory::whole(&staging),
                    |_| id,
                )
            })?;
            stream.read(&output, 0, &mut result).map_err(driver)?;
            if let Some(found) = mismatch(
                rank,
                dtype,
                &result,
                &expected[rank as usize],
                message.collective().reference(),
            ) {
                return Err(CheckError::NotExact {
                    rank,
                    what: format!(
                        "{profile} in pieces ({})",
                        if in_place { "in place" } else { "out of place" }
                    ),
                    message: found,
                });
            }
        }
        log(format!(
            "{profile} in pieces, {} x {width} {} out of place and in place: equals the reference",
            shape.rows(),
            message.collective()
        ));
    }
    Ok(())
}

/// Checks a rank; `log` receives progress lines. With a package every candidate is qualified
/// (see [`crate::qualify`]) and every custom candidate must be exact; `soak` operations of
/// `soak_collective` follow the checks.
pub fn check_rank(
    runtime: &Runtime,
    package: Option<&Package>,
    options: QualifyOptions,
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

    let mut candidates = Vec::new();
    let mut collectives = None;
    let mut sequence = None;
    if let Some(package) = package {
        let mut loaded = Collectives::new(runtime, package)?;
        let report = qualify(runtime, &mut loaded, package.ladder(), options, log)?;
        for (entry, outcome) in loaded.entries().iter().zip(&report.outcomes) {
            match outcome {
                Outcome::Dropped(DropReason::NotExact { message }) => {
                    return Err(CheckError::NotExact {
                        rank,
                        what: format!("{} in bucket {}", entry.profile, entry.bucket),
                        message: message.clone(),
                    })
                }
                Outcome::Dropped(DropReason::CaptureFailed { message }) => {
                    return Err(CheckError::CaptureFailed {
                        rank,
                        what: format!("{} in bucket {}", entry.profile, entry.bucket),
                        message: message.clone(),
                    })
                }
                _ => {}
            }
            candidates.push(CandidateCheck {
                bucket: entry.bucket,
                profile: entry.profile.clone(),
                outcome: outcome.clone(),
            });
        }
        if let Some(report) = &report.sequence {
            if report.used_before != report.used_after {
                return Err(CheckError::MemoryChanged {
                    rank,
                    before: report.used_before,
                    after: report.used_after,
                });
            }
        }
        sequence = report.sequence;
        check_pieces(runtime, &loaded, package, seed.rotate_left(29), log)?;
        collectives = Some(loaded);
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
        let custom = match (soak_collective, &collectives) {
            (SoakCollective::Custom, Some(collectives)) => {
                let first = collectives
                    .entries()
                    .iter()
                    .position(|entry| !entry.nccl && entry.dropped.is_none());
                match first {
                    Some(id) => Some((collectives, id)),
                    None => {
                        return Err(CheckError::Runtime(RuntimeError::Setup {
                            rank,
                            message: "a custom soak needs a custom candidate that qualified"
                                .to_owned(),
                        }))
                    }
                }
            }
            (SoakCollective::Custom, None) => {
                return Err(CheckError::Runtime(RuntimeError::Setup {
                    rank,
                    message: "a custom soak needs a package and peer kernels".to_owned(),
                }))
            }
            (SoakCollective::Nccl, _) => None,
        };
        log(format!("soak: {soak} operations"));
        while soaked < soak {
            let chunk = SOAK_CHUNK.min(soak - soaked);
            if let Some((collectives, id)) = custom {
                let entry = &collectives.entries()[id];
                let elements = (package
                    .expect("a custom soak has a package")
                    .ladder()
                    .buckets[entry.bucket]
                    .max_bytes
                    / 2) as usize;
                let step = format!("{} in the soak", entry.profile);
                collectives.run_bounded(runtime, runtime.stream(), id, &step, || {
                    for _ in 0..chunk {
                        collectives.enqueue(runtime, runtime.stream(), id, elements)?;
                    }
                    Ok(())
                })?;
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
        sequence,
        soaked,
    })
}
