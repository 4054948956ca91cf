// Runs the real kernel bodies on the host and checks them against the reference sum.
//
// Every rank runs at once, one OS thread per CUDA thread; only the inline-PTX primitives are
// replaced (host_*_prims.h), so the layouts, loops, tails, barriers, epochs, cluster exchanges
// and timeout paths are the kernels' own. Each rank runs its launches in stream order: it
// writes the next input as soon as its own previous launch ends, while peers may still be in
// theirs, so a missing barrier shows up as a wrong sum or, under ThreadSanitizer, as a race.
//
// Every mode runs each kernel in every element type (bf16, fp16, fp32), instantiated at the
// launch's world size as a package compiles it, unless it says otherwise. Modes:
//   quick        every kernel, worlds 2, 3 and 8 (bf16) or 2 and 3 (fp16, fp32), sizes around
//                every vector and slice edge and one of several simple steps a slice,
//                one launch at a time with exact scratch (guards catch overruns); a rank
//                that never launches (peers time out naming it, then return at once);
//                an invalid launch (refused with its code); those two in bf16 only
//   full         the same for every world 2..8 and two geometries per kernel
//   streams N    N rounds per world (2, 3, 4, 8 in bf16; 2, 3 otherwise) of launches back to
//                back: random kernels, sizes and geometries, every kernel repeated, and every
//                ordered pair of kernels
//   exactness    per kernel and type, a few sizes with tails at worlds 2 and 3, then one launch
//                whose last rank starts late; prints one line per kernel entry (with its
//                type), `<entry>: exact` or `<entry>: inexact (N failed checks)`, and goes on
//                past any failure (the planted-mutation tests read which kernels it broke)
// Exit status 0 when every check passed; failures are printed.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "all_reduce_full_phased.cu"
#include "all_reduce_one_shot.cu"
#include "all_reduce_one_shot_copy_engine.cu"
#include "all_reduce_one_shot_double_buffered.cu"
#include "all_reduce_rsag.cu"
#include "all_reduce_rsag_double_buffered.cu"
#include "all_reduce_rsag_phased.cu"

namespace {

using u64 = unsigned long long;

enum class Scratch {
    None,
    Slice,
    PeerMessageSlots,
    PeerSliceSlotsThenMessage,
    // Double-buffered: a region of its own, after the shared one.
    DoubleBufferedLines,
    DoubleBufferedMessageSlots,
    DoubleBufferedSliceSlotsTwice,
};

bool double_buffered(Scratch scratch) {
    return scratch == Scratch::DoubleBufferedLines ||
           scratch == Scratch::DoubleBufferedMessageSlots ||
           scratch == Scratch::DoubleBufferedSliceSlotsTwice;
}

// The element types, in the order of every per-type table here.
enum Dtype { kBf16, kFp16, kFp32, kDtypes };
const char* const kDtypeNames[kDtypes] = {"bf16", "fp16", "fp32"};
// The type every run checks; set between runs, never during one.
Dtype dtype = kBf16;

u64 element_bytes() {
    return dtype == kFp32 ? 4 : 2;
}

u64 per_vector() {
    return 16 / element_bytes();
}

using Entry = void (*)(AllReduceParams);

// An entry as the kernel's own template at the world of the launch, as a package compiled for
// that world has it; a world outside 2..8 goes to the world-2 instantiation, which refuses it.
template <typename Algorithm, typename T, bool Cluster, int N>
void entry_at(AllReduceParams params) {
    if constexpr (Cluster) {
        prepare::cluster_kernel<Algorithm, T, N>(params);
    } else {
        prepare::block_kernel<Algorithm, T, N>(params);
    }
}

template <typename Algorithm, typename T, bool Cluster>
void entry(AllReduceParams params) {
    switch (params.world) {
        case 3: entry_at<Algorithm, T, Cluster, 3>(params); break;
        case 4: entry_at<Algorithm, T, Cluster, 4>(params); break;
        case 5: entry_at<Algorithm, T, Cluster, 5>(params); break;
        case 6: entry_at<Algorithm, T, Cluster, 6>(params); break;
        case 7: entry_at<Algorithm, T, Cluster, 7>(params); break;
        case 8: entry_at<Algorithm, T, Cluster, 8>(params); break;
        default: entry_at<Algorithm, T, Cluster, 2>(params); break;
    }
}

struct Entries {
    Entry of[kDtypes];
};

template <typename Algorithm, bool Cluster = false>
constexpr Entries entries() {
    return {{&entry<Algorithm, prepare::Bf16, Cluster>, &entry<Algorithm, prepare::Fp16, Cluster>,
             &entry<Algorithm, prepare::Fp32, Cluster>}};
}

struct Kernel {
    const char* name;
    Entries entry;
    Scratch scratch;
    bool cluster;
    // Reads this rank's message only locally, through params.input (prepare::kernels::
    // InputAccess::Local): the message may be anywhere, the output may be the input.
    bool local_input;
    // A copy-engine kernel's start and end barriers: the host copies the peers' chunks between
    // them (copy_engine_launch); null for every other kernel.
    bool copy_engine = false;
    Entries start = {};
    Entries end = {};
};

const Kernel kKernels[] = {
    {"one_shot_copy_engine", entries<prepare::CopyEngineSum>(), Scratch::None, false, false, true,
     entries<prepare::CopyEngineBarrier<prepare::kSetStart>>(),
     entries<prepare::CopyEngineBarrier<prepare::kSetEnd>>()},
    {"one_shot_pull", entries<prepare::OneShotPull>(), Scratch::None, false, false},
    {"one_shot_push", entries<prepare::OneShotPush>(), Scratch::PeerMessageSlots, false, true},
    {"one_shot_push_ll", entries<prepare::OneShotPushLl>(), Scratch::DoubleBufferedLines, false,
     true},
    {"one_shot_push_simple", entries<prepare::OneShotPushSimple>(),
     Scratch::DoubleBufferedMessageSlots, false, true},
    {"rsag_pull", entries<prepare::RsagPull>(), Scratch::Slice, false, false},
    {"rsag_push", entries<prepare::RsagPush>(), Scratch::PeerSliceSlotsThenMessage, false, true},
    {"rsag_push_simple", entries<prepare::RsagPushSimple>(),
     Scratch::DoubleBufferedSliceSlotsTwice, false, true},
    {"rsag_phased", entries<prepare::RsagPhased, true>(), Scratch::PeerSliceSlotsThenMessage, true,
     true},
    {"full_phased", entries<prepare::FullPhased, true>(), Scratch::PeerMessageSlots, true, true},
};

u64 round_up(u64 value, u64 multiple) {
    return (value + multiple - 1) / multiple * multiple;
}

// Mirror of prepare::kernels::scratch_bytes.
u64 scratch_bytes(Scratch scratch, u64 world, u64 elements) {
    const u64 message = round_up(elements * element_bytes(), 16);
    const u64 slot = ((elements / per_vector() + world - 1) / world + 1) * 16;
    // Room for every message up to `elements` (a smaller one can take more lines).
    const u64 lines = 2 * (elements / per_vector()) + per_vector() - 1;
    const u64 chunk = PREPARE_DOUBLE_BUFFER_CHUNK_BYTES;
    switch (scratch) {
        case Scratch::None: return 0;
        case Scratch::Slice: return slot;
        case Scratch::PeerMessageSlots: return (world - 1) * message;
        case Scratch::PeerSliceSlotsThenMessage: return (world - 1) * slot + message;
        case Scratch::DoubleBufferedLines: return 2 * (world - 1) * round_up(lines * 16, chunk);
        case Scratch::DoubleBufferedMessageSlots:
            return 2 * (world - 1) * round_up(message, chunk);
        case Scratch::DoubleBufferedSliceSlotsTwice:
            return 2 * 2 * (world - 1) * round_up(slot, chunk);
    }
    return 0;
}

float bf16_to_float(unsigned bits) {
    return __uint_as_float(bits << 16);
}

unsigned float_to_bf16(float value) {
    const unsigned bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return 0x7fff;
    return (bits + 0x7fff + ((bits >> 16) & 1)) >> 16;
}

// fp16 through the compiler's own IEEE binary16, independent of the kernels' bit arithmetic.
float fp16_to_float(unsigned bits) {
    const unsigned short half_bits = static_cast<unsigned short>(bits);
    _Float16 value;
    std::memcpy(&value, &half_bits, 2);
    return static_cast<float>(value);
}

unsigned float_to_fp16(float value) {
    if (value != value)
        return 0x7fff;
    const _Float16 half = static_cast<_Float16>(value);
    unsigned short bits;
    std::memcpy(&bits, &half, 2);
    return bits;
}

float element_to_float(unsigned bits) {
    switch (dtype) {
        case kBf16: return bf16_to_float(bits);
        case kFp16: return fp16_to_float(bits);
        default: return __uint_as_float(bits);
    }
}

unsigned float_to_element(float value) {
    switch (dtype) {
        case kBf16: return float_to_bf16(value);
        case kFp16: return float_to_fp16(value);
        default: return value != value ? 0x7fffffffu : __float_as_uint(value);
    }
}

// Rank `rank`'s element `e` in launch `launch`: mostly ordinary magnitudes, any bits otherwise
// (signed zeros, subnormals, huge values, infinities, NaNs).
unsigned input_value(u64 seed, unsigned launch, unsigned rank, u64 e) {
    u64 x = seed ^ (u64(launch) << 40) ^ (u64(rank) << 32) ^ e;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    const bool ordinary = (x >> 20) % 4 != 0;
    switch (dtype) {
        case kBf16: {
            unsigned value = static_cast<unsigned short>(x);
            return ordinary ? (value & 0x807f) | ((112 + (x >> 24) % 31) << 7) : value;
        }
        case kFp16: {
            unsigned value = static_cast<unsigned short>(x);
            return ordinary ? (value & 0x83ff) | ((5 + (x >> 24) % 21) << 10) : value;
        }
        default: {
            unsigned value = static_cast<unsigned>(x >> 8);
            return ordinary ? (value & 0x807fffffu) | ((112 + (x >> 24) % 31) << 23) : value;
        }
    }
}

unsigned reference(u64 seed, unsigned launch, unsigned world, u64 e) {
    float sum = element_to_float(input_value(seed, launch, 0, e));
    for (unsigned q = 1; q < world; ++q)
        sum += element_to_float(input_value(seed, launch, q, e));
    return float_to_element(sum);
}

void put_element(unsigned char* base, u64 e, unsigned value) {
    std::memcpy(base + e * element_bytes(), &value, element_bytes());
}

unsigned get_element(const unsigned char* base, u64 e) {
    unsigned value = 0;
    std::memcpy(&value, base + e * element_bytes(), element_bytes());
    return value;
}

int failures = 0;
std::mutex print_mutex;
// Failures printed; past them the harness stops, unless it is to go on (exactness mode).
constexpr int kPrintedFailures = 40;
bool stop_after_printed_failures = true;

#define CHECK(condition, ...)                              \
    do {                                                   \
        if (!(condition)) {                                \
            std::lock_guard<std::mutex> lock(print_mutex); \
            if (++failures <= kPrintedFailures) {          \
                std::printf("FAIL line %d: ", __LINE__);   \
                std::printf(__VA_ARGS__);                  \
                std::printf("\n");                         \
            } else if (stop_after_printed_failures) {      \
                std::exit(1);                              \
            }                                              \
        }                                                  \
    } while (0)

struct Launch {
    const Kernel* kernel;
    unsigned blocks;
    unsigned threads;
    unsigned cluster_size;  // CTAs per cluster (cluster kernels)
    u64 elements;
};

Launch geometry(const Kernel& kernel, unsigned variant, u64 elements) {
    if (kernel.cluster) {
        const unsigned size = variant == 0 ? 2 : variant == 1 ? 8 : 2 + variant % 3;
        return {&kernel, size * (1 + variant % 2), 32, size, elements};
    }
    return {&kernel, 1 + variant % 5, variant == 1 ? 64u : 32u, 1, elements};
}

// Ranks' persistent memory: signal flags and state words live across launches.
struct Rank {
    std::vector<u64> signals = std::vector<u64>(PREPARE_SIGNAL_WORDS, 0);
    std::vector<u64> state = std::vector<u64>(PREPARE_STATE_WORDS, 0);
};

// Where a launch's message is and its sum goes, as the serving handle passes a server's memory
// to a kernel that reads its message only locally.
enum class Operands {
    Registered,  // the message in the registered buffer, the sum into a separate output
    Separate,    // the message in memory of its own, the registered input region poisoned
    InPlace,     // the message in the output, summed over itself, the input region poisoned
};

struct Options {
    std::vector<bool> present;  // ranks that launch at all
    Operands operands = Operands::Registered;
    u64 timeout_ns = 10'000'000'000ull;
    u64 extra_offset = 0;  // input region beyond the largest message
    // When not 0, double-buffered regions are sized for messages up to this many elements alone,
    // as the host sizes them for a bucket's largest message (every launch must be smaller).
    u64 region_elements = 0;
    bool expect_success = true;  // check outputs (else only report abort words)
    // The last rank writes each input and launches this long after its previous launch ended.
    std::chrono::milliseconds last_rank_late{0};
};

constexpr int kGuard = 64;
// After the buffer: wide enough to hold any double-buffered write one chunk past its region
// (chunks of both parities and every slot lie between), so an overrun lands here.
constexpr int kBufferGuard = 2 * PREPARE_MAX_RANKS * PREPARE_DOUBLE_BUFFER_CHUNK_BYTES * 2;
constexpr unsigned char kBufferFill = 0xEE;

// Runs one launch of one rank: every block's threads, joined (the launch ends).
void launch_rank(const Launch& launch, const AllReduceParams& params) {
    const unsigned cluster_size = launch.kernel->cluster ? launch.cluster_size : 1;
    std::vector<std::unique_ptr<std::barrier<>>> barriers;
    std::vector<std::unique_ptr<EmuBlock>> blocks;
    std::vector<std::unique_ptr<EmuBlock*[]>> clusters;
    std::vector<std::thread> threads;
    for (unsigned cluster = 0; cluster < launch.blocks / cluster_size; ++cluster) {
        barriers.emplace_back(new std::barrier<>(cluster_size * launch.threads));
        std::barrier<>* cluster_barrier = barriers.back().get();
        clusters.emplace_back(new EmuBlock*[cluster_size]);
        EmuBlock** members = clusters.back().get();
        for (unsigned cta = 0; cta < cluster_size; ++cta) {
            barriers.emplace_back(new std::barrier<>(launch.threads));
            blocks.emplace_back(new EmuBlock{
                barriers.back().get(), cluster_barrier, cta, cluster_size, cluster, members, {}});
            std::memset(blocks.back()->shared, 0xAB, sizeof blocks.back()->shared);
            members[cta] = blocks.back().get();
        }
        for (unsigned cta = 0; cta < cluster_size; ++cta) {
            for (unsigned thread = 0; thread < launch.threads; ++thread) {
                threads.emplace_back(
                    [&, block = members[cta], index = cluster * cluster_size + cta, thread] {
                        threadIdx = {thread, 0, 0};
                        blockIdx = {index, 0, 0};
                        blockDim = {launch.threads, 1, 1};
                        gridDim = {launch.blocks, 1, 1};
                        emu_block = block;
                        launch.kernel->entry.of[dtype](params);
                    });
            }
        }
    }
    for (std::thread& thread : threads)
        thread.join();
}

// Chunks of a copy-engine launch here: small, so that even short messages take several and a
// tail (the host's are at least 16 MiB, src/collective.rs).
constexpr u64 kCopyEngineChunkBytes = 80;

// One rank's copy-engine launch as the host enqueues it (src/collective.rs): the start barrier;
// per chunk, every peer's chunk copied into this rank's private scratch (the copy engine), then
// the chunk's sum; the end barrier. Here the copies run on the rank's own thread in stream
// order, so a missing barrier shows as a race on the peers' inputs.
void copy_engine_launch(const Launch& launch, const AllReduceParams& params, unsigned char* scratch,
                        u64 slot_bytes) {
    const Kernel start = {"start", launch.kernel->start, Scratch::None, false, false};
    const Kernel end = {"end", launch.kernel->end, Scratch::None, false, false};
    // The barriers run on one block of 32 threads, as the host launches them.
    launch_rank({&start, 1, 32, 1, launch.elements}, params);
    const u64 bytes = launch.elements * element_bytes();
    for (u64 first = 0; first < bytes || first == 0; first += kCopyEngineChunkBytes) {
        const u64 length = std::min(kCopyEngineChunkBytes, bytes - first);
        AllReduceParams chunk = params;
        for (unsigned q = 0; q < params.world; ++q) {
            if (q == params.rank) {
                chunk.buffers[q] = params.buffers[q] + first;
                continue;
            }
            unsigned char* slot = scratch + slot_bytes * (q - (q > params.rank ? 1 : 0)) + first;
            std::memcpy(slot, params.buffers[q] + first, length);
            chunk.buffers[q] = slot;
        }
        chunk.output = static_cast<unsigned char*>(params.output) + first;
        chunk.elements = length / element_bytes();
        chunk.scratch_offset = round_up(length, 16);
        launch_rank({launch.kernel, launch.blocks, launch.threads, 1, chunk.elements}, chunk);
        if (bytes == 0)
            break;
    }
    launch_rank({&end, 1, 32, 1, launch.elements}, params);
}

// Every present rank runs `sequence` in stream order; returns each rank's abort word.
std::vector<u64> run(std::vector<Rank>& ranks, const std::vector<Launch>& sequence,
                     const Options& options, u64 seed) {
    const unsigned world = static_cast<unsigned>(ranks.size());
    // As the host lays it out: the input region, the barrier kernels' shared scratch, then one
    // zeroed region per double-buffered kernel.
    u64 max_elements = 0, max_shared = 0;
    std::vector<u64> own_bytes(std::size(kKernels), 0);
    for (const Launch& launch : sequence) {
        max_elements = std::max(max_elements, launch.elements);
        const u64 bytes = scratch_bytes(launch.kernel->scratch, world, launch.elements);
        if (double_buffered(launch.kernel->scratch)) {
            u64& own = own_bytes[launch.kernel - kKernels];
            own = options.region_elements != 0
                      ? scratch_bytes(launch.kernel->scratch, world, options.region_elements)
                      : std::max(own, bytes);
        } else {
            max_shared = std::max(max_shared, bytes);
        }
    }
    const u64 shared_offset = round_up(max_elements * element_bytes(), 16) + options.extra_offset;
    std::vector<u64> own_offsets(std::size(kKernels), 0);
    u64 buffer_bytes = shared_offset + max_shared;
    for (std::size_t k = 0; k < std::size(kKernels); ++k) {
        own_offsets[k] = buffer_bytes;
        buffer_bytes += own_bytes[k];
    }
    std::vector<std::unique_ptr<unsigned char[]>> buffers(world);
    for (auto& buffer : buffers) {
        buffer.reset(new (std::align_val_t(16)) unsigned char[buffer_bytes + kBufferGuard]);
        std::memset(buffer.get(), kBufferFill, buffer_bytes + kBufferGuard);
        for (std::size_t k = 0; k < std::size(kKernels); ++k)
            std::memset(buffer.get() + own_offsets[k], 0, own_bytes[k]);
    }
    // The copy-engine kernels' private scratch: a slot of the largest message per peer.
    const u64 slot_bytes = round_up(max_elements * element_bytes(), 16);
    std::vector<std::unique_ptr<unsigned char[]>> copy_scratch(world);
    for (auto& scratch : copy_scratch) {
        scratch.reset(new (std::align_val_t(16)) unsigned char[slot_bytes * (world - 1) + 16]);
        std::memset(scratch.get(), kBufferFill, slot_bytes * (world - 1) + 16);
    }
    std::vector<std::thread> streams;
    for (unsigned rank = 0; rank < world; ++rank) {
        if (!options.present[rank])
            continue;
        streams.emplace_back([&, rank] {
            for (unsigned index = 0; index < sequence.size(); ++index) {
                const Launch& launch = sequence[index];
                if (rank == world - 1)
                    std::this_thread::sleep_for(options.last_rank_late);
                const u64 output_bytes = launch.elements * element_bytes();
                std::unique_ptr<unsigned char[]> output(
                    new (std::align_val_t(16)) unsigned char[output_bytes + kGuard]);
                std::memset(output.get(), 0xCC, output_bytes + kGuard);
                std::unique_ptr<unsigned char[]> own_input(
                    new (std::align_val_t(16)) unsigned char[output_bytes + 16]);
                unsigned char* input = buffers[rank].get();
                if (options.operands != Operands::Registered) {
                    // A kernel that read the registered input region would sum this poison.
                    std::memset(buffers[rank].get(), 0x5A, output_bytes);
                    input = options.operands == Operands::InPlace ? output.get() : own_input.get();
                }
                for (u64 e = 0; e < launch.elements; ++e)
                    put_element(input, e, input_value(seed, index, rank, e));
                AllReduceParams params;
                std::memset(&params, 0, sizeof params);
                for (unsigned q = 0; q < world; ++q) {
                    params.buffers[q] = buffers[q].get();
                    params.signals[q] = ranks[q].signals.data();
                }
                params.state = ranks[rank].state.data();
                params.output = output.get();
                params.input = input;
                params.elements = launch.elements;
                params.scratch_offset = double_buffered(launch.kernel->scratch)
                                            ? own_offsets[launch.kernel - kKernels]
                                            : shared_offset;
                params.timeout_ns = options.timeout_ns;
                params.rank = rank;
                params.world = world;
                if (launch.kernel->copy_engine) {
                    copy_engine_launch(launch, params, copy_scratch[rank].get(), slot_bytes);
                } else {
                    launch_rank(launch, params);
                }
                for (int g = 0; g < kGuard; ++g) {
                    CHECK(output[output_bytes + g] == 0xCC,
                          "%s world %u elements %llu rank %u: wrote past the output",
                          launch.kernel->name, world, launch.elements, rank);
                }
                if (!options.expect_success)
                    continue;
                const u64 abort = ranks[rank].state[0];
                CHECK(abort == 0, "%s world %u elements %llu launch %u rank %u: aborted %llx",
                      launch.kernel->name, world, launch.elements, index, rank, abort);
                if (abort != 0)
                    return;
                u64 wrong = 0, first = 0;
                for (u64 e = 0; e < launch.elements; ++e) {
                    const unsigned got = get_element(output.get(), e);
                    if (got != reference(seed, index, world, e) && wrong++ == 0)
                        first = e;
                }
                CHECK(wrong == 0,
                      "%s world %u elements %llu blocks %u threads %u launch %u rank %u: %llu "
                      "wrong, first at %llu",
                      launch.kernel->name, world, launch.elements, launch.blocks, launch.threads,
                      index, rank, wrong, first);
                for (u64 e = 0; options.operands != Operands::InPlace && e < launch.elements;
                     ++e) {
                    const unsigned kept = get_element(input, e);
                    CHECK(kept == input_value(seed, index, rank, e),
                          "%s rank %u: input element %llu changed", launch.kernel->name, rank, e);
                    if (kept != input_value(seed, index, rank, e))
                        break;
                }
            }
        });
    }
    for (std::thread& stream : streams)
        stream.join();
    std::vector<u64> aborts(world);
    for (unsigned rank = 0; rank < world; ++rank) {
        aborts[rank] = ranks[rank].state[0];
        for (int g = 0; g < kBufferGuard; ++g) {
            CHECK(buffers[rank][buffer_bytes + g] == kBufferFill,
                  "rank %u: wrote past the scratch region", rank);
        }
    }
    return aborts;
}

std::mt19937_64 random_source(20240601);

void single_launches(const std::vector<unsigned>& worlds, unsigned variants) {
    for (unsigned world : worlds) {
        std::vector<Rank> ranks(world);
        std::vector<u64> sizes = {0, 1, 7, 8, 9, 15, 16, 17, 100, 1001};
        // The slice edges; then slices of three steps and a bit for one block of 32 threads in
        // the simple protocol (4 vectors a thread a step), so its stages overlap.
        for (u64 size : {per_vector() * world - 1, per_vector() * world,
                         per_vector() * world + per_vector() - 1, 2 * per_vector() * world + 3,
                         per_vector() * world * (3 * 4 * 32 + 5) + 3})
            sizes.push_back(size);
        for (const Kernel& kernel : kKernels) {
            for (u64 elements : sizes) {
                for (unsigned variant = 0; variant < variants; ++variant) {
                    Options options;
                    options.present.assign(world, true);
                    options.extra_offset = variant * 256;
                    run(ranks, {geometry(kernel, variant, elements)}, options, random_source());
                }
            }
        }
    }
}

// The double-buffered kernels around their 8 KiB chunk boundaries (2048 elements of lines,
// 4096 of slots), with regions sized for the largest size as a bucket's are: a few elements
// less can take more lines, and the guard bytes after the region catch an overrun.
void chunk_edges() {
    for (const Kernel& kernel : kKernels) {
        if (!double_buffered(kernel.scratch))
            continue;
        for (unsigned world : {2u, 3u}) {
            std::vector<Rank> ranks(world);
            // The same bytes in every type: 4 KiB, 8 KiB and 16 KiB messages.
            for (u64 largest : {4096 / element_bytes(), 8192 / element_bytes(),
                                16384 / element_bytes()}) {
                std::vector<Launch> sequence;
                for (u64 less = 0; less <= 9; ++less)
                    sequence.push_back(geometry(kernel, 1 + less % 3, largest - less));
                Options options;
                options.present.assign(world, true);
                options.region_elements = largest;
                run(ranks, sequence, options, random_source());
            }
        }
    }
}

void timeouts() {
    const unsigned world = 3;
    const u64 timeout = PREPARE_ABORT_FLAG | (PREPARE_ABORT_PEER_TIMEOUT << 32);
    for (const Kernel& kernel : kKernels) {
        std::vector<Rank> ranks(world);
        const Launch launch = geometry(kernel, 1, 77);
        Options options;
        options.present = {true, true, true};
        run(ranks, {launch}, options, random_source());
        // Rank 2 never launches: its peers give up naming it.
        options.present = {true, true, false};
        options.timeout_ns = 200'000'000;
        options.expect_success = false;
        std::vector<u64> aborts = run(ranks, {launch}, options, random_source());
        CHECK(aborts[0] == (timeout | 2) && aborts[1] == (timeout | 2), "%s: abort words %llx %llx",
              kernel.name, aborts[0], aborts[1]);
        // The abort is sticky: ranks 0 and 1 return at once; rank 2 waits for them in vain.
        options.present = {true, true, true};
        const auto start = std::chrono::steady_clock::now();
        aborts = run(ranks, {launch, launch, launch}, options, random_source());
        const double seconds =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        CHECK(aborts[0] == (timeout | 2) && aborts[1] == (timeout | 2),
              "%s: the abort word changed", kernel.name);
        CHECK(aborts[2] == (timeout | 0) || aborts[2] == (timeout | 1),
              "%s: rank 2's abort word %llx", kernel.name, aborts[2]);
        CHECK(seconds < 1.0, "%s: three launches after an abort took %.2f s", kernel.name, seconds);
    }
}

void invalid_launches() {
    const u64 invalid = PREPARE_ABORT_FLAG | (PREPARE_ABORT_INVALID_LAUNCH << 32);
    for (const Kernel& kernel : kKernels) {
        std::vector<Rank> ranks(4);
        Launch launch = geometry(kernel, 0, 64);
        launch.threads = 2;  // fewer threads than ranks cannot raise every flag
        Options options;
        options.present.assign(4, true);
        options.expect_success = false;
        const std::vector<u64> aborts = run(ranks, {launch}, options, random_source());
        for (unsigned rank = 0; rank < 4; ++rank) {
            CHECK(aborts[rank] == (invalid | rank), "%s rank %u: abort word %llx", kernel.name,
                  rank, aborts[rank]);
        }
    }
}

void streams(const std::vector<unsigned>& worlds, unsigned rounds) {
    for (unsigned world : worlds) {
        for (unsigned round = 0; round < rounds; ++round) {
            std::vector<Launch> sequence;
            for (int i = 0; i < 24; ++i) {
                const Kernel& kernel = kKernels[random_source() % std::size(kKernels)];
                sequence.push_back(
                    geometry(kernel, 2 + random_source() % 6, random_source() % 600));
            }
            for (const Kernel& kernel : kKernels) {
                for (int i = 0; i < 4; ++i)
                    sequence.push_back(geometry(kernel, 0, 100 + random_source() % 300));
            }
            // Each launch after every other kernel, whose layout and barriers differ.
            for (const Kernel& first : kKernels) {
                for (const Kernel& second : kKernels) {
                    sequence.push_back(geometry(first, 0, 200 + random_source() % 200));
                    sequence.push_back(geometry(second, 0, 200 + random_source() % 200));
                }
            }
            std::vector<Rank> ranks(world);
            Options options;
            options.present.assign(world, true);
            run(ranks, sequence, options, random_source());
        }
    }
}

// A kernel that reads a peer's input without waiting for the peer to start reads stale bytes
// when that peer is late. The race is caught reliably: the late rank starts 200 ms after the
// others, far longer than an on-time rank takes to reach the peer's input, which holds the
// buffer's fill bytes until then.
void exactness() {
    stop_after_printed_failures = false;
    for (const Kernel& kernel : kKernels) {
        const int before = failures;
        for (unsigned world : {2u, 3u}) {
            std::vector<Rank> ranks(world);
            for (u64 elements : {per_vector() * world + per_vector() - 1, 100ull, 1001ull}) {
                Options options;
                options.present.assign(world, true);
                run(ranks, {geometry(kernel, 0, elements)}, options, random_source());
            }
        }
        std::vector<Rank> ranks(2);
        Options late;
        late.present.assign(2, true);
        late.last_rank_late = std::chrono::milliseconds(200);
        run(ranks, {geometry(kernel, 0, 203)}, late, random_source());
        std::lock_guard<std::mutex> lock(print_mutex);
        if (failures == before) {
            std::printf("all_reduce_%s_%s: exact\n", kernel.name, kDtypeNames[dtype]);
        } else {
            std::printf("all_reduce_%s_%s: inexact (%d failed checks)\n", kernel.name,
                        kDtypeNames[dtype], failures - before);
        }
    }
}

// Every kernel that reads its message only locally, on a server's memory: the message in a
// buffer of its own, and in place in the output, at every world size given.
void operands(const std::vector<unsigned>& worlds) {
    for (unsigned world : worlds) {
        std::vector<Rank> ranks(world);
        for (const Kernel& kernel : kKernels) {
            if (!kernel.local_input)
                continue;
            for (Operands mode : {Operands::Separate, Operands::InPlace}) {
                for (u64 elements : {1ull, per_vector() * world + per_vector() - 1, 1001ull}) {
                    Options options;
                    options.present.assign(world, true);
                    options.operands = mode;
                    run(ranks, {geometry(kernel, 0, elements)}, options, random_source());
                }
            }
        }
    }
}

}  // namespace

// Runs `check` once per element type.
template <typename Check>
void for_each_dtype(Check check) {
    for (int type = 0; type < kDtypes; ++type) {
        dtype = static_cast<Dtype>(type);
        check();
    }
    dtype = kBf16;
}

int main(int argc, char** argv) {
    const std::string mode = argc > 1 ? argv[1] : "quick";
    if (mode == "quick") {
        // Eight ranks, the slowest to emulate, in bf16 only: the types differ in their element
        // arithmetic and layout, which two and three ranks reach.
        for_each_dtype([] {
            const std::vector<unsigned> worlds =
                dtype == kBf16 ? std::vector<unsigned>{2, 3, 8} : std::vector<unsigned>{2, 3};
            single_launches(worlds, 1);
            operands(worlds);
            chunk_edges();
        });
        // The flags, deadlines and launch checks do not depend on the element type.
        timeouts();
        invalid_launches();
    } else if (mode == "full") {
        for_each_dtype([] {
            single_launches({2, 3, 4, 5, 6, 7, 8}, 2);
            operands({2, 3, 4, 5, 6, 7, 8});
            chunk_edges();
        });
        timeouts();
        invalid_launches();
    } else if (mode == "streams") {
        const unsigned rounds = argc > 2 ? static_cast<unsigned>(std::atoi(argv[2])) : 1;
        // Every type at two and three ranks, bf16 also at four and eight.
        for_each_dtype([rounds] {
            streams(dtype == kBf16 ? std::vector<unsigned>{2, 3, 4, 8} : std::vector<unsigned>{2, 3},
                    rounds);
        });
    } else if (mode == "exactness") {
        for_each_dtype([] { exactness(); });
    } else {
        std::printf("unknown mode %s\n", mode.c_str());
        return 2;
    }
    std::printf("%s: %s\n", mode.c_str(), failures == 0 ? "every check passed" : "FAILED");
    return failures == 0 ? 0 : 1;
}
