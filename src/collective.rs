//! A package's candidates made ready on one rank: every kernel loaded, peer memory mapped, the
//! NCCL profiles' communicators split, and every (bucket, candidate) pair an [`Entry`] that can
//! be enqueued or captured in a graph at any message size its bucket covers. Qualification,
//! timing and the serving handle all launch through this one place, so what is checked is what
//! is timed and what is served.
//!
//! Creating it is collective (splits, IPC mapping, and an agreement on which entries every rank
//! can run): every rank creates it for the same package at the same point.

use std::time::Duration;

use crate::agree::Topology;
use crate::device::{check_candidate_residency, DropReason};
use crate::gpu::abort::Abort;
use crate::gpu::driver::{
    CallerMemory, DeviceBuffer, DeviceMemory, Event, Geometry, Graph, LoadedKernel, ModuleImage,
    Stream,
};
use crate::gpu::nccl::{Communicator, NcclDataType};
use crate::kernels::{self, InputAccess};
use crate::ladder::{Bucket, Dtype, Ladder, Profile};
use crate::package::Package;
use crate::runtime::{PeerMemory, Runtime, RuntimeError};

/// Bytes of one gathered drop reason (JSON, cut to fit).
const REASON_SLOT_BYTES: usize = 1024;

/// A copy-engine launch moves the message in chunks of at least this many bytes, so the sum
/// of one chunk runs while the next is copied. On 2x H200 a 64 MiB message took 243 us in
/// chunks of 16 MiB, 265 us in chunks of 4 MiB (docs/kernel-notes.md).
pub const COPY_ENGINE_CHUNK_BYTES: u64 = 16 << 20;

/// At most this many chunks per copy-engine launch (larger messages take larger chunks).
const COPY_ENGINE_MAX_CHUNKS: u64 = 64;

/// How an entry launches.
#[derive(Debug)]
enum Launch {
    /// A custom kernel with its geometry.
    Custom {
        kernel: LoadedKernel,
        geometry: Geometry,
        /// Where the kernel's scratch starts in every rank's buffer.
        scratch_offset: u64,
        /// How it reads this rank's message.
        input: InputAccess,
    },
    /// Copies by the copy engines between two barrier kernels, summed chunk by chunk
    /// (kernels/all_reduce_one_shot_copy_engine.cu says what runs where).
    CopyEngine {
        /// The chunk sum, with the candidate's geometry.
        sum: LoadedKernel,
        geometry: Geometry,
        /// The start and end barriers, one block each.
        start: LoadedKernel,
        end: LoadedKernel,
    },
    /// NCCL on the runtime's communicator (`None`) or on a profile's own split.
    Nccl { split: Option<usize> },
}

/// What the copy-engine candidates share on one rank: the stream their copies go on, the events
/// that order each chunk's sum after its copies, and the scratch the peers' messages are copied
/// into (per peer one slot of the largest message of the buckets that have such a candidate,
/// private to this rank).
#[derive(Debug)]
struct CopyEngine {
    stream: Stream,
    fork: Event,
    chunks: Vec<Event>,
    scratch: DeviceBuffer,
    slot_bytes: usize,
}

/// The chunks of a copy-engine launch for a message of `bytes`: byte ranges, each a whole
/// number of 16-byte vectors except the last, which ends at `bytes`.
pub fn copy_engine_chunks(bytes: u64) -> Vec<std::ops::Range<u64>> {
    let per_chunk = bytes
        .div_ceil(COPY_ENGINE_MAX_CHUNKS)
        .max(COPY_ENGINE_CHUNK_BYTES)
        .next_multiple_of(kernels::ALIGNMENT_BYTES);
    (0..bytes.div_ceil(per_chunk).max(1))
        .map(|chunk| chunk * per_chunk..((chunk + 1) * per_chunk).min(bytes))
        .collect()
}

/// One candidate of one bucket on this rank.
#[derive(Debug)]
pub struct Entry {
    /// The bucket's index in the ladder.
    pub bucket: usize,
    /// The profile id.
    pub profile: String,
    /// Whether it is NCCL.
    pub nccl: bool,
    /// Why it cannot run on every rank, agreed by all ranks; `None` when it can.
    pub dropped: Option<DropReason>,
    launch: Option<Launch>,
}

/// Where an entry's input comes from: the peer-mapped buffer, or a plain one when only NCCL
/// runs.
#[derive(Debug)]
enum Input {
    Peer(PeerMemory),
    Plain(DeviceBuffer),
}

/// A package's candidates on one rank.
#[derive(Debug)]
pub struct Collectives {
    // Dropped first: an aborted split's kernels end before the buffers wait for the device.
    splits: Vec<Communicator>,
    entries: Vec<Entry>,
    // Buffers and communicators outlive nothing that uses them: graphs are the caller's, and
    // the caller keeps `Collectives` alive while replaying them.
    input: Input,
    output: DeviceBuffer,
    copy_engine: Option<CopyEngine>,
    capacity: usize,
    // Bytes at the start of the registered buffer that hold a message (the rest is scratch).
    input_region: u64,
    dtype: Dtype,
    element_bytes: u64,
    // Each bucket's largest message, in elements: the most its candidates' scratch holds.
    bucket_capacity: Vec<usize>,
    timeout: Duration,
    rank: u32,
}

/// What can fail while capturing: the capture itself, or what is enqueued.
enum CaptureFailure {
    Driver(crate::gpu::driver::DriverError),
    Runtime(RuntimeError),
}

impl From<crate::gpu::driver::DriverError> for CaptureFailure {
    fn from(error: crate::gpu::driver::DriverError) -> CaptureFailure {
        CaptureFailure::Driver(error)
    }
}

/// An index into [`Collectives::entries`].
pub type EntryId = usize;

/// The memory one all-reduce reads its message from and writes its sum to, on this rank's GPU;
/// the same memory for an all-reduce in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operands {
    /// The message.
    pub input: CallerMemory,
    /// Where the sum goes.
    pub output: CallerMemory,
}

/// How the message reaches a kernel that must read it from the registered buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Staging {
    /// It is read where it is.
    None,
    /// It is copied to the registered buffer's start.
    Copy,
    /// It overlaps the registered buffer: copied to the private output buffer, then to the
    /// registered buffer's start (a copy whose source and destination overlap is undefined).
    ThroughPrivate,
}

/// Where a custom kernel reads and writes one all-reduce, and what is copied around it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OperandPlan {
    /// What is copied before the kernel.
    pub staging: Staging,
    /// The address the kernel reads this rank's message from.
    pub input: u64,
    /// The address the kernel writes the sum to.
    pub output: u64,
    /// The kernel writes the private output buffer, copied to the caller's output after it.
    pub bounce: bool,
}

/// This rank's buffers, as device address ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferLayout {
    /// The registered buffer's input region (peers read a message there from its start).
    pub input_region: std::ops::Range<u64>,
    /// The registered buffer's scratch, after the input region.
    pub scratch: std::ops::Range<u64>,
    /// The private output buffer, large enough for any message.
    pub private_output: u64,
}

/// Where a kernel of `access` reads and writes a message of `bytes` at `input`, summed to
/// `output`. The rules: a kernel whose peers read the message reads it at the registered
/// buffer's start, copied there unless it is there; so does any kernel given a message that is
/// not 16-byte aligned. The kernel writes the private output buffer instead of `output`, and
/// the sum is copied after it, when `output` is misaligned, partly overlaps what the kernel
/// reads, lies in the input region while peers may read it after this rank wrote an element
/// (one-shot pull, the copy-engine one-shot), or touches the scratch.
pub fn plan_operands(
    access: InputAccess,
    input: u64,
    output: u64,
    bytes: u64,
    layout: &BufferLayout,
) -> OperandPlan {
    let aligned = |address: u64| address % kernels::ALIGNMENT_BYTES == 0;
    let message = input..input.saturating_add(bytes);
    let registered = layout.input_region.start;
    let (staging, kernel_input) = if matches!(access, InputAccess::Local) && aligned(input) {
        (Staging::None, input)
    } else if input == registered {
        (Staging::None, registered)
    } else if overlaps(&message, &layout.input_region) || overlaps(&message, &layout.scratch) {
        (Staging::ThroughPrivate, registered)
    } else {
        (Staging::Copy, registered)
    };
    let reads = kernel_input..kernel_input.saturating_add(bytes);
    let written = output..output.saturating_add(bytes);
    let peers_read_input_region = matches!(
        access,
        InputAccess::Peers {
            output_may_alias: false
        }
    );
    let bounce = !aligned(output)
        || (overlaps(&written, &reads) && output != kernel_input)
        || (peers_read_input_region && overlaps(&written, &layout.input_region))
        || overlaps(&written, &layout.scratch);
    OperandPlan {
        staging,
        input: kernel_input,
        output: if bounce {
            layout.private_output
        } else {
            output
        },
        bounce,
    }
}

/// NCCL's name for a ladder's element type.
pub fn nccl_type(dtype: Dtype) -> NcclDataType {
    match dtype {
        Dtype::Bf16 => NcclDataType::Bf16,
    }
}

fn overlaps(a: &std::ops::Range<u64>, b: &std::ops::Range<u64>) -> bool {
    a.start < b.end && b.start < a.end
}

fn driver(rank: u32) -> impl Fn(crate::gpu::driver::DriverError) -> RuntimeError {
    move |source| RuntimeError::Driver { rank, source }
}

/// The geometry a candidate launches with in a bucket.
pub fn geometry_for(
    bucket: &Bucket,
    profile: &Profile,
) -> Result<Geometry, crate::gpu::driver::DriverError> {
    match profile.blocks {
        Some(blocks) => Geometry::new(blocks, bucket.threads),
        None => Geometry::of_bucket(bucket),
    }
}

/// The largest message of the ladder, in elements.
fn capacity_elements(ladder: &Ladder) -> usize {
    let largest = ladder.buckets.last().map_or(0, |bucket| bucket.max_bytes);
    largest.div_ceil(ladder.dtype.size_bytes()) as usize
}

/// The package's architecture must be this rank's GPU's.
pub fn check_architecture(runtime: &Runtime, package: &Package) -> Result<(), RuntimeError> {
    let rank = runtime.rank();
    let info = crate::gpu::driver::Driver::open()
        .and_then(|driver| driver.describe(runtime.device().ordinal()))
        .map_err(driver(rank))?;
    if info.arch == Some(package.arch()) {
        return Ok(());
    }
    Err(RuntimeError::WrongArchitecture {
        rank,
        package: package.arch().to_string(),
        device: info.arch_name(),
    })
}

impl Collectives {
    /// Loads `package` on this rank, after checking its architecture against the GPU.
    /// Collective: every rank calls it for the same package.
    pub fn new(runtime: &Runtime, package: &Package) -> Result<Collectives, RuntimeError> {
        check_architecture(runtime, package)?;
        let rank = runtime.rank();
        // Every rank must load the same package, or their launches would differ.
        runtime
            .agree_on(package.identity().as_bytes(), "the package")
            .map_err(|error| match error {
                RuntimeError::Disagreement(disagreement) => RuntimeError::Setup {
                    rank,
                    message: format!(
                        "rank {} loaded another package (identity {}) than this rank ({})",
                        disagreement.other,
                        String::from_utf8_lossy(&disagreement.theirs),
                        package.identity()
                    ),
                },
                error => error,
            })?;
        let ladder = package.ladder();
        let capacity = capacity_elements(ladder);
        // Profiles with communicator settings each run on their own split, made in ladder
        // order on every rank.
        let mut splits = Vec::new();
        let mut split_of = Vec::new();
        for profile in &ladder.profiles {
            if profile.is_nccl() && (profile.max_ctas.is_some() || profile.min_ctas.is_some()) {
                splits.push(runtime.split_nccl(profile.max_ctas, profile.min_ctas)?);
                split_of.push((profile.id.clone(), splits.len() - 1));
            }
        }
        let peer_reason = match runtime.topology() {
            Topology::PeerKernels => None,
            Topology::NcclOnly { reason } => Some(reason.clone()),
        };
        let has_custom = kernels::input_region_bytes(ladder) > 0;
        let message_bytes = capacity * 2;
        // The input region holds the largest message of any bucket, so NCCL reads the same
        // buffer as the custom kernels even where only NCCL takes a bucket.
        let input_region = kernels::input_region_bytes(ladder)
            .max((message_bytes as u64).next_multiple_of(kernels::BUFFER_ALIGNMENT_BYTES));
        let input = if peer_reason.is_none() && has_custom {
            let scratch = kernels::scratch_region_bytes(ladder);
            Input::Peer(runtime.map_peer_memory((input_region + scratch) as usize)?)
        } else {
            Input::Plain(
                runtime
                    .device()
                    .allocate(message_bytes.max(2))
                    .map_err(driver(rank))?,
            )
        };
        let output = runtime
            .device()
            .allocate(message_bytes.max(2))
            .map_err(driver(rank))?;

        // Each loaded kernel keeps its module loaded.
        let mut modules = Vec::new();
        if matches!(input, Input::Peer(_)) {
            for (record, cubin) in package.kernels() {
                let module = runtime
                    .device()
                    .load_module(ModuleImage::Cubin(cubin))
                    .map_err(driver(rank))?;
                modules.push((record.name.clone(), module));
            }
        }
        let mut entries = Vec::new();
        for (bucket_index, bucket) in ladder.buckets.iter().enumerate() {
            for id in &bucket.candidates {
                let profile = ladder
                    .profile(id)
                    .expect("a validated ladder names only its profiles");
                let mut entry = Entry {
                    bucket: bucket_index,
                    profile: profile.id.clone(),
                    nccl: profile.is_nccl(),
                    dropped: None,
                    launch: None,
                };
                // A kernel the package's qualification found wrong stays out wherever it runs.
                let found_wrong = qualified_wrong(package, bucket_index, &profile.id);
                if let (Some(reason), false) = (found_wrong, profile.is_nccl()) {
                    entry.dropped = Some(reason);
                } else if profile.is_nccl() {
                    let split = split_of
                        .iter()
                        .find(|(name, _)| *name == profile.id)
                        .map(|(_, index)| *index);
                    entry.launch = Some(Launch::Nccl { split });
                } else if let Some(reason) = &peer_reason {
                    entry.dropped = Some(DropReason::NoPeerAccess {
                        message: reason.clone(),
                    });
                } else {
                    let spec = kernels::kernel_for(profile, ladder.dtype)
                        .expect("every custom profile has a kernel");
                    let (_, module) = modules
                        .iter()
                        .find(|(name, _)| *name == spec.name)
                        .expect("a verified package holds every kernel its ladder needs");
                    let kernel = module
                        .load(&spec.name, spec.cluster)
                        .map_err(driver(rank))?;
                    let geometry = geometry_for(bucket, profile).map_err(driver(rank))?;
                    let resident = kernel.resident_capacity(geometry).map_err(driver(rank))?;
                    match check_candidate_residency(bucket, profile, resident) {
                        Ok(()) => {
                            entry.launch = Some(match kernels::copy_engine_barriers(&spec) {
                                Some([start, end]) => Launch::CopyEngine {
                                    sum: kernel,
                                    geometry,
                                    start: module.load(start, false).map_err(driver(rank))?,
                                    end: module.load(end, false).map_err(driver(rank))?,
                                },
                                None => Launch::Custom {
                                    input: kernels::input_access(&spec)
                                        .expect("a kernel of this crate"),
                                    kernel,
                                    geometry,
                                    scratch_offset: input_region
                                        + kernels::scratch_offset_after_input(ladder, &spec),
                                },
                            });
                        }
                        Err(reason) => entry.dropped = Some(reason),
                    }
                }
                entries.push(entry);
            }
        }
        let copy_engine_slot = kernels::copy_engine_slot_bytes(ladder).filter(|_| {
            entries
                .iter()
                .any(|entry| matches!(entry.launch, Some(Launch::CopyEngine { .. })))
        });
        let copy_engine = if let Some(slot_bytes) = copy_engine_slot {
            let device = runtime.device();
            let peers = runtime.world() as usize - 1;
            let chunks = copy_engine_chunks(slot_bytes).len();
            let slot_bytes = slot_bytes as usize;
            Some(CopyEngine {
                stream: device.new_stream().map_err(driver(rank))?,
                fork: device.new_event(false).map_err(driver(rank))?,
                chunks: (0..chunks)
                    .map(|_| device.new_event(false))
                    .collect::<Result<_, _>>()
                    .map_err(driver(rank))?,
                scratch: device.allocate(slot_bytes * peers).map_err(driver(rank))?,
                slot_bytes,
            })
        } else {
            None
        };
        let mut collectives = Collectives {
            entries,
            input,
            output,
            copy_engine,
            capacity,
            input_region,
            dtype: ladder.dtype,
            element_bytes: ladder.dtype.size_bytes(),
            bucket_capacity: ladder
                .buckets
                .iter()
                .map(|bucket| bucket.max_bytes.div_ceil(ladder.dtype.size_bytes()) as usize)
                .collect(),
            splits,
            timeout: runtime.timeout(),
            rank,
        };
        let local: Vec<Option<DropReason>> = collectives
            .entries
            .iter()
            .map(|entry| entry.dropped.clone())
            .collect();
        let agreed = agree_drops(runtime, &local, "the residency agreement")?;
        collectives.apply_drops(agreed);
        Ok(collectives)
    }

    /// Every entry, bucket by bucket in ladder order, each bucket's candidates in its order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entries of one bucket.
    pub fn bucket_entries(&self, bucket: usize) -> impl Iterator<Item = (EntryId, &Entry)> {
        self.entries
            .iter()
            .enumerate()
            .filter(move |(_, entry)| entry.bucket == bucket)
    }

    /// The entry for `profile` in `bucket`.
    pub fn find(&self, bucket: usize, profile: &str) -> Option<EntryId> {
        self.entries
            .iter()
            .position(|entry| entry.bucket == bucket && entry.profile == profile)
    }

    /// Drops entries (the same on every rank: pass what [`agree_drops`] returned).
    pub fn apply_drops(&mut self, drops: Vec<Option<DropReason>>) {
        for (entry, reason) in self.entries.iter_mut().zip(drops) {
            if let Some(reason) = reason {
                entry.dropped = Some(reason);
                entry.launch = None;
            }
        }
    }

    /// The input buffer: every collective reads its message from byte 0.
    pub fn input(&self) -> &DeviceBuffer {
        match &self.input {
            Input::Peer(peer) => peer.buffer(),
            Input::Plain(buffer) => buffer,
        }
    }

    /// The output buffer: every collective writes its sum from byte 0.
    pub fn output(&self) -> &DeviceBuffer {
        &self.output
    }

    /// The largest message, in elements.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The communicator an NCCL entry runs on.
    pub fn communicator<'a>(&'a self, runtime: &'a Runtime, id: EntryId) -> &'a Communicator {
        match &self.entries[id].launch {
            Some(Launch::Nccl { split: Some(index) }) => &self.splits[*index],
            _ => runtime.communicator(),
        }
    }

    /// Enqueues entry `id` on `stream` for a message of `elements` in the registered buffer,
    /// summed into [`Collectives::output`] (queued or captured; the caller waits, see
    /// [`Collectives::run_bounded`]). One call at a time per rank: the copy-engine candidates
    /// share one copy stream, its events and their scratch.
    pub fn enqueue(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        elements: usize,
    ) -> Result<(), RuntimeError> {
        let operands = Operands {
            input: CallerMemory::whole(self.input()),
            output: CallerMemory::whole(&self.output),
        };
        self.enqueue_operands(runtime, stream, id, elements, operands)
    }

    /// Enqueues entry `id` on `stream` for a message of `elements` read from `operands.input`
    /// and summed into `operands.output`, which may be the same memory (in place), and may lie
    /// anywhere on this rank's GPU, the registered buffer's input region included.
    ///
    /// What a kernel needs is made so inside the enqueued work: a kernel whose peers read this
    /// rank's message gets it copied into the registered buffer first (unless it is there); a
    /// message at an address the kernels cannot take (not 16-byte aligned) is copied there too;
    /// an output the kernel could not write safely (one that partly overlaps the input, lies in
    /// the input region while peers may still read it, or is misaligned) is written to this
    /// rank's private output buffer and copied after the kernel.
    pub fn enqueue_operands(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        elements: usize,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let entry = &self.entries[id];
        // Scratch is sized by each bucket's largest message; a larger one would overrun it.
        let largest = self.bucket_capacity[entry.bucket];
        if elements == 0 || elements > largest {
            return Err(RuntimeError::Setup {
                rank: self.rank,
                message: format!(
                    "{} in bucket {}: a message of {elements} elements is outside the bucket's \
                     1..={largest}",
                    entry.profile, entry.bucket
                ),
            });
        }
        let bytes = elements as u64 * self.element_bytes;
        for (what, memory) in [("input", &operands.input), ("output", &operands.output)] {
            if (memory.len_bytes() as u64) < bytes {
                return Err(RuntimeError::Setup {
                    rank: self.rank,
                    message: format!(
                        "the {what} holds {} bytes, the message {bytes}",
                        memory.len_bytes()
                    ),
                });
            }
        }
        match &entry.launch {
            None => Err(RuntimeError::Setup {
                rank: self.rank,
                message: format!(
                    "{} in bucket {} was dropped: {}",
                    entry.profile,
                    entry.bucket,
                    entry
                        .dropped
                        .as_ref()
                        .map_or_else(|| "unknown".to_owned(), ToString::to_string)
                ),
            }),
            Some(Launch::Nccl { .. }) => self
                .communicator(runtime, id)
                .all_reduce(
                    stream,
                    &operands.input,
                    &operands.output,
                    elements,
                    nccl_type(self.dtype),
                )
                .map_err(RuntimeError::from),
            Some(Launch::Custom {
                kernel,
                geometry,
                scratch_offset,
                input,
            }) => {
                let Input::Peer(peer) = &self.input else {
                    unreachable!("custom entries exist only with peer memory")
                };
                let plan = self.plan(stream, peer, &operands, bytes, *input)?;
                let params = peer.params(
                    plan.input,
                    plan.output,
                    elements as u64,
                    *scratch_offset,
                    self.timeout,
                );
                stream
                    .launch_loaded(kernel, *geometry, &params)
                    .map_err(driver(self.rank))?;
                self.finish(stream, &operands, bytes, &plan)
            }
            Some(Launch::CopyEngine {
                sum,
                geometry,
                start,
                end,
            }) => {
                let Input::Peer(peer) = &self.input else {
                    unreachable!("custom entries exist only with peer memory")
                };
                let access = InputAccess::Peers {
                    output_may_alias: false,
                };
                let plan = self.plan(stream, peer, &operands, bytes, access)?;
                self.enqueue_copy_engine(
                    stream,
                    elements,
                    plan.output,
                    sum,
                    *geometry,
                    [start, end],
                )?;
                self.finish(stream, &operands, bytes, &plan)
            }
        }
    }

    /// Enqueues the copies that put the message where a kernel of `access` needs it, and
    /// returns where the kernel reads and writes (see [`plan_operands`]).
    fn plan(
        &self,
        stream: &Stream,
        peer: &PeerMemory,
        operands: &Operands,
        bytes: u64,
        access: InputAccess,
    ) -> Result<OperandPlan, RuntimeError> {
        let rank = self.rank;
        let registered = peer.buffer();
        let layout = BufferLayout {
            input_region: registered.address()..registered.address() + self.input_region,
            scratch: registered.address() + self.input_region
                ..registered.address() + registered.len_bytes() as u64,
            private_output: self.output.address(),
        };
        let plan = plan_operands(
            access,
            operands.input.address(),
            operands.output.address(),
            bytes,
            &layout,
        );
        let bytes = bytes as usize;
        match plan.staging {
            Staging::None => {}
            Staging::Copy => stream
                .copy_device(registered, 0, &operands.input, 0, bytes)
                .map_err(driver(rank))?,
            Staging::ThroughPrivate => {
                stream
                    .copy_device(&self.output, 0, &operands.input, 0, bytes)
                    .map_err(driver(rank))?;
                stream
                    .copy_device(registered, 0, &self.output, 0, bytes)
                    .map_err(driver(rank))?;
            }
        }
        Ok(plan)
    }

    /// Copies a bounced sum to the caller's output.
    fn finish(
        &self,
        stream: &Stream,
        operands: &Operands,
        bytes: u64,
        plan: &OperandPlan,
    ) -> Result<(), RuntimeError> {
        if plan.bounce {
            stream
                .copy_device(&operands.output, 0, &self.output, 0, bytes as usize)
                .map_err(driver(self.rank))?;
        }
        Ok(())
    }

    /// Enqueues a copy-engine all-reduce on `stream`: the start barrier; on the copy stream,
    /// per chunk, every peer's chunk copied into this rank's scratch; per chunk, once its copies
    /// are done, the chunk's sum on `stream`; the end barrier. The copy stream forks from
    /// `stream` after the start barrier and joins it at every chunk's sum, so a capture on
    /// `stream` takes the copies into its graph. The message is in the registered buffer; the
    /// sum goes to device address `output`.
    fn enqueue_copy_engine(
        &self,
        stream: &Stream,
        elements: usize,
        output: u64,
        sum: &LoadedKernel,
        geometry: Geometry,
        [start, end]: [&LoadedKernel; 2],
    ) -> Result<(), RuntimeError> {
        let rank = self.rank;
        let Input::Peer(peer) = &self.input else {
            unreachable!("custom entries exist only with peer memory")
        };
        let copy = self
            .copy_engine
            .as_ref()
            .expect("a copy-engine entry comes with the copy engine's stream");
        let bytes = elements as u64 * self.element_bytes;
        // The barriers read no data; the scratch offset only has to cover the message.
        let covered = bytes.next_multiple_of(kernels::ALIGNMENT_BYTES);
        let registered = peer.buffer().address();
        let barrier = peer.params(registered, output, elements as u64, covered, self.timeout);
        let one_block = Geometry::new(1, 32).map_err(driver(rank))?;
        stream
            .launch_loaded(start, one_block, &barrier)
            .map_err(driver(rank))?;
        stream.record(&copy.fork).map_err(driver(rank))?;
        copy.stream.wait_for(&copy.fork).map_err(driver(rank))?;
        for (chunk, range) in copy_engine_chunks(bytes).into_iter().enumerate() {
            let length = (range.end - range.start) as usize;
            let mut params = barrier;
            for source in 0..barrier.world {
                let at = range.start as usize;
                if source == rank {
                    params.buffers[source as usize] += range.start;
                    continue;
                }
                let slot = copy.slot_bytes * (source - u32::from(source > rank)) as usize;
                let from = peer
                    .rank_buffer(source)
                    .expect("peer memory maps every rank's buffer");
                copy.stream
                    .copy_device(&copy.scratch, slot + at, from, at, length)
                    .map_err(driver(rank))?;
                params.buffers[source as usize] = copy.scratch.address() + (slot + at) as u64;
            }
            let event = &copy.chunks[chunk];
            copy.stream.record(event).map_err(driver(rank))?;
            stream.wait_for(event).map_err(driver(rank))?;
            params.output += range.start;
            params.input = params.buffers[rank as usize];
            params.elements = length as u64 / self.element_bytes;
            params.scratch_offset = (length as u64).next_multiple_of(kernels::ALIGNMENT_BYTES);
            stream
                .launch_loaded(sum, geometry, &params)
                .map_err(driver(rank))?;
        }
        stream
            .launch_loaded(end, one_block, &barrier)
            .map_err(driver(rank))
    }

    /// Captures `ops` back-to-back launches of entry `id` at `elements` into a graph replayed
    /// on `stream`.
    pub fn capture(
        &self,
        runtime: &Runtime,
        stream: &mut Stream,
        id: EntryId,
        elements: usize,
        ops: u32,
    ) -> Result<Graph, RuntimeError> {
        let operands = Operands {
            input: CallerMemory::whole(self.input()),
            output: CallerMemory::whole(&self.output),
        };
        self.capture_operands(runtime, stream, id, elements, operands, ops)
    }

    /// Like [`Collectives::capture`], on operands (see [`Collectives::enqueue_operands`]).
    pub fn capture_operands(
        &self,
        runtime: &Runtime,
        stream: &mut Stream,
        id: EntryId,
        elements: usize,
        operands: Operands,
        ops: u32,
    ) -> Result<Graph, RuntimeError> {
        let rank = self.rank;
        let graph = stream
            .capture(|capture| {
                for _ in 0..ops {
                    self.enqueue_operands(runtime, capture.stream(), id, elements, operands)
                        .map_err(CaptureFailure::Runtime)?;
                }
                Ok(())
            })
            .map_err(|failure| match failure {
                CaptureFailure::Driver(source) => RuntimeError::Driver { rank, source },
                CaptureFailure::Runtime(error) => error,
            })?;
        graph.upload().map_err(driver(rank))?;
        Ok(graph)
    }

    /// Runs `enqueue` (work that includes entry `id`, or any NCCL work when `id` is `None`) on
    /// `stream` and waits for it within the timeout. NCCL work runs under the runtime's
    /// watchdog, so a missing peer aborts the communicator; custom kernels bound their own
    /// waits and leave an abort word naming the missing peer, which becomes the error.
    pub fn run_bounded(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        step: &str,
        enqueue: impl FnOnce() -> Result<(), RuntimeError>,
    ) -> Result<(), RuntimeError> {
        let entry = &self.entries[id];
        if entry.nccl {
            return runtime.bounded(self.communicator(runtime, id), stream, step, enqueue);
        }
        enqueue()?;
        // Every kernel's wait is bounded by the timeout; twice it leaves room for the launch.
        // A stream still busy after that cannot be read (the read would wait for it).
        stream
            .synchronize_within(self.timeout * 2)
            .map_err(driver(self.rank))?;
        self.check_abort(stream, step)
    }

    /// Aborts the NCCL profiles' own communicators, so that their kernels waiting for a
    /// missing peer end (the runtime's communicator is aborted by [`Runtime::bounded`]).
    pub fn abort_splits(&self) {
        for split in &self.splits {
            split.abort();
        }
    }

    /// This rank's state words, whose first is the abort word; `None` when no custom kernel
    /// runs (only NCCL).
    pub fn state(&self) -> Option<&DeviceBuffer> {
        match &self.input {
            Input::Peer(peer) => Some(peer.state()),
            Input::Plain(_) => None,
        }
    }

    /// The bytes at the start of the registered buffer that hold a message (the zero-copy
    /// region: a message there is read in place); `None` when no custom kernel runs.
    pub fn input_region(&self) -> Option<CallerMemory> {
        match &self.input {
            Input::Peer(peer) => Some(CallerMemory::prefix(peer.buffer(), self.input_region)),
            Input::Plain(_) => None,
        }
    }

    /// The abort word as an error, if a kernel left one.
    pub fn check_abort(&self, stream: &Stream, step: &str) -> Result<(), RuntimeError> {
        let Input::Peer(peer) = &self.input else {
            return Ok(());
        };
        let mut word = [0_u64; 1];
        stream
            .read(peer.state(), 0, &mut word)
            .map_err(driver(self.rank))?;
        match Abort::decode(word[0]) {
            None => Ok(()),
            Some(abort) => Err(RuntimeError::Aborted {
                rank: self.rank,
                step: step.to_owned(),
                abort,
            }),
        }
    }
}

/// The drop the package's qualification recorded for a candidate when it says the kernel is
/// wrong (not exact, or it could not be captured); residency and peer access depend on the
/// machine and are decided here again.
fn qualified_wrong(package: &Package, bucket: usize, profile: &str) -> Option<DropReason> {
    let qualification = package.manifest().qualification.as_ref()?;
    let candidate = qualification
        .buckets
        .iter()
        .find(|recorded| recorded.index == bucket)?
        .candidates
        .iter()
        .find(|candidate| candidate.profile == profile)?;
    match &candidate.outcome {
        crate::package::Outcome::Dropped(
            reason @ (DropReason::NotExact { .. } | DropReason::CaptureFailed { .. }),
        ) => Some(reason.clone()),
        _ => None,
    }
}

/// Agrees which entries every rank drops: an entry any rank drops is dropped everywhere, with
/// the reason of the lowest such rank, so every rank ends with the same list. Collective.
pub fn agree_drops(
    runtime: &Runtime,
    local: &[Option<DropReason>],
    step: &str,
) -> Result<Vec<Option<DropReason>>, RuntimeError> {
    let world = runtime.world() as usize;
    let mut agreed = vec![None; local.len()];
    for (chunk_index, chunk) in local.chunks(crate::agree::RECORD_BYTES).enumerate() {
        let flags: Vec<u8> = chunk
            .iter()
            .map(|reason| u8::from(reason.is_some()))
            .collect();
        let gathered = runtime.all_gather(&flags, step)?;
        for position in 0..chunk.len() {
            let id = chunk_index * crate::agree::RECORD_BYTES + position;
            let first = (0..world).find(|rank| gathered[rank * chunk.len() + position] != 0);
            let Some(first) = first else {
                continue;
            };
            // The reason travels from the rank that has it, so every rank records the same.
            let mut slot = vec![0_u8; REASON_SLOT_BYTES];
            if runtime.rank() as usize == first {
                let reason = local[id].as_ref().expect("this rank dropped it");
                let bytes = encode_reason(reason);
                slot[..bytes.len()].copy_from_slice(&bytes);
            }
            let reasons = runtime.all_gather(&slot, step)?;
            let theirs = &reasons[first * REASON_SLOT_BYTES..(first + 1) * REASON_SLOT_BYTES];
            agreed[id] = Some(decode_reason(theirs, first));
        }
    }
    Ok(agreed)
}

/// A drop reason as JSON that fits a slot; a message too long is cut.
fn encode_reason(reason: &DropReason) -> Vec<u8> {
    let mut reason = reason.clone();
    loop {
        let bytes = serde_json::to_vec(&reason).expect("a drop reason serializes");
        if bytes.len() <= REASON_SLOT_BYTES {
            return bytes;
        }
        let message = match &mut reason {
            DropReason::CaptureFailed { message }
            | DropReason::NotExact { message }
            | DropReason::NoPeerAccess { message } => message,
            DropReason::NotResident { .. } => unreachable!("a residency reason is short"),
        };
        let keep = message.len().saturating_sub(64);
        let mut cut = keep;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(" ...");
    }
}

fn decode_reason(slot: &[u8], rank: usize) -> DropReason {
    let end = slot
        .iter()
        .position(|&byte| byte == 0)
        .unwrap_or(slot.len());
    serde_json::from_slice(&slot[..end]).unwrap_or_else(|_| DropReason::CaptureFailed {
        message: format!("rank {rank} dropped it; its reason could not be read"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MIB: u64 = 1 << 20;

    /// A registered buffer at 1 GiB (16 MiB of input region, then 48 MiB of scratch) and a
    /// private output buffer at 2 GiB.
    fn layout() -> BufferLayout {
        BufferLayout {
            input_region: 1024 * MIB..1040 * MIB,
            scratch: 1040 * MIB..1088 * MIB,
            private_output: 2048 * MIB,
        }
    }

    fn accesses() -> impl Strategy<Value = InputAccess> {
        prop_oneof![
            Just(InputAccess::Local),
            Just(InputAccess::Peers {
                output_may_alias: false
            }),
            Just(InputAccess::Peers {
                output_may_alias: true
            }),
        ]
    }

    /// Addresses around and inside both buffers, aligned or not.
    fn addresses() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(1024 * MIB),
            Just(1024 * MIB + 2),
            (0..64 * MIB).prop_map(|offset| 1024 * MIB + offset),
            (0..64 * MIB).prop_map(|offset| 512 * MIB + offset * 2),
            (0..8 * MIB).prop_map(|offset| 3072 * MIB + offset * 16),
        ]
    }

    fn range(start: u64, bytes: u64) -> std::ops::Range<u64> {
        start..start + bytes
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Whatever the caller passes, the kernel gets what its contract asks for.
        #[test]
        fn every_plan_keeps_the_kernel_contract(
            access in accesses(),
            input in addresses(),
            in_place in any::<bool>(),
            output in addresses(),
            elements in 1_u64..4 * MIB,
        ) {
            let bytes = elements * 2;
            let output = if in_place { input } else { output };
            let layout = layout();
            let plan = plan_operands(access, input, output, bytes, &layout);
            // Every address the kernel is given is 16-byte aligned.
            prop_assert_eq!(plan.input % 16, 0);
            prop_assert_eq!(plan.output % 16, 0);
            // A kernel whose peers read the message reads it at the registered start.
            if !matches!(access, InputAccess::Local) {
                prop_assert_eq!(plan.input, layout.input_region.start);
            }
            // The message reaches the kernel: read where it is, or copied where it is read.
            match plan.staging {
                Staging::None => prop_assert_eq!(plan.input, input),
                Staging::Copy => {
                    prop_assert!(!overlaps(&range(input, bytes), &range(plan.input, bytes)));
                }
                Staging::ThroughPrivate => {
                    prop_assert!(overlaps(&range(input, bytes), &layout.input_region)
                        || overlaps(&range(input, bytes), &layout.scratch));
                }
            }
            // The kernel writes over what it reads exactly or not at all, never the scratch,
            // and never the input region while peers may still read it there.
            let reads = range(plan.input, bytes);
            let writes = range(plan.output, bytes);
            prop_assert!(plan.output == plan.input || !overlaps(&reads, &writes));
            prop_assert!(!overlaps(&writes, &layout.scratch));
            if access == (InputAccess::Peers { output_may_alias: false }) {
                prop_assert!(!overlaps(&writes, &layout.input_region));
            }
            // The sum reaches the caller: written there, or copied there from the private buffer.
            prop_assert_eq!(plan.bounce, plan.output != output);
            if plan.bounce {
                prop_assert_eq!(plan.output, layout.private_output);
            }
        }
    }

    #[test]
    fn zero_copy_and_aligned_tensors_take_no_copy_where_the_kernel_allows() {
        let layout = layout();
        let registered = layout.input_region.start;
        let tensor = 3072 * MIB;
        let output = 3200 * MIB;
        let peers = InputAccess::Peers {
            output_may_alias: false,
        };
        let gather = InputAccess::Peers {
            output_may_alias: true,
        };
        let plan = |access, input, output| plan_operands(access, input, output, 4096, &layout);
        // Zero copy, out of place: nothing copied for any kernel.
        for access in [InputAccess::Local, peers, gather] {
            let zero_copy = plan(access, registered, output);
            assert_eq!(
                (zero_copy.staging, zero_copy.bounce),
                (Staging::None, false)
            );
        }
        // Zero copy in place: only the one-shot pull and the copy engine write elsewhere.
        assert!(!plan(InputAccess::Local, registered, registered).bounce);
        assert!(!plan(gather, registered, registered).bounce);
        assert!(plan(peers, registered, registered).bounce);
        // Any tensor: the local kernels read it where it is, in place too; the others get it
        // copied, and then write the caller's memory directly.
        let local = plan(InputAccess::Local, tensor, tensor);
        assert_eq!(
            (local.staging, local.input, local.bounce),
            (Staging::None, tensor, false)
        );
        let pulled = plan(peers, tensor, tensor);
        assert_eq!(
            (pulled.staging, pulled.output, pulled.bounce),
            (Staging::Copy, tensor, false)
        );
        // Misaligned: copied in, and the sum bounced out.
        let misaligned = plan(InputAccess::Local, tensor + 2, output + 2);
        assert_eq!(
            (misaligned.staging, misaligned.bounce),
            (Staging::Copy, true)
        );
        // A view inside the zero-copy region, off its start, for a pull: through the private
        // buffer.
        assert_eq!(
            plan(peers, registered + 32, output).staging,
            Staging::ThroughPrivate
        );
    }

    #[test]
    fn copy_engine_chunks_cover_the_message_in_whole_vectors() {
        for bytes in [
            0,
            2,
            16,
            COPY_ENGINE_CHUNK_BYTES - 2,
            COPY_ENGINE_CHUNK_BYTES,
            COPY_ENGINE_CHUNK_BYTES + 2,
            5 * COPY_ENGINE_CHUNK_BYTES + 14,
            COPY_ENGINE_MAX_CHUNKS * COPY_ENGINE_CHUNK_BYTES + 2,
            4 << 30,
        ] {
            let chunks = copy_engine_chunks(bytes);
            assert!(chunks.len() as u64 <= COPY_ENGINE_MAX_CHUNKS, "{bytes}");
            assert_eq!(chunks.first().map(|chunk| chunk.start), Some(0), "{bytes}");
            assert_eq!(chunks.last().map(|chunk| chunk.end), Some(bytes), "{bytes}");
            for pair in chunks.windows(2) {
                assert_eq!(pair[0].end, pair[1].start, "{bytes}");
                assert!(pair[0].end > pair[0].start, "{bytes}");
                assert_eq!(pair[0].end % kernels::ALIGNMENT_BYTES, 0, "{bytes}");
                assert!(
                    pair[0].end - pair[0].start >= COPY_ENGINE_CHUNK_BYTES,
                    "{bytes}"
                );
            }
        }
        assert_eq!(copy_engine_chunks(0), vec![0..0]);
        assert_eq!(copy_engine_chunks(3 * COPY_ENGINE_CHUNK_BYTES).len(), 3);
    }

    #[test]
    fn long_reasons_are_cut_to_fit_a_slot_and_read_back() {
        let reason = DropReason::NotExact {
            message: "é".repeat(2000),
        };
        let bytes = encode_reason(&reason);
        assert!(bytes.len() <= REASON_SLOT_BYTES);
        let mut slot = vec![0_u8; REASON_SLOT_BYTES];
        slot[..bytes.len()].copy_from_slice(&bytes);
        let DropReason::NotExact { message } = decode_reason(&slot, 1) else {
            panic!("the variant survives");
        };
        assert!(message.ends_with(" ..."));
        assert!(message.starts_with('é'));
    }

    #[test]
    fn an_unreadable_slot_names_the_rank() {
        let slot = vec![b'x'; REASON_SLOT_BYTES];
        assert_eq!(
            decode_reason(&slot, 3).to_string(),
            "capture failed: rank 3 dropped it; its reason could not be read"
        );
    }
}
