// The harness's late rank (Options::last_rank_late in harness.cc, and its twins in rows.h,
// fused.h and two_shot.h), independent of how loaded the machine is.
//
// A late rank that sleeps a fixed time shows a race only if the others reach it within that
// time, which a loaded machine running a few hundred emulated threads per core need not do.
// Here the late rank waits until every other rank has stalled instead: each thread of its launch
// has ended, waits at a barrier, or sleeps in a spin whose last poll came after the last
// synchronizing store (a flag, a line, an abort word, a deadline's end), so nothing it waits
// for has arrived. The late rank begins each launch (writes its input and launches) only when
// every other present rank has begun that launch and stalled, and each thread of its launches
// stores its first data (emu_store_pause) only when they have stalled again. A kernel that
// reads what it did not wait for reads it before it is there, in every run; one that waits
// stalls as soon as it waits, so the late rank goes on at once.
//
// The counts are kept only in a run with a late rank, by its streams and their launches'
// threads (`rank` set); every hook elsewhere is one thread-local test.
#pragma once
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

namespace emu_stall {

constexpr unsigned kMaxRanks = 16;
// The longest the late rank waits: past it, it goes on and says so on stderr. Only a rank whose
// thread neither ends nor waits (a kernel in an endless loop of its own) or a rank that stopped
// launching (after a failed check) keeps it waiting that long.
constexpr auto kLongestWait = std::chrono::seconds(10);

struct State {
    std::mutex mutex;
    // Synchronizing stores so far; incremented under the mutex.
    std::atomic<unsigned long long> stores{0};
    unsigned world = 0;
    bool present[kMaxRanks] = {};
    // Per rank: its stream while it is in a launch and not waiting for the launch's threads, and
    // the launch's threads that have not ended, are not at a barrier and have not stalled in a
    // spin since the last synchronizing store.
    int unstalled[kMaxRanks] = {};
    // Per rank: threads stalled in a spin since the last synchronizing store. Each such store
    // moves them back to `unstalled`: their next poll may find what they wait for.
    int fresh[kMaxRanks] = {};
    // Per rank: the launches its stream has begun.
    unsigned launches[kMaxRanks] = {};
    // Per rank: the launch whose threads' first stores of data may go on (the late rank's).
    unsigned stores_open[kMaxRanks] = {};
};
inline State state;

// The rank this thread (a stream, or a thread of one of its launches) counts for, or -1.
inline thread_local int rank = -1;
// Whether that rank is the late one (a stream's: its launches' threads take it from the stream).
inline thread_local bool late = false;
// The late rank's thread waits for every rank to stall before its first store of data.
inline thread_local bool first_store_waits = false;
// The store count at which this thread stalled in its spin, or ~0 when it has not.
inline thread_local unsigned long long fresh_at = ~0ull;

using Lock = std::lock_guard<std::mutex>;

// Whether every present rank, but this thread's when `others_only`, has begun as many launches
// as this thread's rank and stalled. Under the mutex.
inline bool stalled(bool others_only) {
    for (unsigned r = 0; r < state.world; ++r) {
        if (others_only && static_cast<int>(r) == rank)
            continue;
        if (state.present[r] &&
            (state.launches[r] < state.launches[rank] || state.unstalled[r] != 0))
            return false;
    }
    return true;
}

// Waits until `done` (called under the mutex) holds, or kLongestWait has passed.
template <typename Done>
inline void wait_until(Done done) {
    const auto start = std::chrono::steady_clock::now();
    auto sleep = std::chrono::microseconds(20);
    for (;;) {
        {
            Lock lock(state.mutex);
            if (done())
                return;
        }
        if (std::chrono::steady_clock::now() - start > kLongestWait) {
            std::fprintf(stderr, "host emulation: the late rank %d went on after %lld s without "
                                 "every rank stalled\n",
                         rank, static_cast<long long>(kLongestWait.count()));
            return;
        }
        std::this_thread::sleep_for(sleep);
        sleep = std::min(sleep * 2, std::chrono::microseconds(1000));
    }
}

// A run whose last rank is late, when `counted`: the counts start at zero and must all be back
// at zero when it ends (every stream and thread counted out as it was counted in).
class Run {
  public:
    Run(const std::vector<bool>& present, bool counted) : counted_(counted) {
        if (!counted_)
            return;
        Lock lock(state.mutex);
        state.world = static_cast<unsigned>(std::min<std::size_t>(present.size(), kMaxRanks));
        for (unsigned r = 0; r < kMaxRanks; ++r) {
            state.present[r] = r < state.world && present[r];
            state.unstalled[r] = state.fresh[r] = 0;
            state.launches[r] = state.stores_open[r] = 0;
        }
    }
    ~Run() {
        if (!counted_)
            return;
        Lock lock(state.mutex);
        for (unsigned r = 0; r < kMaxRanks; ++r) {
            if (state.unstalled[r] != 0 || state.fresh[r] != 0) {
                std::fprintf(stderr, "host emulation: rank %u ended its run with %d unstalled and "
                                     "%d stalled threads counted\n",
                             r, state.unstalled[r], state.fresh[r]);
                std::abort();
            }
        }
        state.world = 0;
    }
    bool counted() const { return counted_; }

  private:
    const bool counted_;
};

// One launch of a stream of a run, from its beginning (before its input is written) to its end.
// The late rank's waits for the others first.
class StreamLaunch {
  public:
    StreamLaunch(const Run& run, unsigned stream_rank, bool is_late) {
        if (!run.counted())
            return;
        {
            Lock lock(state.mutex);
            ++state.launches[stream_rank];
            ++state.unstalled[stream_rank];
        }
        rank = static_cast<int>(stream_rank);
        late = is_late;
        if (late)
            wait_until([] { return stalled(true); });
    }
    ~StreamLaunch() {
        if (rank < 0)
            return;
        Lock lock(state.mutex);
        --state.unstalled[rank];
        rank = -1;
        late = false;
    }
};

// The stream starts `threads` threads of a launch (each then calls thread_begins with the
// stream's rank and lateness) and waits for them: they count, it does not, until the last of
// them ends and passes its count back to the stream, which goes on (counting the stream again
// only after the join would leave a moment with nothing counted while the stream still runs).
inline void threads_start(unsigned threads) {
    if (rank < 0)
        return;
    Lock lock(state.mutex);
    state.unstalled[rank] += static_cast<int>(threads) - 1;
}
inline void thread_begins(int stream_rank, bool is_late) {
    rank = stream_rank;
    first_store_waits = is_late;
}
// `running`: the launch's threads that have not ended, `threads` to begin with.
inline void thread_ends(unsigned& running) {
    first_store_waits = false;
    if (rank < 0)
        return;
    {
        Lock lock(state.mutex);
        if (--running != 0)
            --state.unstalled[rank];
    }
    rank = -1;
}

// emu_store_pause: a thread of the late rank's launch waits before its first store of data until
// every rank has stalled, its own rank's threads that wait here counted as stalled: the late
// rank's threads have made every synchronizing store they make before their data (a shape
// line, a flag), and the others have read whatever they read without waiting for it. Then
// every thread of the launch stores on; the first to see it opens the launch for all.
inline void before_data_store() {
    if (!first_store_waits)
        return;
    first_store_waits = false;
    {
        Lock lock(state.mutex);
        if (state.stores_open[rank] == state.launches[rank])
            return;
        --state.unstalled[rank];
    }
    wait_until([] { return state.stores_open[rank] == state.launches[rank] || stalled(false); });
    Lock lock(state.mutex);
    state.stores_open[rank] = state.launches[rank];
    ++state.unstalled[rank];
}

// A synchronizing store, and its count, in one step under the mutex: every thread that had
// stalled since the last one may now find what it waits for, and counts again.
template <typename Store>
inline void synchronizing_store(Store store) {
    if (rank < 0) {
        store();
        return;
    }
    Lock lock(state.mutex);
    store();
    state.stores.fetch_add(1, std::memory_order_release);
    for (unsigned r = 0; r < kMaxRanks; ++r) {
        state.unstalled[r] += state.fresh[r];
        state.fresh[r] = 0;
    }
}

// A spin reads the store count before each poll, and reports a poll that found nothing: the
// thread has stalled if no synchronizing store came since the count was read.
inline unsigned long long stores_before_poll() {
    return rank < 0 ? 0 : state.stores.load(std::memory_order_acquire);
}
inline void spin_found_nothing(unsigned long long seen) {
    if (rank < 0)
        return;
    Lock lock(state.mutex);
    const unsigned long long now = state.stores.load(std::memory_order_relaxed);
    if (seen != now || fresh_at == now)
        return;
    --state.unstalled[rank];
    ++state.fresh[rank];
    fresh_at = now;
}
// The spin returns: a thread still counted as stalled counts again.
inline void spin_ends() {
    if (rank < 0 || fresh_at == ~0ull)
        return;
    Lock lock(state.mutex);
    if (fresh_at == state.stores.load(std::memory_order_relaxed)) {
        --state.fresh[rank];
        ++state.unstalled[rank];
    }
    fresh_at = ~0ull;
}

// A barrier's waiters are stalled; the last to arrive counts them all again as it releases them.
inline void barrier_arrives() {
    if (rank < 0)
        return;
    Lock lock(state.mutex);
    --state.unstalled[rank];
}
inline void barrier_releases(unsigned count) {
    if (rank < 0)
        return;
    Lock lock(state.mutex);
    state.unstalled[rank] += static_cast<int>(count);
}

}  // namespace emu_stall
