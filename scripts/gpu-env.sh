#!/usr/bin/env bash
# Sourced by the GPU scripts (gpu-tests.sh, gpu-bench.sh, gpu-world.sh) on the GPU machine, with
# `carry` set to the folder scripts/build-gpu-tests.sh gathered. It sets up NVRTC (CUDA's lib64),
# says which NCCL the tool should find (PyTorch's wheel, which it finds by itself), requires GPUs
# (PREPARE_REQUIRE_GPU=1, so a run that finds none fails) and keeps NVLink multicast off.
export PREPARE_REQUIRE_GPU=1
# NVLink multicast can take a shared host's GPUs out of service: never turn it on.
export NCCL_NVLS_ENABLE=0
export TORCH_SYMM_MEM_DISABLE_MULTICAST=1
export NVSHMEM_DISABLE_NVLS=1
export INSTA_UPDATE=no
# Snapshots are inline; this keeps insta from looking for the build machine's checkout.
export INSTA_WORKSPACE_ROOT=$PWD
# Tests that compile kernels fail instead of skipping when NVRTC is missing.
export PREPARE_REQUIRE_NVRTC=1
# NVRTC answers repeated compiles from the CUDA compute cache without ptxas's report.
export CUDA_CACHE_DISABLE=1
export RUST_BACKTRACE=1

cuda_lib=${CUDA_HOME:-/usr/local/cuda}/lib64
if [ -e "$cuda_lib/libnvrtc.so.13" ]; then
    export PREPARE_NVRTC=$cuda_lib/libnvrtc.so.13
    export LD_LIBRARY_PATH=$cuda_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
    echo "warning: no libnvrtc.so.13 in $cuda_lib; kernels cannot be compiled" >&2
fi

# NCCL needs no setup: the tool finds PyTorch's wheel in the Python environment itself. This
# only says which one it should find.
nccl_dir=$(python3 -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))" 2>/dev/null ||
    python3 -c "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])" 2>/dev/null || true)
if [ -z "$nccl_dir" ] || [ ! -e "$nccl_dir/lib/libnccl.so.2" ]; then
    nccl_dir=
    echo "warning: no NCCL wheel (python3 -c 'import nvidia.nccl'); NCCL tests need libnccl.so.2" >&2
fi

if [ -x "$carry/bin/prepare" ]; then
    export PREPARE_BIN=$carry/bin/prepare
fi
if [ -x "$carry/bin/serve" ]; then
    export PREPARE_SERVE=$carry/bin/serve
fi
if [ -d "$carry/ladders" ]; then
    export PREPARE_LADDERS=$carry/ladders
fi

