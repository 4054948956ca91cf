// Batch invariance: a row's sum is the same bytes whatever message it is summed in.
//
// One matrix of rows, kRowWidth elements each, holds every rank's data: rank q's element c of
// row r is input_value(seed, r, q, c) (the harness's data: signed zeros, subnormals, huge
// values, infinities, NaNs), so a row has the same inputs in every message that holds it. Per
// world and type, rows around one spot are all-reduced inside messages of 1 row, 3, as many
// as fit below a bucket boundary of a shipped ladder and one more (above it), and a message
// above a ladder whose largest bucket ends at that boundary, cut as the serving code cuts it
// (Collectives::enqueue_chunked: consecutive pieces of the largest bucket's message, the last
// one shorter, here summed by another kernel as a smaller bucket's winner would). Every
// message runs with every kernel. Each row's bytes on every rank must be the reference and the
// bytes of its first sighting, whatever message and kernel summed it.
//
// Included inside harness.cc's anonymous namespace, after its launches and data; the mode's
// entry is invariance(). Prints one line per kernel entry (with its type), `<entry>: invariant`
// or `<entry>: varies (N rows differ)`, and goes on past any failure (the planted-mutation test
// reads which kernels it broke).
#pragma once

// The kernels' parameter struct, as their entries take it.
template <typename>
struct EntryParameter;
template <typename Parameter>
struct EntryParameter<void (*)(Parameter)> {
    using type = Parameter;
};
using Params = EntryParameter<Entry>::type;

// Elements a row: a whole number of 16-byte vectors in no type, so rows start anywhere in a
// vector and a kernel's vector, slice and block edges fall inside rows.
constexpr u64 kRowWidth = 333;

// One launch: `count` elements from element `first` of its message, summed by `kernel` at
// geometry `variant`.
struct Piece {
    const Kernel* kernel;
    unsigned variant;
    u64 first;
    u64 count;
};

// Rows `rows` from row `row`, all-reduced by its pieces in stream order.
struct RowMessage {
    const char* what;
    u64 row;
    u64 rows;
    std::vector<Piece> pieces;
};

unsigned row_input(u64 seed, u64 row, unsigned rank, u64 column) {
    return input_value(seed, static_cast<unsigned>(row), rank, column);
}

unsigned row_reference(u64 seed, u64 row, unsigned world, u64 column) {
    return reference(seed, static_cast<unsigned>(row), world, column);
}

using Output = std::unique_ptr<unsigned char[]>;

// The host chunks a copy-engine launch by 16 MiB or more (src/collective/copy_engine.rs), so
// a message here would be one chunk; chunks of this size put chunk edges inside rows while
// keeping a launch a few chunks, not the hundreds of copy_engine_launch's 80-byte ones.
constexpr u64 kRowsCopyEngineChunkBytes = 4096;

// copy_engine_launch in chunks of kRowsCopyEngineChunkBytes.
void copy_engine_rows(const Launch& launch, const Params& params, unsigned char* scratch,
                      u64 slot_bytes) {
    const Kernel start = {"start", launch.kernel->start, Scratch::None, false, false};
    const Kernel end = {"end", launch.kernel->end, Scratch::None, false, false};
    launch_rank({&start, 1, 32, 1, launch.elements}, params);
    const u64 bytes = launch.elements * element_bytes();
    for (u64 first = 0; first < bytes; first += kRowsCopyEngineChunkBytes) {
        const u64 length = std::min(kRowsCopyEngineChunkBytes, bytes - first);
        Params chunk = params;
        for (unsigned q = 0; q < params.world; ++q) {
            unsigned char* slot = scratch + slot_bytes * (q - (q > params.rank ? 1 : 0)) + first;
            if (q != params.rank)
                std::memcpy(slot, params.buffers[q] + first, length);
            chunk.buffers[q] = q == params.rank ? params.buffers[q] + first : slot;
        }
        chunk.output = static_cast<unsigned char*>(params.output) + first;
        chunk.input_elements = length / element_bytes();
        chunk.output_elements = chunk.input_elements;
        chunk.width = chunk.input_elements;
        chunk.scratch_offset = round_up(length, 16);
        launch_rank({launch.kernel, launch.blocks, launch.threads, 1, chunk.input_elements}, chunk);
    }
    launch_rank({&end, 1, 32, 1, launch.elements}, params);
}

// Every rank all-reduces `message`'s pieces in stream order into one output of the whole
// message, each piece into its own part, on buffers laid out as run() lays them out (input
// region, the shared scratch, one zeroed region per double-buffered kernel); returns each
// rank's output, or nothing for a rank that aborted.
std::vector<Output> all_reduce_rows(std::vector<Rank>& ranks, const RowMessage& message,
                                    u64 seed) {
    const unsigned world = static_cast<unsigned>(ranks.size());
    u64 largest = 0, shared = 0;
    std::vector<u64> own_bytes(std::size(kKernels), 0);
    for (const Piece& piece : message.pieces) {
        largest = std::max(largest, piece.count);
        const u64 bytes = scratch_bytes(piece.kernel->scratch, world, piece.count);
        u64& needed =
            double_buffered(piece.kernel->scratch) ? own_bytes[piece.kernel - kKernels] : shared;
        needed = std::max(needed, bytes);
    }
    const u64 shared_offset = round_up(largest * element_bytes(), 16);
    std::vector<u64> own_offsets(std::size(kKernels), 0);
    u64 buffer_bytes = shared_offset + shared;
    for (std::size_t k = 0; k < std::size(kKernels); ++k) {
        own_offsets[k] = buffer_bytes;
        buffer_bytes += own_bytes[k];
    }
    const u64 slot_bytes = round_up(largest * element_bytes(), 16);
    std::vector<Output> buffers(world), copy_scratch(world), outputs(world);
    for (unsigned rank = 0; rank < world; ++rank) {
        buffers[rank].reset(new (std::align_val_t(16)) unsigned char[buffer_bytes + 16]);
        std::memset(buffers[rank].get(), 0, buffer_bytes + 16);
        copy_scratch[rank].reset(
            new (std::align_val_t(16)) unsigned char[slot_bytes * (world - 1) + 16]);
        const u64 output_bytes = message.rows * kRowWidth * element_bytes();
        outputs[rank].reset(new (std::align_val_t(16)) unsigned char[output_bytes + 16]);
        std::memset(outputs[rank].get(), 0xCC, output_bytes + 16);
    }
    std::vector<std::thread> streams;
    for (unsigned rank = 0; rank < world; ++rank) {
        streams.emplace_back([&, rank] {
            for (const Piece& piece : message.pieces) {
                unsigned char* input = buffers[rank].get();
                for (u64 e = 0; e < piece.count; ++e) {
                    const u64 element = piece.first + e;
                    put_element(input, e,
                                row_input(seed, message.row + element / kRowWidth, rank,
                                          element % kRowWidth));
                }
                Params params;
                std::memset(&params, 0, sizeof params);
                for (unsigned q = 0; q < world; ++q) {
                    params.buffers[q] = buffers[q].get();
                    params.signals[q] = ranks[q].signals.data();
                }
                params.state = ranks[rank].state.data();
                params.output = outputs[rank].get() + piece.first * element_bytes();
                params.input = input;
                params.input_elements = piece.count;
                params.output_elements = piece.count;
                params.rows = 1;
                params.width = piece.count;
                params.scratch_offset = double_buffered(piece.kernel->scratch)
                                            ? own_offsets[piece.kernel - kKernels]
                                            : shared_offset;
                params.timeout_ns = kHealthyTimeoutNs;
                params.rank = rank;
                params.world = world;
                const Launch launch = geometry(*piece.kernel, piece.variant, piece.count);
                if (piece.kernel->copy_engine) {
                    copy_engine_rows(launch, params, copy_scratch[rank].get(), slot_bytes);
                } else {
                    launch_rank(launch, params);
                }
                if (ranks[rank].state[0] != 0)
                    return;
            }
        });
    }
    for (std::thread& stream : streams)
        stream.join();
    for (unsigned rank = 0; rank < world; ++rank) {
        const u64 abort = ranks[rank].state[0];
        CHECK(abort == 0, "%s at %u ranks, %s from row %llu: rank %u aborted %llx", message.what,
              world, message.pieces.front().kernel->name, message.row, rank, abort);
        if (abort != 0)
            outputs[rank].reset();
    }
    return outputs;
}

// The kernel that wrote element `element` of `message`.
const Kernel* writer(const RowMessage& message, u64 element) {
    for (const Piece& piece : message.pieces) {
        if (element < piece.first + piece.count)
            return piece.kernel;
    }
    return message.pieces.back().kernel;
}

// The messages around row `spot` for the `index`th kernel of the table, `boundary` being the
// bytes of a bucket's largest message; every message holds row spot + 1, where the piece cut
// falls.
std::vector<RowMessage> row_messages(unsigned index, u64 spot, u64 boundary) {
    const Kernel* kernel = &kKernels[index];
    const Kernel* other = &kKernels[(index + 1) % std::size(kKernels)];
    const u64 row_bytes = kRowWidth * element_bytes();
    const u64 below = boundary / row_bytes;  // the most rows of a message in the bucket
    const auto alone = [&](const char* what, u64 row, u64 rows, unsigned variant) {
        return RowMessage{what, row, rows, {{kernel, variant, 0, rows * kRowWidth}}};
    };
    // One geometry but for one message (more blocks): emulated threads are what costs here.
    std::vector<RowMessage> messages = {
        alone("1 row", spot + 1, 1, 0),
        alone("3 rows", spot, 3, 0),
        alone("rows below the boundary", spot - below / 2, below, 0),
        alone("rows above the boundary", spot + 2 - below, below + 1, 3),
    };
    // Above a ladder whose largest bucket ends at `boundary`: a piece of its largest message
    // cut inside row spot + 1, then the rest, a smaller bucket's message (another kernel).
    const u64 piece = boundary / element_bytes();
    RowMessage pieces{"pieces above the ladder", spot + 1 - below, below + 3, {}};
    const u64 elements = pieces.rows * kRowWidth;
    for (u64 first = 0; first < elements; first += piece) {
        const u64 count = std::min(piece, elements - first);
        pieces.pieces.push_back({count == piece ? kernel : other, 0, first, count});
    }
    messages.push_back(pieces);
    return messages;
}

// Every kernel's messages at `world` ranks around a boundary of `boundary` bytes; failures
// counted per kernel entry in `varied`.
void invariance_at(unsigned world, u64 boundary, std::vector<int>& varied) {
    const u64 seed = random_source();
    const u64 row_bytes = kRowWidth * element_bytes();
    const u64 spot = 2 * (boundary / row_bytes + 1);
    // Each row's bytes as first seen (rank 0 of the first message holding it), and where;
    // no message reaches past row 2 * spot.
    struct Sighting {
        std::vector<unsigned char> bytes;
        std::string where;
    };
    std::vector<Sighting> seen(2 * spot);
    std::vector<Rank> ranks(world);
    for (unsigned index = 0; index < std::size(kKernels); ++index) {
        for (const RowMessage& message : row_messages(index, spot, boundary)) {
            const std::vector<Output> outputs = all_reduce_rows(ranks, message, seed);
            if (std::any_of(outputs.begin(), outputs.end(), [](const Output& o) { return !o; })) {
                ++varied[index];
                ranks = std::vector<Rank>(world);
                continue;
            }
            char where[200];
            std::snprintf(where, sizeof where, "%s (%llu rows from row %llu) by %s%s%s",
                          message.what, message.rows, message.row,
                          message.pieces.front().kernel->name,
                          message.pieces.size() > 1 ? ", the last piece by " : "",
                          message.pieces.size() > 1 ? message.pieces.back().kernel->name : "");
            for (u64 r = 0; r < message.rows; ++r) {
                const u64 row = message.row + r;
                const unsigned char* first_rank = outputs[0].get() + r * row_bytes;
                Sighting& known = seen.at(row);
                const bool fresh = known.bytes.empty();
                if (fresh)
                    known = {std::vector<unsigned char>(first_rank, first_rank + row_bytes), where};
                const Kernel* culprit = nullptr;
                for (unsigned rank = 0; rank < world; ++rank) {
                    const unsigned char* bytes = outputs[rank].get() + r * row_bytes;
                    for (u64 c = 0; c < kRowWidth; ++c) {
                        const unsigned got = get_element(bytes, c);
                        if (got == row_reference(seed, row, world, c))
                            continue;
                        culprit = writer(message, r * kRowWidth + c);
                        CHECK(false,
                              "%u ranks, %s: rank %u row %llu element %llu is %x, the reference "
                              "%x (written by %s)",
                              world, where, rank, row, c, got,
                              row_reference(seed, row, world, c), culprit->name);
                        break;
                    }
                    // Implied when both sightings are the reference; a wrong one is counted
                    // against its own kernel above.
                    CHECK(fresh || std::memcmp(bytes, known.bytes.data(), row_bytes) == 0,
                          "%u ranks: row %llu on rank %u differs between %s and %s", world, row,
                          rank, known.where.c_str(), where);
                }
                if (culprit != nullptr)
                    ++varied[culprit - kKernels];
            }
        }
    }
}

// A world and the bytes of a bucket's largest message in a ladder of that world.
struct Boundary {
    unsigned world;
    u64 bytes;
};

// `WORLD:BYTES` arguments: a world of 2 to 8 ranks and a boundary in bytes, a multiple of 16
// that holds four fp32 rows or more; nothing (after saying why) for a bad or missing one.
std::vector<Boundary> parse_boundaries(int count, char** arguments) {
    std::vector<Boundary> boundaries;
    for (int a = 0; a < count; ++a) {
        unsigned world = 0;
        u64 bytes = 0;
        char end = 0;
        if (std::sscanf(arguments[a], "%u:%llu%c", &world, &bytes, &end) != 2 || world < 2 ||
            world > PREPARE_MAX_RANKS || bytes % 16 != 0 || bytes < 4 * kRowWidth * 4) {
            std::printf("invariance: `%s` is not WORLD:BYTES (2 to %d ranks, a multiple of 16 "
                        "bytes of at least %llu)\n",
                        arguments[a], PREPARE_MAX_RANKS, 4 * kRowWidth * 4);
            return {};
        }
        boundaries.push_back({world, bytes});
    }
    if (boundaries.empty())
        std::printf("invariance: give at least one WORLD:BYTES\n");
    return boundaries;
}

// The invariance mode for the current type, at each boundary given.
void invariance(const std::vector<Boundary>& boundaries) {
    stop_after_printed_failures = false;
    std::vector<int> varied(std::size(kKernels), 0);
    for (const Boundary& boundary : boundaries)
        invariance_at(boundary.world, boundary.bytes, varied);
    std::lock_guard<std::mutex> lock(print_mutex);
    for (std::size_t k = 0; k < std::size(kKernels); ++k) {
        if (varied[k] == 0) {
            std::printf("all_reduce_%s_%s: invariant\n", kKernels[k].name, kDtypeNames[dtype]);
        } else {
            std::printf("all_reduce_%s_%s: varies (%d rows differ)\n", kKernels[k].name,
                        kDtypeNames[dtype], varied[k]);
        }
    }
}
