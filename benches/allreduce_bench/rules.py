"""The bench's rules per collective, the same as `prepare bench`'s (src/bench): the bus
bandwidth's factor and the rows x width a reduce-scatter or all-gather of a size is timed at.
tests/fixtures/bench/collective_rules.json holds both benches to one table (no torch)."""

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather")
ROW_COLLECTIVES = ("reduce_scatter", "all_gather")
# Elements per row of the timed reduce-scatters and all-gathers (src/bench/shape.rs).
BENCH_WIDTH = 4096
# Links a byte of the full message crosses per rank and (n-1)/n, as nccl-tests counts them.
_LINKS = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "all_reduce_add_rms_norm": 2}


def bus_factor(collective, world):
    """What the bus bandwidth multiplies the full message's bytes per second by: 2(n-1)/n for
    the all-reduce, (n-1)/n for the reduce-scatter and the all-gather."""
    if collective not in _LINKS:
        raise ValueError(f"no bus factor for the collective {collective!r}")
    return _LINKS[collective] * max(world - 1, 0) / world


def operation(collective):
    """One operation's name in the bench's words ("all-reduce")."""
    return collective.replace("_", "-")


def bench_shape(nbytes, element_bytes, world, bucket=None):
    """(rows, width) a reduce-scatter or all-gather of `nbytes` (the full message's) is timed
    at: width 4096 elements, or the elements over the world rounded up where that is less (every
    rank gets a row); rows the elements over the width rounded up, down where that leaves
    `bucket` (inclusive bytes, or None for no bucket), else rows of one element."""
    elements = max(1, -(-nbytes // max(element_bytes, 1)))
    width = min(BENCH_WIDTH, max(1, -(-elements // max(world, 1))))

    def fits(rows):
        if rows <= 0:
            return False
        return bucket is None or bucket[0] <= rows * width * element_bytes <= bucket[1]

    for rows in (-(-elements // width), elements // width):
        if fits(rows):
            return rows, width
    return elements, 1


def owned_rows(rows, world, rank):
    """The rows rank `rank` owns: a contiguous run, the first `rows % world` ranks one more
    (`prepare.owned_rows`, which needs the package; this copy serves the torch-only runs)."""
    base, extra = divmod(rows, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))
