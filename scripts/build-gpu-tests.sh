#!/usr/bin/env bash
# Builds what a GPU run needs, here (the GPU machine has no Rust toolchain), and gathers it in
# .device-carry/ (git-ignored): the release `prepare` binary and `serve` example, the integration
# test binary (tests/integration.rs, whose gpu group, tests/gpu/, is what runs there) and the
# library's unit tests built in release, this folder's scripts and the shipped ladders. The
# integration binary's cpu and nvrtc groups are left to CI: some read files by this checkout's
# path, which the GPU machine does not have. Then on the GPU machine, from the repository root:
# bash .device-carry/scripts/gpu-tests.sh
#
# usage: scripts/build-gpu-tests.sh [DESTINATION]   (default: .device-carry in this checkout)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
destination=${1:-$root/.device-carry}
cd "$root"

cargo build --release --bin prepare --example serve
# Build first with the compiler's messages shown, so a test that does not build stops here.
cargo test --release --no-run
# One JSON line per artifact; test binaries are those with `profile.test` set.
mapfile -t tests < <(
    cargo test --release --no-run --message-format=json 2>/dev/null |
        jq -r 'select(.reason == "compiler-artifact" and .profile.test == true and .executable != null)
               | "\(.target.name)\t\(.target.kind[0])\t\(.executable)"'
)
if [ "${#tests[@]}" -eq 0 ]; then
    echo "no test binaries were built" >&2
    exit 1
fi

rm -rf "$destination"
mkdir -p "$destination/bin" "$destination/tests" "$destination/scripts"
cp target/release/prepare target/release/examples/serve "$destination/bin/"
for entry in "${tests[@]}"; do
    IFS=$'\t' read -r name kind executable <<<"$entry"
    # The library's and the binary's unit tests share the crate's name; keep them apart.
    case "$kind:$name" in
    lib:*) copy="unit-lib" ;;
    test:integration) copy="$name" ;;
    *) continue ;;
    esac
    cp "$executable" "$destination/tests/$copy"
done
cp scripts/gpu-env.sh scripts/gpu-tests.sh scripts/gpu-bench.sh scripts/gpu-world.sh scripts/gpu-one-gpu.sh "$destination/scripts/"
if [ -d ladders ]; then
    cp -r ladders "$destination/ladders"
fi

echo "gathered in $destination:"
(cd "$destination" && find . -type f -printf '%10s  %p\n' | sort -k2)
du -sh "$destination"
