// The exact NCCL all-reduce's local sum (nccl_rank_order_sum.cu) on the host: included by
// harness.cc inside its anonymous namespace, after the helpers it uses (launch_rank, CHECK,
// input_value, reference, the element accessors).
#pragma once

// The exact NCCL all-reduce's local sum, at the world of the launch.
template <typename T>
void rank_order_entry(LaunchParams params) {
    switch (params.world) {
        case 3: prepare::local_kernel<prepare::RankOrderSum, T, 3>(params); break;
        case 4: prepare::local_kernel<prepare::RankOrderSum, T, 4>(params); break;
        case 5: prepare::local_kernel<prepare::RankOrderSum, T, 5>(params); break;
        case 6: prepare::local_kernel<prepare::RankOrderSum, T, 6>(params); break;
        case 7: prepare::local_kernel<prepare::RankOrderSum, T, 7>(params); break;
        case 8: prepare::local_kernel<prepare::RankOrderSum, T, 8>(params); break;
        default: prepare::local_kernel<prepare::RankOrderSum, T, 2>(params); break;
    }
}

const Kernel kRankOrderSum = {"rank_order_sum",
                              {{&rank_order_entry<prepare::Bf16>,
                                &rank_order_entry<prepare::Fp16>,
                                &rank_order_entry<prepare::Fp32>}},
                              Scratch::None,
                              false,
                              true};

// The header's slice `slice` of `world` for a message of `elements` in the current type.
template <typename T, int N>
prepare::Range header_slice_at(unsigned slice, u64 elements) {
    return prepare::slice_of<T, N>(slice, elements);
}

template <typename T>
prepare::Range header_slice_of(unsigned slice, unsigned world, u64 elements) {
    switch (world) {
        case 3: return header_slice_at<T, 3>(slice, elements);
        case 4: return header_slice_at<T, 4>(slice, elements);
        case 5: return header_slice_at<T, 5>(slice, elements);
        case 6: return header_slice_at<T, 6>(slice, elements);
        case 7: return header_slice_at<T, 7>(slice, elements);
        case 8: return header_slice_at<T, 8>(slice, elements);
        default: return header_slice_at<T, 2>(slice, elements);
    }
}

prepare::Range header_slice(unsigned slice, unsigned world, u64 elements) {
    switch (dtype) {
        case kBf16: return header_slice_of<prepare::Bf16>(slice, world, elements);
        case kFp16: return header_slice_of<prepare::Fp16>(slice, world, elements);
        default: return header_slice_of<prepare::Fp32>(slice, world, elements);
    }
}

// Sizes around every vector and slice edge at `world` ranks, and some larger ones.
std::vector<u64> rank_order_sizes(unsigned world) {
    std::vector<u64> sizes = {1, 2, per_vector() - 1, per_vector(), per_vector() + 1};
    for (u64 vectors : {u64(world) - 1, u64(world), u64(world) + 1, 2 * u64(world) + 1}) {
        for (u64 extra = 0; extra < 3; ++extra)
            sizes.push_back(vectors * per_vector() + extra);
    }
    sizes.push_back(per_vector() * world * 5 + per_vector() - 1);
    sizes.push_back(1001);
    return sizes;
}

// 16-byte aligned bytes, filled with kBufferFill.
struct Aligned {
    explicit Aligned(u64 bytes)
        : data(static_cast<unsigned char*>(std::aligned_alloc(16, round_up(bytes + 1, 16)))) {
        std::memset(data, kBufferFill, round_up(bytes + 1, 16));
    }
    ~Aligned() { std::free(data); }
    Aligned(const Aligned&) = delete;
    Aligned& operator=(const Aligned&) = delete;
    unsigned char* data;
};

// One all-reduce of `elements` through the exact NCCL path at `world` ranks: the grouped sends
// and receives as copies into every rank's slots, the sum on every rank, the all-gather as
// copies of every rank's sum; every element checked against the reference.
void rank_order_all_reduce(unsigned world, u64 elements, unsigned blocks, unsigned threads,
                           bool in_place, u64 seed) {
    const u64 size = element_bytes();
    // slot_bytes(elements) of prepare_layout.cuh, through its own template at this world.
    const u64 slot = ((elements / per_vector() + world - 1) / world + 1) * 16;
    std::vector<unsigned> gathered(elements, 0xDEADu);
    for (unsigned rank = 0; rank < world; ++rank) {
        const prepare::Range slice = header_slice(rank, world, elements);
        const u64 first = slice.begin_vector * per_vector();
        const u64 count = (slice.end_vector - slice.begin_vector) * per_vector() + slice.tail_end -
                          slice.tail_begin;
        CHECK(count * size <= slot, "world %u, %llu elements: slice %u of %llu bytes, slot %llu",
              world, elements, rank, count * size, slot);
        Aligned slots(world * slot + kGuard);
        for (unsigned q = 0; q < world; ++q) {
            for (u64 e = 0; e < count; ++e)
                put_element(slots.data + q * slot, e, input_value(seed, 0, q, first + e));
        }
        Aligned separate(slot + kGuard);
        unsigned char* output = in_place ? slots.data + rank * slot : separate.data;
        LaunchParams params = {};
        params.input = slots.data;
        params.output = output;
        params.input_elements = elements;
        params.rank = rank;
        params.world = world;
        launch_rank({&kRankOrderSum, blocks, threads, 1, elements}, params);
        for (u64 e = 0; e < count; ++e)
            gathered[first + e] = get_element(output, e);
        // Nothing past the slice is written: the next slot, or the guard.
        const unsigned char* after = output + count * size;
        const u64 untouched = in_place ? (rank + 1 < world ? slot : 0) : slot - count * size;
        if (!in_place) {
            for (u64 b = 0; b < untouched; ++b)
                CHECK(after[b] == kBufferFill, "world %u, %llu elements: rank %u wrote byte %llu",
                      world, elements, rank, count * size + b);
        } else if (rank + 1 < world) {
            const unsigned char* next = slots.data + (rank + 1) * slot;
            for (u64 e = 0; e < count; ++e)
                CHECK(get_element(next, e) == input_value(seed, 0, rank + 1, first + e),
                      "world %u, %llu elements: rank %u overwrote the next slot", world, elements,
                      rank);
        }
    }
    for (u64 e = 0; e < elements; ++e) {
        const unsigned expected = reference(seed, 0, world, e);
        CHECK(gathered[e] == expected,
              "rank order %s world %u, %llu elements (%u x %u threads%s): element %llu is %x, "
              "reference %x",
              kDtypeNames[dtype], world, elements, blocks, threads, in_place ? ", in place" : "", e,
              gathered[e], expected);
    }
}

// `runs`, when given, says whether the next case runs (a case skipped still draws its seed).
void rank_order(const std::vector<unsigned>& worlds, const ExactnessEntry* runs = nullptr) {
    for (unsigned world : worlds) {
        for (u64 elements : rank_order_sizes(world)) {
            for (bool in_place : {false, true}) {
                const unsigned blocks = 1 + static_cast<unsigned>(elements % 3);
                const u64 seed = random_source();
                if (runs == nullptr || runs->runs())
                    rank_order_all_reduce(world, elements, blocks, in_place ? 32 : 64, in_place,
                                          seed);
            }
        }
    }
    if (runs != nullptr && !runs->runs())
        return;
    // An invalid launch (a world the kernel was not compiled for) records its code and writes
    // nothing.
    Aligned slots(4 * 64);
    Aligned output(64);
    std::vector<u64> state(PREPARE_STATE_WORDS, 0);
    LaunchParams params = {};
    params.input = slots.data;
    params.output = output.data;
    params.input_elements = 8;
    params.rank = 2;
    params.world = 9;
    params.state = state.data();
    launch_rank({&kRankOrderSum, 1, 32, 1, 8}, params);
    CHECK(state[0] == (PREPARE_ABORT_FLAG | (PREPARE_ABORT_INVALID_LAUNCH << 32) | 2),
          "an invalid rank-order launch left abort word %llx", state[0]);
    CHECK(output.data[0] == kBufferFill, "an invalid rank-order launch wrote its output");
}

// The rank-order sum's exactness line, as `exactness` prints for every other kernel.
void rank_order_exactness() {
    const ExactnessEntry entry{"nccl_rank_order_sum_" + std::string(kDtypeNames[dtype])};
    rank_order({2, 3, 4, 8}, &entry);
    entry.report();
}

void print_slices(const std::vector<unsigned>& worlds) {
    for (unsigned world : worlds) {
        std::vector<u64> sizes = rank_order_sizes(world);
        sizes.push_back(0);
        for (u64 elements : sizes) {
            for (unsigned s = 0; s < world; ++s) {
                const prepare::Range slice = header_slice(s, world, elements);
                std::printf("%s %u %llu %u %llu %llu %llu %llu\n", kDtypeNames[dtype], world,
                            elements, s, slice.begin_vector, slice.end_vector, slice.tail_begin,
                            slice.tail_end);
            }
        }
    }
}

