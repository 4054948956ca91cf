#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs NVRTC 13.0 from its pip wheel into
# .venv (no GPU or CUDA toolkit needed to compile kernels), then formatting, lints and tests of
# the workspace (the tool and its C ABI, whose C program is compiled with cc), then builds the
# Python package from the checkout into .venv (without torch) and runs its torch-free tests.
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
# The lints run inside the tests' build, as `cargo clippy --all-targets --workspace -- -D warnings`
# runs them (cargo-clippy sets these two variables for `cargo check`): clippy-driver compiles the
# workspace's crates, so every dependency is built once, not checked and then built again, and a
# lint fails the build before any test runs. The tests' targets are clippy's `--all-targets`.
clippy_driver="$(rustc --print sysroot)/bin/clippy-driver"
if [ ! -x "$clippy_driver" ]; then
    echo "clippy is not installed for this toolchain ($clippy_driver): rustup component add clippy" >&2
    exit 1
fi
RUSTC_WORKSPACE_WRAPPER="$clippy_driver" CLIPPY_ARGS="-Dwarnings__CLIPPY_HACKERY__" \
    cargo test --workspace --locked

# The Python package, built as a user would (one pip command), in debug: it reuses the
# workspace's target directory that the tests just filled, and only its error paths run here.
if ! .venv/bin/python3 -m pip show pytest >/dev/null 2>&1; then
    .venv/bin/python3 -m pip install --quiet --disable-pip-version-check "pytest>=7"
fi
# The profile also tells the tests which generated prepare.h the package was built with.
export PREPARE_WHEEL_PROFILE=debug
.venv/bin/python3 -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps \
    ./python
if .venv/bin/python3 -c 'import torch' 2>/dev/null; then
    echo "torch is installed in .venv: the torch-free tests must run without it" >&2
    exit 1
fi
.venv/bin/python3 -m pytest -q -rs -p no:cacheprovider tests/python/
