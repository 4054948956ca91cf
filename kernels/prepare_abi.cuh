// prepare_abi.cuh: the launch contract shared by every custom kernel and the host.
//
// Every kernel of every collective (all_reduce, reduce_scatter, all_gather,
// all_reduce_add_rms_norm) takes one LaunchParams by value. The host mirror is
// `prepare::abi::LaunchParams` (#[repr(C)]); keep the two identical.
//
// Memory each rank registers once and shares with its peers by CUDA IPC:
//   buffer:  [0, input region)                the message, for kernels whose peers read it
//            then the scratch the algorithms need (push slots, slices), from `scratch_offset`.
//            Kernels that start with a barrier share one scratch region right after the input;
//            each double-buffered kernel (no barrier: flags travel with the data) has a region
//            of its own after that, which no other kernel touches, and is launched with
//            `scratch_offset` pointing at it.
//   signals: PREPARE_SIGNAL_WORDS 64-bit flags, written by peers with st.release.sys and read
//            by the owner with ld.acquire.sys; zeroed once at allocation, never reset.
//   state:   local only: state[0] is the sticky abort word, state[1 + b] block b's epoch, then
//            the double-buffered kernels' launch count, one copy per block number, then the
//            arrivals: when block b last began a launch (%globaltimer, written by the block
//            alone), so a deadline passed while some block had not started yet is told from a
//            kernel's failure.
// After an abort the ranks' epochs may disagree: only zeroing every rank's signals, state and
// scratch together (no launch in flight anywhere) makes the kernels usable again.
// Epochs live in device memory and advance on every launch, so a captured graph replays any
// number of times. A spin that passes `timeout_ns` (against %globaltimer) stores an abort code
// in state[0] and returns; every later launch sees it and returns at once.
#pragma once

#define PREPARE_MAX_RANKS 8
#define PREPARE_MAX_BLOCKS 1024
// Flag sets per rank: one per barrier a kernel may use in one launch (start, middle, end), the
// step flags of the double-buffered kernels (two sets: a second phase has its own), two sets
// that together hold the shape lines (prepare_sync.cuh: the start barrier's shape check), then
// four that hold the double-buffered kernels' shape lines, one pair of sets per parity
// (prepare_double_buffer.cuh: their shape check).
#define PREPARE_SIGNAL_SETS 12
// signals[set][source_rank][block]; the shape lines: 16 bytes per (source rank, block) from set
// PREPARE_SHAPE_SET, signals[PREPARE_SHAPE_SET][0][0] + 2 * (source_rank * MAX_BLOCKS + block);
// the double-buffered kernels' from set PREPARE_LINE_SHAPE_SET, 16 bytes per (parity, source
// rank, block): + 2 * ((parity * MAX_RANKS + source_rank) * MAX_BLOCKS + block).
#define PREPARE_SIGNAL_WORDS (PREPARE_SIGNAL_SETS * PREPARE_MAX_RANKS * PREPARE_MAX_BLOCKS)
#define PREPARE_SHAPE_SET 6
#define PREPARE_LINE_SHAPE_SET 8
#define PREPARE_STATE_WORDS (1 + 3 * PREPARE_MAX_BLOCKS)
// Launches of double-buffered kernels so far, one copy per block number: block b reads
// state[PREPARE_STATE_LAUNCH_WORDS + b].
#define PREPARE_STATE_LAUNCH_WORDS (1 + PREPARE_MAX_BLOCKS)
// When block b last began a launch past its checks: state[PREPARE_STATE_ARRIVAL_WORDS + b].
#define PREPARE_STATE_ARRIVAL_WORDS (1 + 2 * PREPARE_MAX_BLOCKS)

// Abort word: 0 while healthy; otherwise PREPARE_ABORT_FLAG | (reason << 32) | rank, where
// rank is the peer that did not arrive (PEER_TIMEOUT), this rank (INVALID_LAUNCH), or the peer
// whose message has another shape than this rank's (SHAPE_MISMATCH).
#define PREPARE_ABORT_FLAG 0x8000000000000000ull
#define PREPARE_ABORT_PEER_TIMEOUT 1ull
// The parameters or geometry break this contract (world, rank, alignment, sizes, cluster).
#define PREPARE_ABORT_INVALID_LAUNCH 2ull
// A peer's launch of the same message has another shape (elements, rows). A kernel with the
// start barrier read and wrote nothing of the message (prepare_sync.cuh: its shape check); a
// double-buffered one may have written its output and its region, nothing else
// (prepare_double_buffer.cuh: their shape check).
#define PREPARE_ABORT_SHAPE_MISMATCH 3ull
// The shape words carry their message's element count and rows below 2^48 (more than any
// memory holds) and, above those, a tag of the launch's epoch.
#define PREPARE_SHAPE_BITS 48
// Every pointer in the parameters and `scratch_offset` are multiples of this.
#define PREPARE_ALIGNMENT_BYTES 16
// The fused epilogue's sum of squares of a row: lane l of PREPARE_NORM_LANES sums, from +0, the
// squares of elements l, l + LANES, l + 2 LANES, ... in increasing order; then a pairwise tree
// over the lanes (lanes 2i and 2i + 1, then pairs of those, ...). prepare::reference::epilogue.
#define PREPARE_NORM_LANES 2048

// A message is rows x width elements. Which fields each collective reads, beyond the buffers,
// signals, state, scratch_offset, timeout_ns, rank and world that every kernel reads:
//   all_reduce               input, output, input_elements (the message; output_elements is the
//                            same, rows 1 and width the count, unread; the epilogue's null, 0)
//   reduce_scatter           input (rows x width), output (this rank's rows), input_elements,
//                            output_elements, rows, width
//   all_gather               input (this rank's rows), output (rows x width), input_elements,
//                            output_elements, rows, width
//   all_reduce_add_rms_norm  the all-reduce's, and rows, width (the hidden size), residual,
//                            weight, normed and eps
//   add_rms_norm (the unfused epilogue after an all-reduce kernel, local memory only): input
//                            (the sum, rows x width), rows, width, residual, weight, normed,
//                            eps, rank, world, and state when it is not null
// The fields every all-reduce kernel reads come first, at the offsets they have always had.
struct LaunchParams {
    // buffers[r]: rank r's registered buffer mapped into this process; buffers[rank] is local.
    unsigned char* buffers[PREPARE_MAX_RANKS];
    // signals[r]: rank r's signal flags mapped into this process.
    unsigned long long* signals[PREPARE_MAX_RANKS];
    // This rank's state words (abort word, per-block epochs, per-block launch counts).
    unsigned long long* state;
    // Where the result goes: local memory, which may be `input` itself (in place) but not a
    // registered buffer's scratch. Kernels whose peers read the input region (one-shot pull,
    // RSAG pull, the copy-engine one-shot) need it outside buffers[rank]'s input region unless
    // the kernel says otherwise.
    void* output;
    // This rank's message, read only by this rank: kernels that read their own input locally
    // (every push kernel) read it here, so it may be any local memory, `output` included.
    // Kernels whose peers read the input read buffers[rank] instead; the host copies the
    // message there first unless it already is there.
    const unsigned char* input;
    // Elements of this rank's input (any count up to the bucket's capacity; tails included).
    unsigned long long input_elements;
    // Byte offset of this kernel's scratch region inside every rank's buffer (the same on every
    // rank); at least 2 * input_elements.
    unsigned long long scratch_offset;
    // Deadline for every spin, in nanoseconds of %globaltimer from the kernel's start.
    unsigned long long timeout_ns;
    unsigned int rank;
    unsigned int world;
    // Elements of this rank's output.
    unsigned long long output_elements;
    // The message's shape: rows x width elements (an all-reduce's: 1 x input_elements).
    unsigned long long rows;
    unsigned long long width;
    // The fused epilogue's operands (all_reduce_add_rms_norm; null for every other collective):
    // the residual added to the sum, the RMSNorm's weight (width elements), and where the
    // normalised rows go.
    void* residual;
    const void* weight;
    void* normed;
    // The RMSNorm's epsilon (0 for every other collective).
    float eps;
    // Always 0: the struct's tail, explicit so that it has no implicit padding.
    unsigned int padding;
};
