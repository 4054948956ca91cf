"""The fused all-reduce + residual add + RMSNorm's reference, bf16, as docs/design.md pins it
(src/reference/epilogue.rs), in plain Python (no torch, no numpy): every operation is done in
double and rounded to fp32, which gives the correctly rounded fp32 result of each addition,
multiplication, division and square root (a double holds more than twice fp32's precision).

1. the sum: fp32 in rank order from rank 0's value, rounded once to bf16;
2. `residual_out = bf16(f32(sum) + f32(residual))`;
3. per row, the sum of squares of `r = f32(residual_out)`: lane `l` of 2048 sums `r[i] * r[i]`
   for `i = l, l + 2048, ...` in order from +0, then a pairwise tree over the lanes;
4. `inv = 1 / sqrt(ss / hidden + eps)`, each operation rounded;
5. `normed = bf16((r * inv) * w)`, the two products rounded to fp32.

Values are bf16 bits (ints 0..65535) in flat row-major lists."""

import math
from array import array

# Lanes of the pinned sum of squares (`NORM_LANES`, src/abi.rs).
NORM_LANES = 2048
CANONICAL_NAN_BF16 = 0x7FC0


def f32(values):
    """Each value rounded to the nearest fp32 (ties to even), as floats."""
    return array("f", values)


def f32_bits(values):
    """The fp32 bits of each value, rounded to fp32 first."""
    bits = array("I")
    bits.frombytes(f32(values).tobytes())
    return bits


def bf16_bits(values):
    """Each value rounded to fp32, then to the nearest bf16 (ties to even); NaN is 0x7FC0."""
    out = []
    for bits in f32_bits(values):
        if (bits & 0x7F800000) == 0x7F800000 and (bits & 0x007FFFFF):
            out.append(CANONICAL_NAN_BF16)
        else:
            out.append(((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF)
    return out


def bf16_values(bits):
    """The fp32 value of each bf16 (exact)."""
    words = array("I", (int(b) << 16 for b in bits))
    values = array("f")
    values.frombytes(words.tobytes())
    return values


def sum_of_squares(row):
    """A row's sum of squares in the pinned order (`row`: fp32 values)."""
    squares = f32(value * value for value in row)
    lanes = f32([0.0] * NORM_LANES)
    for start in range(0, len(squares), NORM_LANES):
        chunk = squares[start : start + NORM_LANES]
        lanes = f32(a + b for a, b in zip(lanes, chunk)) + lanes[len(chunk) :]
    while len(lanes) > 1:
        lanes = f32(lanes[2 * i] + lanes[2 * i + 1] for i in range(len(lanes) // 2))
    return lanes[0]


def inverse_rms(sum_of_squares_value, hidden, eps):
    """`1.0f / sqrtf(ss / (float)hidden + eps)`, each operation rounded to fp32."""
    (mean,) = f32([sum_of_squares_value / float(hidden)])
    (shifted,) = f32([mean + f32([eps])[0]])
    (root,) = f32([math.sqrt(shifted)]) if shifted >= 0 else f32([math.nan])
    (inverse,) = f32([1.0 / root]) if root != 0 else f32([math.inf])
    return inverse


def reference_epilogue(inputs, residual, weight, hidden, eps):
    """Every rank's outputs: `(normed, residual_out)` as bf16 bits, from each rank's `x`
    (`inputs[r]`, rows x hidden bf16 bits), the residual (the same length, or None) and the
    weight (hidden bf16 bits)."""
    if not inputs:
        raise ValueError("the reference needs at least one rank's input")
    count = len(inputs[0])
    if hidden < 1 or count % hidden:
        raise ValueError(f"{count} elements are not whole rows of {hidden}")
    for rank, part in enumerate(inputs):
        if len(part) != count:
            raise ValueError(f"rank {rank} has {len(part)} elements, rank 0 {count}")
    if residual is not None and len(residual) != count:
        raise ValueError(f"the residual has {len(residual)} elements, x {count}")
    if len(weight) != hidden:
        raise ValueError(f"the weight has {len(weight)} elements, the hidden size is {hidden}")
    if math.isnan(eps) or eps < 0:
        raise ValueError(f"eps is {eps}; it must be 0 or more")
    total = bf16_values(inputs[0])
    for part in inputs[1:]:
        total = f32(a + b for a, b in zip(total, bf16_values(part)))
    summed = bf16_bits(total)
    if residual is None:
        residual_out = summed
    else:
        residual_out = bf16_bits(
            a + b for a, b in zip(bf16_values(summed), bf16_values(residual))
        )
    values = bf16_values(residual_out)
    w = bf16_values(weight)
    normed = []
    for start in range(0, count, hidden):
        row = values[start : start + hidden]
        inv = inverse_rms(sum_of_squares(row), hidden, eps)
        scaled = f32(value * inv for value in row)
        normed.extend(bf16_bits(a * b for a, b in zip(scaled, w)))
    return normed, list(residual_out)


def differing(got, expected):
    """How many elements of two equal-length bit lists differ."""
    if len(got) != len(expected):
        raise ValueError(f"{len(got)} elements against {len(expected)}")
    return sum(1 for a, b in zip(got, expected) if a != b)
