#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs NVRTC 13.0 from its pip wheel into
# .venv (no GPU or CUDA toolkit needed to compile kernels), then formatting, lints and tests.
# GPU tests are ignored here; scripts/gpu-tests.sh runs them on a machine with GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."

nvrtc_wheel="nvidia-cuda-nvrtc==13.0.88"
if [ ! -x .venv/bin/python3 ]; then
    python3 -m venv .venv
fi
if ! .venv/bin/python3 -m pip show nvidia-cuda-nvrtc 2>/dev/null | grep -q '^Version: 13\.0\.88$'; then
    .venv/bin/python3 -m pip install --quiet --disable-pip-version-check "$nvrtc_wheel"
fi
nvrtc_dir=$(.venv/bin/python3 -c 'import nvidia, os; print(os.path.join(list(nvidia.__path__)[0], "cu13", "lib"))')
export PREPARE_NVRTC="$nvrtc_dir"
# Tests that need NVRTC fail instead of skipping when it cannot be found.
export PREPARE_REQUIRE_NVRTC=1
# NVRTC answers repeated compiles from the CUDA compute cache without ptxas's report.
export CUDA_CACHE_DISABLE=1

cargo fmt --check
cargo clippy --all-targets --locked -- -D warnings
cargo test --locked
