// entries.h: a kernel's entries as the host emulation calls them, one per element type, each
// instantiated at the world of the launch as a package compiled for that world has it.
// Included by harness.cc inside its anonymous namespace.
#pragma once

using Entry = void (*)(LaunchParams);

// The largest world whose kernels a build instantiates: all unless the build names fewer (a
// harness for modes of small worlds compiles faster); a launch at a larger world ends the run.
#ifndef HARNESS_MAX_WORLD
#define HARNESS_MAX_WORLD PREPARE_MAX_RANKS
#endif

// An entry as the kernel's own template at the world of the launch, as a package compiled for
// that world has it; a world outside 2..8 goes to the world-2 instantiation, which refuses it.
template <typename Algorithm, typename T, bool Cluster, int N>
void entry_at(LaunchParams params) {
    if constexpr (N > HARNESS_MAX_WORLD) {
        std::printf("FAIL: world %d; built for worlds up to %d\n", N, HARNESS_MAX_WORLD);
        std::fflush(stdout);
        std::_Exit(2);
    } else if constexpr (Cluster) {
        prepare::cluster_kernel<Algorithm, T, N>(params);
    } else {
        prepare::block_kernel<Algorithm, T, N>(params);
    }
}

template <typename Algorithm, typename T, bool Cluster>
void entry(LaunchParams params) {
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
