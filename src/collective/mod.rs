//! A package's candidates made ready on one rank: every kernel loaded, peer memory mapped, the
//! NCCL profiles' communicators split, and every (bucket, candidate) pair an [`Entry`] that can
//! be enqueued or captured in a graph at any message size its bucket covers. Qualification,
//! timing and the serving handle all launch through this one place, so what is checked is what
//! is timed and what is served.
//!
//! Creating it is collective (splits, IPC mapping, and an agreement on which entries every rank
//! can run): every rank creates it for the same package at the same point.

mod copies;
mod copy_engine;
mod drops;
mod epilogue;
mod epilogue_message;
mod geometry;
mod load;
mod nccl_rows;
mod operands;
mod order;
mod rank_order;
mod row_launch;
mod row_pieces;
mod rows;
mod symmetric;

use std::time::Duration;

pub use copy_engine::{copy_engine_chunks, gather_copies, GatherCopy, COPY_ENGINE_CHUNK_BYTES};
use copy_engine::{CopyEngine, CopyEngineKernels};
pub use drops::agree_drops;
pub use epilogue_message::{
    check_epilogue, epilogue_startup_shape, EpilogueMessage, HIDDEN_MULTIPLE, MAX_HIDDEN,
    STARTUP_EPS, STARTUP_HIDDEN,
};
pub use geometry::{bucket_geometry, geometry_for, resident_capacity};
pub use load::{check_architecture, private_output_bytes, PeerLayout};
pub use nccl_rows::{
    gather_plan, nccl_takes_directly, pass_elements, scatter_passes, sum_message_elements,
    sum_slot_bytes, GatherPlan, RowTransfer, ScatterPass,
};
pub use operands::{
    moves, plan_operands, BufferLayout, OperandPlan, Operands, PlannedCopy, MOVE_CHUNK_BYTES,
};
pub use order::{nccl_type, rank_order_applies};
pub use row_launch::startup_shape;
pub use row_pieces::{row_piece_steps, PieceCopy, RowPieceStep};
pub use rows::{plan_rows, RowLayout, RowMessage, RowPlan};

use crate::device::DropReason;
use crate::gpu::abort::Abort;
use crate::gpu::driver::{
    CallerMemory, DeviceBuffer, DeviceMemory, DriverError, Geometry, Graph, LoadedKernel, Stream,
};
use crate::gpu::nccl::{Communicator, NcclMemory};
use crate::kernels::InputAccess;
use crate::ladder::{Collective, Dtype, EpilogueForm};
use crate::runtime::{OperandError, PeerMemory, Runtime, RuntimeError};
use crate::shape::ElementPieces;

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
    /// Copies by the copy engines between two barrier kernels, summed chunk by chunk.
    CopyEngine(CopyEngineKernels),
    /// NCCL on the runtime's communicator (`None`) or on a profile's own split.
    Nccl { split: Option<usize> },
    /// NCCL in a symmetric profile's window (an index into the windows).
    NcclSymmetric { window: usize },
    /// The exact NCCL all-reduce (`"order": "rank"`) on the runtime's communicator
    /// ([`rank_order`]).
    NcclRankOrder,
}

/// A symmetric NCCL profile's window on this rank ([`symmetric`] makes and uses it).
#[derive(Debug)]
struct SymmetricWindow {
    /// The profile's own communicator, once the window is registered on it.
    communicator: Option<Communicator>,
    /// The memory until it is registered; then the communicator keeps it until its abort has
    /// returned, which releases the window.
    memory: Option<NcclMemory>,
    /// Where the memory is, for the copies into and out of the window.
    range: CallerMemory,
}

/// The windows of a ladder's symmetric profiles on this rank, in ladder order: the profile id,
/// and the window or why this rank cannot make it.
type Windows = Vec<(String, Result<SymmetricWindow, String>)>;

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
    // What an `all_reduce_add_rms_norm` candidate runs; `None` for other collectives.
    epilogue: Option<EpilogueForm>,
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
    // The symmetric profiles' windows with their communicators.
    windows: Windows,
    entries: Vec<Entry>,
    // Buffers and communicators outlive nothing that uses them: graphs are the caller's, and
    // the caller keeps `Collectives` alive while replaying them.
    input: Input,
    // Where a custom kernel writes a sum neither the caller's output nor the input region can
    // take, and the chunk of every move between overlapping ranges; `None` when no custom
    // kernel runs.
    private: Option<DeviceBuffer>,
    // The full-size output of `enqueue` and `capture` (checking, timing, benches), until
    // `release_output`.
    out_of_place: Option<DeviceBuffer>,
    copy_engine: Option<CopyEngine>,
    // The rank-order sum and its scratch, where the package holds the kernel.
    rank_order: Option<order::RankOrder>,
    // `add_rms_norm` with start-up's residual and weight, in a package of the fused collective.
    epilogue: Option<epilogue_message::EpilogueParts>,
    capacity: usize,
    collective: Collective,
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
    Driver(DriverError),
    Runtime(RuntimeError),
}

impl From<DriverError> for CaptureFailure {
    fn from(error: DriverError) -> CaptureFailure {
        CaptureFailure::Driver(error)
    }
}

/// An index into [`Collectives::entries`].
pub type EntryId = usize;

/// Refuses a message of `elements` that `entry` cannot take: it was dropped, or the message is
/// empty or larger than the `largest` its bucket's scratch holds (NCCL has no scratch of ours
/// and takes any size).
pub fn check_entry(entry: &Entry, elements: usize, largest: usize) -> Result<(), OperandError> {
    if entry.launch.is_none() {
        return Err(OperandError::Dropped {
            profile: entry.profile.clone(),
            bucket: entry.bucket,
            reason: entry
                .dropped
                .as_ref()
                .map_or_else(|| "unknown".to_owned(), ToString::to_string),
        });
    }
    if elements == 0 || (elements > largest && !entry.nccl) {
        return Err(OperandError::OutsideBucket {
            profile: entry.profile.clone(),
            bucket: entry.bucket,
            elements,
            largest,
        });
    }
    Ok(())
}

/// The pieces of an all-reduce of `elements` in pieces of at most `piece` elements, in order:
/// (first element, elements) each, the last one shorter when `piece` does not divide the
/// message. One piece of everything when `piece` is 0 (no bucket). The all-reduce's plan
/// ([`crate::shape::piece_plan`]).
pub fn pieces(elements: usize, piece: usize) -> impl Iterator<Item = (usize, usize)> {
    ElementPieces::new(elements as u64, piece as u64)
        .map(|range| (range.start as usize, (range.end - range.start) as usize))
}

impl Collectives {
    /// The element type the package sums.
    pub fn dtype(&self) -> Dtype {
        self.dtype
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

    /// The custom candidates of `bucket` that run here (not dropped), in the bucket's order.
    pub fn live_custom_entries(&self, bucket: usize) -> Vec<EntryId> {
        self.bucket_entries(bucket)
            .filter(|(_, entry)| !entry.nccl && entry.dropped.is_none())
            .map(|(id, _)| id)
            .collect()
    }

    /// The entry for `profile` in `bucket`.
    pub fn find(&self, bucket: usize, profile: &str) -> Option<EntryId> {
        self.entries
            .iter()
            .position(|entry| entry.bucket == bucket && entry.profile == profile)
    }

    /// The entry for `profile` in `bucket` when it runs here (not dropped).
    pub fn find_live(&self, bucket: usize, profile: &str) -> Option<EntryId> {
        self.find(bucket, profile)
            .filter(|&id| self.entries[id].dropped.is_none())
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

    /// The out-of-place output, as large as the largest message: [`Collectives::enqueue`] and
    /// [`Collectives::capture`] write their sum there from byte 0. It is kept from loading
    /// until [`Collectives::release_output`]; an error after that.
    pub fn output(&self) -> Result<&DeviceBuffer, RuntimeError> {
        self.out_of_place
            .as_ref()
            .ok_or_else(|| RuntimeError::Setup {
                rank: self.rank,
                message: "the out-of-place output was released when serving began".to_owned(),
            })
    }

    /// Frees the out-of-place output ([`Collectives::output`]), once nothing enqueues or
    /// captures on the collectives' own buffers any more and every graph that did is gone:
    /// the serving handle calls it after selection, so that a served package keeps only its
    /// peer buffer, its private output buffer and its kernels.
    pub fn release_output(&mut self) {
        self.out_of_place = None;
    }

    /// The collectives' own operands: the message in the registered buffer from byte 0, the
    /// sum into the out-of-place output.
    fn own_operands(&self) -> Result<Operands, RuntimeError> {
        Ok(Operands {
            input: CallerMemory::whole(self.input()),
            output: CallerMemory::whole(self.output()?),
        })
    }

    /// The largest message, in elements.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The communicator an NCCL entry runs on.
    pub fn communicator<'a>(&'a self, runtime: &'a Runtime, id: EntryId) -> &'a Communicator {
        match &self.entries[id].launch {
            Some(Launch::Nccl { split: Some(index) }) => &self.splits[*index],
            Some(Launch::NcclSymmetric { window }) => self.window(*window).communicator(),
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
        let operands = self.own_operands()?;
        self.enqueue_operands(runtime, stream, id, elements, operands)
    }

    /// Enqueues entry `id` on `stream` for a message of `elements` read from `operands.input`
    /// and summed into `operands.output`, which may be the same memory (in place), and may lie
    /// anywhere on this rank's GPU, the registered buffer's input region included.
    ///
    /// What a kernel needs is made so inside the enqueued work ([`plan_operands`]): a kernel
    /// whose peers read this rank's message gets it copied into the registered buffer first
    /// (unless it is there); a message at an address the kernels cannot take (not 16-byte
    /// aligned) is copied there too; an output the kernel could not write safely (one that
    /// partly overlaps the input, lies in the input region while peers may still read it, or
    /// is misaligned) gets the sum copied after the kernel, which writes it into the input
    /// region where no peer reads it then, or into this rank's small private output buffer.
    /// An out-of-place all-reduce keeps its input, except a message in the registered buffer
    /// off its start, or at its start when the output cannot take the sum and neither the rest
    /// of the input region nor the private buffer holds it (the input then holds the sum).
    ///
    /// A reduce-scatter's or all-gather's `elements` is its full message, in the shape
    /// start-up checks and times ([`startup_shape`]); [`Collectives::enqueue_rows`] takes any.
    pub fn enqueue_operands(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        elements: usize,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        if self.has_rows() {
            let message = self.startup_message(runtime.world(), elements)?;
            return self.enqueue_rows(runtime, stream, id, &message, operands);
        }
        if self.collective == Collective::AllReduceAddRmsNorm {
            return self.enqueue_own_epilogue(runtime, stream, id, elements, operands);
        }
        self.enqueue_sum(runtime, stream, id, elements, operands)
    }

    /// The all-reduce of [`Collectives::enqueue_operands`], also the first half of a separate
    /// epilogue's candidate.
    fn enqueue_sum(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        id: EntryId,
        elements: usize,
        operands: Operands,
    ) -> Result<(), RuntimeError> {
        let entry = &self.entries[id];
        // Scratch is sized by each bucket's largest message; a larger one would overrun it.
        let bytes = elements as u64 * self.element_bytes;
        check_entry(entry, elements, self.bucket_capacity[entry.bucket])
            .and_then(|()| operands.check_lengths(bytes))
            .map_err(self.operand_error())?;
        match &entry.launch {
            None => unreachable!("check_entry refuses an entry without a launch"),
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
            Some(Launch::NcclSymmetric { window }) => {
                self.enqueue_symmetric(stream, id, *window, elements, &operands)
            }
            Some(Launch::NcclRankOrder) => {
                self.enqueue_rank_order(runtime.communicator(), stream, elements, operands)
            }
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
                    .launch_loaded(kernel, *geometry, &params.to_bytes())
                    .map_err(RuntimeError::driver(self.rank))?;
                self.finish(stream, peer, &operands, bytes, &plan)
            }
            Some(Launch::CopyEngine(kernels)) => {
                let Input::Peer(peer) = &self.input else {
                    unreachable!("custom entries exist only with peer memory")
                };
                let access = InputAccess::Peers {
                    output_may_alias: false,
                };
                let plan = self.plan(stream, peer, &operands, bytes, access)?;
                self.copy_engine
                    .as_ref()
                    .expect("a copy-engine entry comes with the copy engine's stream")
                    .enqueue(stream, peer, kernels, elements, plan.output)?;
                self.finish(stream, peer, &operands, bytes, &plan)
            }
        }
    }

    /// Elements of one piece of a message above the largest bucket: that bucket's largest
    /// message.
    pub fn piece_elements(&self) -> usize {
        self.bucket_capacity.last().copied().unwrap_or(0)
    }

    /// Enqueues a message of any size in consecutive pieces of [`Collectives::piece_elements`]
    /// (the last one shorter), each all-reduced by the entry `entry_for` gives for its size in
    /// bytes, in order on `stream`. Every piece reads and writes only its own part of the
    /// operands, so the input and the output must be the same memory or not overlap at all:
    /// an output that partly overlaps the input would be written by one piece before a later
    /// piece read it. Refused otherwise.
    pub fn enqueue_chunked(
        &self,
        runtime: &Runtime,
        stream: &Stream,
        elements: usize,
        operands: Operands,
        entry_for: impl Fn(u64) -> EntryId,
    ) -> Result<(), RuntimeError> {
        // Saturating: no operand holds that many bytes, so the length check refuses it.
        let bytes = (elements as u64).saturating_mul(self.element_bytes);
        // Before any piece is enqueued: a refusal after some would leave the peers waiting.
        operands
            .check_chunkable(bytes, "a message in pieces")
            .map_err(self.operand_error())?;
        for (first, count) in pieces(elements, self.piece_elements()) {
            let offset = first as u64 * self.element_bytes;
            let length = count as u64 * self.element_bytes;
            let part = |memory: CallerMemory| CallerMemory::prefix(&memory.offset(offset), length);
            let piece = Operands {
                input: part(operands.input),
                output: part(operands.output),
            };
            self.enqueue_operands(runtime, stream, entry_for(length), count, piece)?;
        }
        Ok(())
    }

    /// An operand mistake as this rank's error.
    pub(super) fn operand_error(&self) -> impl FnOnce(OperandError) -> RuntimeError {
        let rank = self.rank;
        move |source| RuntimeError::Operands { rank, source }
    }

    /// This rank's private output buffer; it exists wherever a custom kernel runs.
    fn private(&self) -> &DeviceBuffer {
        self.private
            .as_ref()
            .expect("custom entries come with the private output buffer")
    }

    /// The private output buffer's device addresses.
    fn private_range(&self) -> std::ops::Range<u64> {
        let private = self.private();
        private.address()..private.address() + private.len_bytes() as u64
    }

    /// This rank's buffers as [`plan_operands`] sees them.
    fn layout(&self, peer: &PeerMemory) -> BufferLayout {
        let registered = peer.buffer().address();
        BufferLayout {
            input_region: registered..registered + self.input_region,
            scratch: registered + self.input_region..registered + peer.buffer().len_bytes() as u64,
            private_output: self.private_range(),
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
        let layout = self.layout(peer);
        let plan = plan_operands(
            access,
            operands.input.address(),
            operands.output.address(),
            bytes,
            &layout,
        )
        .ok_or_else(|| RuntimeError::Setup {
            rank: self.rank,
            message: format!(
                "a message of {bytes} bytes does not fit the private output buffer of {} bytes",
                self.private().len_bytes()
            ),
        })?;
        if plan.staged {
            let copies = moves(
                plan.input,
                operands.input.address(),
                bytes,
                &layout.private_output,
            );
            self.copy(stream, peer, operands, &copies)?;
        }
        Ok(plan)
    }

    /// Moves a sum the kernel wrote elsewhere to the caller's output.
    fn finish(
        &self,
        stream: &Stream,
        peer: &PeerMemory,
        operands: &Operands,
        bytes: u64,
        plan: &OperandPlan,
    ) -> Result<(), RuntimeError> {
        if plan.bounce {
            let copies = moves(
                operands.output.address(),
                plan.output,
                bytes,
                &self.private_range(),
            );
            self.copy(stream, peer, operands, &copies)?;
        }
        Ok(())
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
        let operands = self.own_operands()?;
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
        self.capture_with(stream, ops, |stream| {
            self.enqueue_operands(runtime, stream, id, elements, operands)
        })
    }

    /// Captures `ops` calls of `enqueue` on `stream` into one graph, uploaded.
    pub fn capture_with(
        &self,
        stream: &mut Stream,
        ops: u32,
        enqueue: impl Fn(&Stream) -> Result<(), RuntimeError>,
    ) -> Result<Graph, RuntimeError> {
        let rank = self.rank;
        let graph = stream
            .capture(|stream| {
                for _ in 0..ops {
                    enqueue(stream).map_err(CaptureFailure::Runtime)?;
                }
                Ok(())
            })
            .map_err(|failure| match failure {
                CaptureFailure::Driver(source) => RuntimeError::Driver { rank, source },
                CaptureFailure::Runtime(error) => error,
            })?;
        graph.upload().map_err(RuntimeError::driver(rank))?;
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
            .map_err(RuntimeError::driver(self.rank))?;
        self.check_abort(stream, step)
    }

    /// Aborts the NCCL profiles' own communicators, so that their kernels waiting for a
    /// missing peer end (the runtime's communicator is aborted by [`Runtime::bounded`]).
    pub fn abort_splits(&self) {
        for split in &self.splits {
            split.abort();
        }
        for (_, window) in &self.windows {
            if let Ok(window) = window {
                window.abort();
            }
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
            .map_err(RuntimeError::driver(self.rank))?;
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

#[cfg(test)]
mod tests {
    use super::{check_entry, pieces, Entry, Launch, OperandError};

    proptest::proptest! {
        /// The pieces cover every element once, in order, each at most a piece long and only
        /// the last one shorter.
        #[test]
        fn pieces_cover_the_message_in_order(elements in 0usize..10_000, piece in 0usize..3_000) {
            let all: Vec<(usize, usize)> = pieces(elements, piece).collect();
            let mut next = 0;
            for (index, &(first, count)) in all.iter().enumerate() {
                proptest::prop_assert_eq!(first, next);
                proptest::prop_assert!(count > 0);
                if piece > 0 {
                    proptest::prop_assert!(count <= piece);
                    if index + 1 < all.len() {
                        proptest::prop_assert_eq!(count, piece);
                    }
                }
                next += count;
            }
            proptest::prop_assert_eq!(next, elements);
        }
    }

    #[test]
    fn an_entry_takes_only_messages_its_bucket_holds_and_only_when_it_runs() {
        let entry = |nccl: bool, runs: bool| Entry {
            bucket: 2,
            profile: if nccl { "nccl" } else { "one_shot_push" }.to_owned(),
            nccl,
            dropped: (!runs).then(|| crate::device::DropReason::NoPeerAccess {
                message: "rank 1 cannot reach rank 0".to_owned(),
            }),
            launch: runs.then_some(Launch::Nccl { split: None }),
            epilogue: None,
        };
        assert_eq!(check_entry(&entry(false, true), 1024, 1024), Ok(()));
        assert_eq!(check_entry(&entry(true, true), 1 << 30, 1024), Ok(()));
        for (nccl, elements) in [(false, 0), (false, 1025), (true, 0)] {
            let refused = check_entry(&entry(nccl, true), elements, 1024).unwrap_err();
            assert!(
                matches!(
                    refused,
                    OperandError::OutsideBucket {
                        bucket: 2,
                        largest: 1024,
                        ..
                    }
                ),
                "{refused:?}"
            );
        }
        let dropped = check_entry(&entry(false, false), 16, 1024).unwrap_err();
        assert!(
            dropped
                .to_string()
                .starts_with("one_shot_push in bucket 2 was dropped: "),
            "{dropped}"
        );
    }

    #[test]
    fn twice_a_piece_and_three_elements_is_three_pieces() {
        let all: Vec<(usize, usize)> = pieces(2 * 1024 + 3, 1024).collect();
        assert_eq!(all, [(0, 1024), (1024, 1024), (2048, 3)]);
    }
}
