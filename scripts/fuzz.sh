#!/usr/bin/env bash
# Runs every fuzz target in fuzz/ for a fixed time each (FUZZ_SECONDS, default 60): ladder
# bytes and ladder shapes under a 300 MB resident-memory limit, the cubin check, the manifest
# parser and the choice reader. Needs cargo-fuzz (`cargo install cargo-fuzz`); on a stable
# toolchain RUSTC_BOOTSTRAP=1 lets it pass the nightly flags it uses. Findings are left in
# fuzz/artifacts/<target>/ and the script exits non-zero.
#
# Without a sanitizer: the code fuzzed is safe Rust, so what is looked for is a panic (debug
# assertions and overflow checks are on), a hang, or memory past the limit, which an
# AddressSanitizer's own quarantine would blur.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds="${FUZZ_SECONDS:-60}"
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(ladder_bytes ladder_shapes cubin_check manifest choice)
fi
export RUSTC_BOOTSTRAP=1

# Seeds: the shipped and fixture ladders for every JSON reader; cubins and a manifest when a
# package was exported to fuzz/seed-package (`prepare export ... --out fuzz/seed-package`).
seed() {
    local target="$1"
    local corpus="fuzz/corpus/$target"
    mkdir -p "$corpus"
    case "$target" in
        ladder_bytes | manifest | choice)
            cp ladders/*.json tests/fixtures/ladders/valid/*.json "$corpus/" 2>/dev/null || true
            ;;
    esac
    if [ "$target" = ladder_shapes ]; then
        # depth, key length, width, array length (in eights), duplicate keys: the worst shapes.
        printf '\x64\x07\xd0\x00\x00\x04\xe2\x00' >"$corpus/deep-long-keys-around-an-array"
        printf '\x00\x00\x00\x9c\x40\x00\x00\x00' >"$corpus/wide"
        printf '\x28\x4e\x1f\x00\x00\x00\x00\x00' >"$corpus/long-keys"
        printf '\x00\x00\x00\x00\x00\x75\x30\x00' >"$corpus/long-array"
        printf '\x7f\x00\x01\x9c\x40\x00\x10\x01' >"$corpus/deep-duplicates"
    fi
    if [ -d fuzz/seed-package ]; then
        case "$target" in
            manifest) cp fuzz/seed-package/manifest.json "$corpus/seed-manifest.json" ;;
            cubin_check) cp fuzz/seed-package/kernels/*.cubin "$corpus/" 2>/dev/null || true ;;
        esac
    fi
}

status=0
for target in "${targets[@]}"; do
    seed "$target"
    case "$target" in
        ladder_bytes | ladder_shapes) limits=(-rss_limit_mb=300 -max_len=1048576) ;;
        *) limits=(-rss_limit_mb=2048 -max_len=1048576) ;;
    esac
    echo "== $target: ${seconds} s"
    if ! cargo fuzz run --fuzz-dir fuzz --sanitizer none "$target" "fuzz/corpus/$target" -- \
        -max_total_time="$seconds" -timeout=30 "${limits[@]}"; then
        echo "== $target: found a problem; see fuzz/artifacts/$target/"
        status=1
    fi
done
exit "$status"
