// Host versions of prepare_sync.cuh's inline-PTX primitives, with the same memory orders, and
// of its one spin.
__device__ __forceinline__ u64 global_timer_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
// Emulated launches run one after another: nothing to wait for, nothing to allow.
__device__ __forceinline__ void wait_for_previous_grid() {}
__device__ __forceinline__ void allow_next_grid() {}
__device__ __forceinline__ void store_release_system(u64* address, u64 value) {
    emu_stall::synchronizing_store(
        [&] { std::atomic_ref<u64>(*address).store(value, std::memory_order_release); });
}
__device__ __forceinline__ u64 load_acquire_system(const u64* address) {
    return std::atomic_ref<u64>(*const_cast<u64*>(address)).load(std::memory_order_acquire);
}
__device__ __forceinline__ u64 load_relaxed_device(const u64* address) {
    return std::atomic_ref<u64>(*const_cast<u64*>(address)).load(std::memory_order_relaxed);
}
__device__ __forceinline__ u64 record_abort(u64* state, u64 reason, unsigned int rank) {
    const u64 code = PREPARE_ABORT_FLAG | (reason << 32) | rank;
    u64 previous = 0;
    emu_stall::synchronizing_store([&] {
        std::atomic_ref<u64>(*state).compare_exchange_strong(previous, code,
                                                             std::memory_order_relaxed);
    });
    return previous;
}
// Each 8-byte half of a line is one atomic, as on the GPU; nothing orders the two halves.
// Stores release and loads acquire: a line a peer's launch c - 1 wrote, once read, is what
// orders that peer's launch c - 2 (ended before c - 1 began) before this rank's launch c
// (prepare_double_buffer.cuh). On the GPU that rests on the launch boundary and the line's
// arrival, as NCCL's LL protocol does; relaxed atomics would show no happens-before here, and
// ThreadSanitizer would report a slot written two launches after its last read.
__device__ __forceinline__ void store_line_volatile(unsigned int* address,
                                                    const unsigned int (&words)[4]) {
    emu_stall::synchronizing_store([&] {
        for (int half = 0; half < 2; ++half) {
            const u64 value = u64(words[2 * half]) | (u64(words[2 * half + 1]) << 32);
            std::atomic_ref<u64>(*reinterpret_cast<u64*>(address + 2 * half))
                .store(value, std::memory_order_release);
        }
    });
}
__device__ __forceinline__ void load_line_volatile(const unsigned int* address,
                                                   unsigned int (&words)[4]) {
    for (int half = 0; half < 2; ++half) {
        const u64 value = std::atomic_ref<u64>(*reinterpret_cast<u64*>(
                                                   const_cast<unsigned int*>(address) + 2 * half))
                              .load(std::memory_order_acquire);
        words[2 * half] = static_cast<unsigned int>(value);
        words[2 * half + 1] = static_cast<unsigned int>(value >> 32);
    }
}
// prepare_sync.cuh's end of a block's deadline: a release store, which deadline_ended's
// acquiring load pairs with, so the abort recorded before it is seen by the waits it ends.
__device__ __forceinline__ void end_deadline(u64& deadline) {
    emu_stall::synchronizing_store(
        [&] { std::atomic_ref<u64>(deadline).store(0, std::memory_order_release); });
}
__device__ __forceinline__ bool deadline_ended(const u64& deadline) {
    return std::atomic_ref<u64>(const_cast<u64&>(deadline)).load(std::memory_order_acquire) == 0;
}
// prepare_sync.cuh's spin: the same polls, the same deadline and last look, but the emulated
// threads far outnumber the cores, so a poll that finds nothing gives the core away: it yields
// for a few polls (a short wait is seen at once), then sleeps, twice as long each time up to a
// cap, so a long wait (a late rank, a peer's launch still running) costs a wake-up now and then
// instead of a system call every poll. The cap grows with the threads of the process that are
// sleeping in a spin (kSpinSleepPerSleeper each, at least kMaxSpinSleep), so all of them
// together wake at most about once per kSpinSleepPerSleeper: hundreds of waiters at a fixed cap
// would take every core with their wake-ups and starve the threads they wait for. No wait ends
// before what it waits for arrives; a waiter only notices it later, by one sleep at most.
// A poll that found nothing is reported to the late rank's count of stalls (stalls.h).
constexpr int kSpinYields = 16;
constexpr auto kMaxSpinSleep = std::chrono::microseconds(256);
constexpr auto kSpinSleepPerSleeper = std::chrono::microseconds(20);
inline std::atomic<unsigned> spin_sleepers{0};
template <typename Poll>
__device__ __forceinline__ bool spin_until(u64 deadline, Poll arrived) {
    auto sleep = std::chrono::microseconds(1);
    bool sleeping = false;
    struct Sleeper {
        bool& counted;
        ~Sleeper() {
            if (counted)
                spin_sleepers.fetch_sub(1, std::memory_order_relaxed);
            emu_stall::spin_ends();
        }
    } sleeper{sleeping};
    for (int polls = 0;; ++polls) {
        // Read before the poll: a poll that finds nothing with no store since has stalled.
        const unsigned long long stores = emu_stall::stores_before_poll();
        if (arrived())
            break;
        if (global_timer_ns() > deadline) {
            return arrived();
        }
        if (polls < kSpinYields) {
            std::this_thread::yield();
            continue;
        }
        emu_stall::spin_found_nothing(stores);
        if (!sleeping) {
            sleeping = true;
            spin_sleepers.fetch_add(1, std::memory_order_relaxed);
        }
        std::this_thread::sleep_for(sleep);
        const auto cap = std::max(kMaxSpinSleep,
                                  kSpinSleepPerSleeper *
                                      static_cast<long>(spin_sleepers.load(std::memory_order_relaxed)));
        sleep = std::min(sleep * 2, cap);
    }
    return true;
}
// prepare_sync.cuh's spin on a block's deadline that a thread of the block may end, and that
// may also give up for the abort word: the host spin above, whose poll looks at both after each
// poll that found nothing.
template <typename Poll>
__device__ __forceinline__ bool spin_until_ended(const u64& deadline, Poll arrived,
                                                 const u64* state = nullptr) {
    bool ended = false;
    const bool in_time = spin_until(
        std::atomic_ref<u64>(const_cast<u64&>(deadline)).load(std::memory_order_acquire), [&] {
            if (arrived())
                return true;
            ended = deadline_ended(deadline) ||
                    (state != nullptr && load_relaxed_device(state) != 0);
            return ended;
        });
    return in_time && !ended;
}
