// Ranks that disagree on their message's shape, on the host: included by harness.cc inside its
// anonymous namespace, after rows.h (kRowKernels, Guarded, the owners' rows), fused.h
// (kFusedKernels) and two_shot.h (kTwoShot).
//
// Every kernel that checks the shape (all but the copy engine's, whose start barrier is the
// same code) is launched at once on every rank, each rank with its own
// shape: one rank's rows one more, one rank's width another, one rank with rows 0 (an
// all-reduce: its element count one more, or 0). The shape check must leave every rank the abort
// word SHAPE_MISMATCH naming a peer whose shape differs from its own, well before the deadline.
// A kernel with the start barrier (prepare_sync.cuh), or with the cluster kernels' start
// exchange, which checks as it does (prepare_cluster.cuh), must write nothing anywhere: every operand,
// the registered input region past the message, the scratch and the guards after the buffer keep
// their fill bytes. A double-buffered kernel (prepare_double_buffer.cuh) checks while it moves
// data, so its output (and a fused kernel's residual) and its scratch region may change, nothing
// else: the guards around every operand, the weight, the registered buffer before the scratch
// and the guards after the buffer keep their fill. Each rank begins one block first and holds its other block back
// until its abort word is set (half a second at most), as blocks the GPU schedules late: those
// see the word at once and raise no flag, and their peers must still see the mismatch without
// waiting out the deadline. From 3 ranks, when rank 1 is not the odd one, rank 1 begins with
// its second block, whose peers' blocks of that number all begin after their ranks' aborts: it
// can learn of the mismatch only from the lines such late blocks still show. A cluster kernel
// runs as one cluster of 2 CTAs, which the GPU schedules together: none is held back.
//
// Prints one line per kernel entry, `<entry>: refused` or `<entry>: not refused (N failed
// checks)`, and goes on past a failure (the planted mutation's test reads which kernels missed);
// with --stop-at-first-wrong an entry ends at its first failed case. The deadline is 20 s, or
// --deadline-ms: a kernel that does not check waits it out.
#pragma once

// TwoShot: a fused kernel's operands (x, residual, weight, normed), one-shot or two-shot.
enum class ShapeSide { AllReduce, ReduceScatter, AllGather, TwoShot };

struct ShapeKernel {
    std::string entry;  // without the type
    const Kernel* kernel;
    ShapeSide side;
};

std::vector<ShapeKernel> shape_kernels() {
    std::vector<ShapeKernel> kernels;
    for (const Kernel& kernel : kKernels) {
        const std::string name = kernel.name;
        // The copy engines' start barrier is block_barrier, which the others run.
        if (name != "one_shot_copy_engine")
            kernels.push_back({"all_reduce_" + name, &kernel, ShapeSide::AllReduce});
    }
    for (const RowKernel& row : kRowKernels) {
        if (!row.kernel.copy_engine)
            kernels.push_back({row.kernel.name, &row.kernel,
                               row.gather ? ShapeSide::AllGather : ShapeSide::ReduceScatter});
    }
    for (const FusedKernel& fused : kFusedKernels)
        kernels.push_back({fused.kernel.name, &fused.kernel, ShapeSide::TwoShot});
    kernels.push_back({kTwoShot.name, &kTwoShot, ShapeSide::TwoShot});
    return kernels;
}

// The deadline of every launch (--deadline-ms).
u64 shape_timeout_ns = 20'000'000'000ull;

// A rank's message: rows x width (an all-reduce's: 1 x its element count).
struct RankShape {
    u64 rows, width;
};

// The shape as the kernels compare it: the larger side's elements and the rows.
bool same_shape(const RankShape& a, const RankShape& b) {
    return a.rows * a.width == b.rows * b.width && a.rows == b.rows;
}

// Each rank's launch: 2 blocks of this many threads.
constexpr unsigned kShapeThreads = 32;
// How long a rank's later block is held back at most.
constexpr u64 kShapeHoldNs = 500'000'000;

// Launches `kernel` on every rank at once, rank q with `shapes[q]`; checks what the header says.
// `odd` is the rank whose shape differs from the others'.
void run_mismatch(const ShapeKernel& shape_kernel, const std::vector<RankShape>& shapes,
                  unsigned odd, const char* what) {
    const Kernel& kernel = *shape_kernel.kernel;
    const ShapeSide side = shape_kernel.side;
    const unsigned world = static_cast<unsigned>(shapes.size());
    const u64 size = element_bytes();
    u64 max_whole = 0, row_guard = 64;
    for (const RankShape& shape : shapes) {
        max_whole = std::max(max_whole, shape.rows * shape.width);
        row_guard = std::max(row_guard, round_up(shape.width * size + 64, 16));
    }
    const u64 scratch_offset = round_up(max_whole * size, 16) + row_guard;
    const u64 buffer_bytes = scratch_offset + scratch_bytes(kernel.scratch, world, max_whole);
    std::vector<std::unique_ptr<Aligned>> buffers(world);
    for (auto& buffer : buffers)
        buffer.reset(new Aligned(buffer_bytes + kBufferGuard));
    std::vector<Rank> ranks(world);
    const u64 timeout_ns = shape_timeout_ns;
    const bool checks_while_moving = double_buffered(kernel.scratch);
    const auto started = std::chrono::steady_clock::now();
    std::vector<std::thread> streams;
    for (unsigned rank = 0; rank < world; ++rank) {
        streams.emplace_back([&, rank] {
            const RankShape shape = shapes[rank];
            const u64 whole = shape.rows * shape.width;
            const u64 own = side == ShapeSide::AllReduce || side == ShapeSide::TwoShot
                                ? whole
                                : host_owned_rows(shape.rows, world, rank) * shape.width;
            const bool gather = side == ShapeSide::AllGather;
            const u64 input_elements = gather ? own : whole;
            const u64 output_elements = side == ShapeSide::ReduceScatter ? own : whole;
            unsigned char* region = buffers[rank]->data;
            // A double-buffered region starts zeroed, as the handle leaves it.
            if (checks_while_moving)
                std::memset(region + scratch_offset, 0, buffer_bytes - scratch_offset);
            Guarded input(input_elements * size, row_guard), output(output_elements * size, row_guard),
                residual(whole * size, row_guard), weight(shape.width * size, row_guard);
            // The message where the kernel reads it: its own memory, or the input region.
            unsigned char* values = kernel.local_input ? input.data() : region;
            for (u64 e = 0; e < input_elements; ++e)
                put_element(values, e, row_value(7, 0, rank, e));
            const u64 message_bytes = input_elements * size;
            LaunchParams params;
            std::memset(&params, 0, sizeof params);
            for (unsigned q = 0; q < world; ++q) {
                params.buffers[q] = buffers[q]->data;
                params.signals[q] = ranks[q].signals.data();
            }
            params.state = ranks[rank].state.data();
            params.input = values;
            params.output = output.data();
            params.input_elements = input_elements;
            params.output_elements = output_elements;
            params.rows = shape.rows;
            params.width = shape.width;
            if (side == ShapeSide::TwoShot) {
                params.residual = residual.data();
                params.weight = weight.data();
                params.normed = output.data();
                params.eps = 1e-6f;
            }
            params.scratch_offset = scratch_offset;
            params.timeout_ns = timeout_ns;
            params.rank = rank;
            params.world = world;
            // The rank's other block waits for its abort word, for its first block to return,
            // or kShapeHoldNs at most: a kernel that does not check sets no abort word, and its
            // blocks may wait for each other across ranks that began with other blocks.
            const unsigned first = world >= 3 && odd != 1 && rank == 1 ? 1 : 0;
            std::atomic<unsigned> first_returned{0};
            const auto late_blocks = [&, rank, first](unsigned block, bool before) {
                if (block == first && !before)
                    first_returned.fetch_add(1);
                if (block == first || !before)
                    return;
                const u64 until = prepare::global_timer_ns() + kShapeHoldNs;
                while (std::atomic_ref<u64>(ranks[rank].state[0]).load() == 0 &&
                       first_returned.load() < kShapeThreads && prepare::global_timer_ns() < until)
                    std::this_thread::sleep_for(std::chrono::microseconds(50));
            };
            if (kernel.cluster)
                launch_rank({&kernel, 2, kShapeThreads, 2, whole}, params);
            else
                launch_rank({&kernel, 2, kShapeThreads, 1, whole}, params, late_blocks);
            char where[240];
            std::snprintf(where, sizeof where, "%s_%s world %u, %s, rank %u (%llu x %llu)",
                          shape_kernel.entry.c_str(), kDtypeNames[dtype], world, what, rank,
                          shape.rows, shape.width);
            const u64 abort = ranks[rank].state[0];
            const unsigned named = static_cast<unsigned>(abort & 0xffffffffu);
            const u64 code = PREPARE_ABORT_FLAG | (PREPARE_ABORT_SHAPE_MISMATCH << 32);
            CHECK((abort & ~0xffffffffull) == code && named < world &&
                      !same_shape(shapes[named], shape),
                  "%s: abort word %llx, not a shape mismatch naming a peer of another shape",
                  where, abort);
            const Guarded* written[] = {&output, &residual, &weight};
            u64 changed = input.overrun();
            for (const Guarded* memory : written) {
                changed += memory->overrun();
                // A double-buffered kernel's output and residual may hold partial sums.
                if (checks_while_moving && memory != &weight)
                    continue;
                for (u64 b = 0; b < memory->bytes; ++b)
                    changed += memory->data()[b] != kBufferFill;
            }
            CHECK(changed == 0, "%s: wrote %llu bytes of its operands or their guards", where,
                  changed);
            // The input region past this rank's message (all of it for a kernel that reads its
            // message locally) and the whole scratch (but a double-buffered region) keep their
            // fill.
            u64 region_changed = 0;
            const u64 kept_until = checks_while_moving ? scratch_offset : buffer_bytes;
            for (u64 b = kernel.local_input ? 0 : message_bytes; b < kept_until; ++b)
                region_changed += region[b] != kBufferFill;
            CHECK(region_changed == 0, "%s: wrote %llu bytes of its registered buffer", where,
                  region_changed);
        });
    }
    for (std::thread& stream : streams)
        stream.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    CHECK(seconds < timeout_ns * 1e-9 / 4, "%s_%s world %u, %s: took %.1f s",
          shape_kernel.entry.c_str(), kDtypeNames[dtype], world, what, seconds);
    for (unsigned rank = 0; rank < world; ++rank) {
        u64 changed = 0;
        for (u64 g = 0; g < kBufferGuard; ++g)
            changed += buffers[rank]->data[buffer_bytes + g] != kBufferFill;
        CHECK(changed == 0, "rank %u: wrote %llu bytes past the buffer", rank, changed);
    }
}

// Every kernel that checks the shape, at every world of `worlds`, in every type: the three
// disagreements.
void shapes_mode(const std::vector<unsigned>& worlds) {
    stop_after_printed_failures = false;
    for (int type = 0; type < kDtypes; ++type) {
        dtype = static_cast<Dtype>(type);
        for (const ShapeKernel& kernel : shape_kernels()) {
            const ExactnessEntry entry{entry_name(kernel.entry.c_str())};
            for (unsigned world : worlds) {
                if (!entry.runs())
                    break;
                // Rows with a short rank; widths off a vector (the fused norm's: a multiple of
                // 8). The all-reduce's message is one row of rows x width elements.
                const bool norm = kernel.side == ShapeSide::TwoShot;
                const bool all_reduce = kernel.side == ShapeSide::AllReduce;
                const RankShape base = {u64(world) + 1, norm ? 16ull : 7ull};
                const u64 other_width = norm ? 24 : 9;
                const auto as_run = [&](RankShape shape) {
                    return all_reduce ? RankShape{1, shape.rows * shape.width} : shape;
                };
                struct Case {
                    const char* what;
                    unsigned rank;
                    RankShape shape;
                };
                const Case cases[] = {
                    {"the last rank's rows one more", world - 1, {base.rows + 1, base.width}},
                    {"rank 0's width another", 0, {base.rows, other_width}},
                    {"rank 1 with rows 0", 1, {0, base.width}},
                };
                for (const Case& mismatch : cases) {
                    if (!entry.runs())
                        break;
                    std::vector<RankShape> shapes(world, as_run(base));
                    shapes[mismatch.rank] = as_run(mismatch.shape);
                    run_mismatch(kernel, shapes, mismatch.rank, mismatch.what);
                }
            }
            const int failed = failures - entry.before;
            std::lock_guard<std::mutex> lock(print_mutex);
            if (failed == 0)
                std::printf("%s: refused\n", entry.name.c_str());
            else
                std::printf("%s: not refused (%d failed checks)\n", entry.name.c_str(), failed);
        }
    }
    dtype = kBf16;
}
