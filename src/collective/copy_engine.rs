//! The copy-engine candidates, whose peer traffic the copy engines carry between two barrier
//! kernels. The all-reduce's: the peers' messages are copied chunk by chunk into this rank's
//! scratch, each chunk summed as soon as its copies are done
//! (kernels/all_reduce_one_shot_copy_engine.cu says what runs where). The all-gather's: each
//! peer's rows are copied from its input region straight to their place in this rank's output,
//! while a kernel copies this rank's own (kernels/all_gather.cu).

use std::ops::Range;
use std::time::Duration;

use super::rows::RowMessage;
use crate::abi::LaunchParams;
use crate::gpu::driver::{DeviceBuffer, DeviceMemory, Event, Geometry, LoadedKernel, Stream};
use crate::kernels::ALIGNMENT_BYTES;
use crate::runtime::{PeerMemory, Runtime, RuntimeError};

/// A copy-engine launch moves the message in chunks of at least this many bytes, so the sum
/// of one chunk runs while the next is copied. On 2x H200 a 64 MiB message took 243 us in
/// chunks of 16 MiB, 265 us in chunks of 4 MiB (docs/benchmarks.md).
pub const COPY_ENGINE_CHUNK_BYTES: u64 = 16 << 20;

/// At most this many chunks per copy-engine launch (larger messages take larger chunks).
const COPY_ENGINE_MAX_CHUNKS: u64 = 64;

/// The kernels of one copy-engine candidate.
#[derive(Debug)]
pub(super) struct CopyEngineKernels {
    /// The local part, with the candidate's geometry: the all-reduce's chunk sum, the
    /// all-gather's own-rows copy.
    pub(super) main: LoadedKernel,
    pub(super) geometry: Geometry,
    /// The start and end barriers, one block each.
    pub(super) start: LoadedKernel,
    pub(super) end: LoadedKernel,
}

/// What the copy-engine candidates share on one rank: the stream their copies go on, the events
/// that order each chunk's sum after its copies (the first also joins an all-gather's copies),
/// and the all-reduce's scratch the peers' messages are copied into (per peer one slot of the
/// largest message of the buckets that have such a candidate, private to this rank; none for
/// an all-gather, whose copies go straight to the output).
#[derive(Debug)]
pub(super) struct CopyEngine {
    stream: Stream,
    fork: Event,
    chunks: Vec<Event>,
    scratch: Option<DeviceBuffer>,
    slot_bytes: usize,
    element_bytes: u64,
    timeout: Duration,
    rank: u32,
}

impl CopyEngine {
    /// The copy stream, its events and `slot_bytes` of scratch per peer (none for 0), on this
    /// rank's GPU; messages of `element_bytes` elements, kernels bounded by `timeout`.
    pub(super) fn new(
        runtime: &Runtime,
        slot_bytes: u64,
        element_bytes: u64,
        timeout: Duration,
    ) -> Result<CopyEngine, RuntimeError> {
        let rank = runtime.rank();
        let device = runtime.device();
        let peers = runtime.world() as usize - 1;
        let chunks = copy_engine_chunks(slot_bytes).len();
        let slot_bytes = slot_bytes as usize;
        Ok(CopyEngine {
            stream: device.new_stream().map_err(RuntimeError::driver(rank))?,
            fork: device
                .new_event(false)
                .map_err(RuntimeError::driver(rank))?,
            chunks: (0..chunks)
                .map(|_| device.new_event(false))
                .collect::<Result<_, _>>()
                .map_err(RuntimeError::driver(rank))?,
            scratch: (slot_bytes > 0 && peers > 0)
                .then(|| device.allocate(slot_bytes * peers))
                .transpose()
                .map_err(RuntimeError::driver(rank))?,
            slot_bytes,
            element_bytes,
            timeout,
            rank,
        })
    }

    /// Enqueues a copy-engine all-reduce on `stream`: the start barrier; on the copy stream,
    /// per chunk, every peer's chunk copied into this rank's scratch; per chunk, once its copies
    /// are done, the chunk's sum on `stream`; the end barrier. The copy stream forks from
    /// `stream` after the start barrier and joins it at every chunk's sum, so a capture on
    /// `stream` takes the copies into its graph. The message is in the registered buffer; the
    /// sum goes to device address `output`.
    pub(super) fn enqueue(
        &self,
        stream: &Stream,
        peer: &PeerMemory,
        kernels: &CopyEngineKernels,
        elements: usize,
        output: u64,
    ) -> Result<(), RuntimeError> {
        let rank = self.rank;
        let scratch = self
            .scratch
            .as_ref()
            .expect("an all-reduce's copy engine has scratch");
        let bytes = elements as u64 * self.element_bytes;
        // The barriers read no data; the scratch offset only has to cover the message.
        let covered = bytes.next_multiple_of(ALIGNMENT_BYTES);
        let registered = peer.buffer().address();
        let barrier = peer.params(registered, output, elements as u64, covered, self.timeout);
        let one_block = Geometry::new(1, 32).map_err(RuntimeError::driver(rank))?;
        stream
            .launch_loaded(&kernels.start, one_block, &barrier.to_bytes())
            .map_err(RuntimeError::driver(rank))?;
        stream
            .record(&self.fork)
            .map_err(RuntimeError::driver(rank))?;
        self.stream
            .wait_for(&self.fork)
            .map_err(RuntimeError::driver(rank))?;
        for (chunk, range) in copy_engine_chunks(bytes).into_iter().enumerate() {
            let length = (range.end - range.start) as usize;
            let mut params = barrier;
            for source in 0..barrier.world {
                let at = range.start as usize;
                if source == rank {
                    params.buffers[source as usize] += range.start;
                    continue;
                }
                let slot = self.slot_bytes * (source - u32::from(source > rank)) as usize;
                let from = peer
                    .rank_buffer(source)
                    .expect("peer memory maps every rank's buffer");
                self.stream
                    .copy_device(scratch, slot + at, from, at, length)
                    .map_err(RuntimeError::driver(rank))?;
                params.buffers[source as usize] = scratch.address() + (slot + at) as u64;
            }
            let event = &self.chunks[chunk];
            self.stream
                .record(event)
                .map_err(RuntimeError::driver(rank))?;
            stream.wait_for(event).map_err(RuntimeError::driver(rank))?;
            params.output += range.start;
            params.input = params.buffers[rank as usize];
            params.set_all_reduce_elements(length as u64 / self.element_bytes);
            params.scratch_offset = (length as u64).next_multiple_of(ALIGNMENT_BYTES);
            stream
                .launch_loaded(&kernels.main, kernels.geometry, &params.to_bytes())
                .map_err(RuntimeError::driver(rank))?;
        }
        stream
            .launch_loaded(&kernels.end, one_block, &barrier.to_bytes())
            .map_err(RuntimeError::driver(rank))
    }

    /// Enqueues a copy-engine all-gather on `stream` with `params` (the message's row fields
    /// set, `input` this rank's rows, `output` the whole message's place at byte `at` of
    /// `output`): the start barrier; on the copy stream, forked after it, [`gather_copies`]
    /// from each owner's registered buffer straight into the output; on `stream` meanwhile the
    /// own-rows copy; the join; the end barrier. A capture on `stream` takes the copies into
    /// its graph.
    pub(super) fn enqueue_gather(
        &self,
        stream: &Stream,
        peer: &PeerMemory,
        kernels: &CopyEngineKernels,
        message: &RowMessage,
        params: &LaunchParams,
        (output, at): (&dyn DeviceMemory, usize),
    ) -> Result<(), RuntimeError> {
        let rank = self.rank;
        let driver = RuntimeError::driver(rank);
        let bytes = params.to_bytes();
        let one_block = Geometry::new(1, 32).map_err(driver)?;
        stream
            .launch_loaded(&kernels.start, one_block, &bytes)
            .map_err(driver)?;
        stream.record(&self.fork).map_err(driver)?;
        self.stream.wait_for(&self.fork).map_err(driver)?;
        for copy in gather_copies(message) {
            let from = peer
                .rank_buffer(copy.owner)
                .expect("peer memory maps every rank's buffer");
            self.stream
                .copy_device(output, at + copy.to as usize, from, 0, copy.bytes as usize)
                .map_err(driver)?;
        }
        stream
            .launch_loaded(&kernels.main, kernels.geometry, &bytes)
            .map_err(driver)?;
        let join = &self.chunks[0];
        self.stream.record(join).map_err(driver)?;
        stream.wait_for(join).map_err(driver)?;
        stream
            .launch_loaded(&kernels.end, one_block, &bytes)
            .map_err(driver)
    }
}

/// One peer's rows in a copy-engine all-gather: `bytes` from byte 0 of the owner's input region
/// (which holds its rows from their first element) to byte `to` of this rank's output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherCopy {
    /// The rank whose rows these are.
    pub owner: u32,
    /// Where they go in the output, in bytes.
    pub to: u64,
    /// How many bytes.
    pub bytes: u64,
}

/// The copies of this rank's copy-engine all-gather of `message`: one per peer that owns rows,
/// peers in the order rank + 1, rank + 2, ... (so the ranks start on different peers).
pub fn gather_copies(message: &RowMessage) -> Vec<GatherCopy> {
    let (rank, world) = (message.rank(), message.world());
    (1..world)
        .map(|k| (rank + k) % world)
        .filter_map(|owner| {
            let owned = message.owned_bytes(owner);
            (owned.end > owned.start).then(|| GatherCopy {
                owner,
                to: owned.start,
                bytes: owned.end - owned.start,
            })
        })
        .collect()
}

/// The chunks of a copy-engine launch for a message of `bytes`: byte ranges, each a whole
/// number of 16-byte vectors except the last, which ends at `bytes`.
pub fn copy_engine_chunks(bytes: u64) -> Vec<Range<u64>> {
    let per_chunk = bytes
        .div_ceil(COPY_ENGINE_MAX_CHUNKS)
        .max(COPY_ENGINE_CHUNK_BYTES)
        .next_multiple_of(ALIGNMENT_BYTES);
    (0..bytes.div_ceil(per_chunk).max(1))
        .map(|chunk| chunk * per_chunk..((chunk + 1) * per_chunk).min(bytes))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ladder::{Collective, Dtype};
    use crate::shape::Shape;

    #[test]
    fn gather_copies_bring_every_peer_s_rows_once_and_none_of_this_rank_s() {
        for world in 2..=8_u32 {
            for rows in [0, 1, u64::from(world) - 1, u64::from(world) + 1, 2047] {
                for width in [1, 7, 4096] {
                    let shape = Shape::new(rows, width).unwrap();
                    for rank in 0..world {
                        let message =
                            RowMessage::new(Collective::AllGather, shape, world, rank, Dtype::Bf16)
                                .unwrap();
                        let copies = gather_copies(&message);
                        let what = format!("{rows} x {width}, rank {rank} of {world}");
                        // Peers from rank + 1 on, each with rows once, at their rows' place.
                        let owners: Vec<u32> = copies.iter().map(|copy| copy.owner).collect();
                        let expected: Vec<u32> = (1..world)
                            .map(|k| (rank + k) % world)
                            .filter(|&q| message.owned_bytes(q).start < message.owned_bytes(q).end)
                            .collect();
                        assert_eq!(owners, expected, "{what}");
                        let mut covered = message.own_bytes();
                        for copy in &copies {
                            assert_eq!(
                                copy.to..copy.to + copy.bytes,
                                message.owned_bytes(copy.owner),
                                "{what}"
                            );
                            covered += copy.bytes;
                        }
                        assert_eq!(covered, message.message_bytes(), "{what}");
                    }
                }
            }
        }
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
                assert_eq!(pair[0].end % ALIGNMENT_BYTES, 0, "{bytes}");
                assert!(
                    pair[0].end - pair[0].start >= COPY_ENGINE_CHUNK_BYTES,
                    "{bytes}"
                );
            }
        }
        assert_eq!(copy_engine_chunks(0), vec![0..0]);
        assert_eq!(copy_engine_chunks(3 * COPY_ENGINE_CHUNK_BYTES).len(), 3);
    }
}
