//! The copy-engine candidates: the peers' messages are copied chunk by chunk into this rank's
//! scratch by the copy engines, each chunk summed as soon as its copies are done, between two
//! barrier kernels (kernels/all_reduce_one_shot_copy_engine.cu says what runs where).

use std::ops::Range;
use std::time::Duration;

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
    /// The chunk sum, with the candidate's geometry.
    pub(super) sum: LoadedKernel,
    pub(super) geometry: Geometry,
    /// The start and end barriers, one block each.
    pub(super) start: LoadedKernel,
    pub(super) end: LoadedKernel,
}

/// What the copy-engine candidates share on one rank: the stream their copies go on, the events
/// that order each chunk's sum after its copies, and the scratch the peers' messages are copied
/// into (per peer one slot of the largest message of the buckets that have such a candidate,
/// private to this rank).
#[derive(Debug)]
pub(super) struct CopyEngine {
    stream: Stream,
    fork: Event,
    chunks: Vec<Event>,
    scratch: DeviceBuffer,
    slot_bytes: usize,
    element_bytes: u64,
    timeout: Duration,
    rank: u32,
}

impl CopyEngine {
    /// The copy stream, its events and `slot_bytes` of scratch per peer, on this rank's GPU;
    /// messages of `element_bytes` elements, kernels bounded by `timeout`.
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
            scratch: device
                .allocate(slot_bytes * peers)
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
                    .copy_device(&self.scratch, slot + at, from, at, length)
                    .map_err(RuntimeError::driver(rank))?;
                params.buffers[source as usize] = self.scratch.address() + (slot + at) as u64;
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
                .launch_loaded(&kernels.sum, kernels.geometry, &params.to_bytes())
                .map_err(RuntimeError::driver(rank))?;
        }
        stream
            .launch_loaded(&kernels.end, one_block, &barrier.to_bytes())
            .map_err(RuntimeError::driver(rank))
    }
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
