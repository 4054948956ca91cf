"""The sequence-parallel step beside all-reduce then RMSNorm (no torch at import): per token
count, a bf16 partial sum of tokens x hidden on every rank becomes its RMSNorm on every rank,

* by all-reduce then RMSNorm of every row (`torch_all_reduce`: `dist.all_reduce`;
  `prepare_all_reduce`: `Collectives.all_reduce`), in place on the partial sum;
* by reduce-scatter, RMSNorm of the owned rows, all-gather (`prepare_sequence_parallel`:
  `Collectives.reduce_scatter` and `.all_gather`, rows by `prepare.owned_rows`;
  `torch_sequence_parallel`: `reduce_scatter_tensor` and `all_gather_into_tensor`, the tokens
  padded with zero rows to a multiple of the world, as vLLM's sequence parallelism pads them).

Each step is captured, checked bit for bit against the RMSNorm of the reference sum (fp32 in
rank order, rounded once) and timed with the bench's method. The RMSNorm is batch-invariant
(the same operations on every row whatever the rows), so normalizing the owned rows gives the
bits of normalizing all of them."""

from .common import format_bytes, log
from .contenders import Contender
from .rules import owned_rows

EPS = 1e-6


def rms_norm_into(torch, x, weight, out):
    """`out` = RMSNorm of every row of `x` in fp32, rounded once to `out`'s dtype: x *
    rsqrt(mean(x^2) + eps) * weight. The sum of squares halves the row with element-wise
    additions down to its odd factor, then adds those terms in order: the same operations on
    every row whatever the number of rows."""
    squares = x.float() * x.float()
    while squares.shape[-1] % 2 == 0 and squares.shape[-1] > 1:
        half = squares.shape[-1] // 2
        squares = squares[..., :half] + squares[..., half:]
    total = squares[..., :1]
    for index in range(1, squares.shape[-1]):
        total = total + squares[..., index : index + 1]
    scale = torch.rsqrt(total / x.shape[-1] + EPS)
    out.copy_(x.float() * scale * weight.float())
    return out


class Step(Contender):
    """One way from the partial sum `y` (tokens x hidden) to its RMSNorm `z` on every rank."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.hidden = ctx.args.hidden
        self.tokens = 0
        self.y = self.z = None
        self.buffers = {}

    def matrix(self, name, rows):
        """`rows` x hidden of the buffer `name` (allocated for the most tokens)."""
        return self.buffers[name][: rows * self.hidden].view(rows, self.hidden)

    def allocate(self, max_tokens):
        world = self.ctx.world
        padded = -(-max_tokens // world) * world
        for name in ("y", "z", "mine", "normed"):
            self.buffers[name] = self._empty(padded * self.hidden)

    def bind(self, tokens):
        self.tokens = tokens
        self.y = self.matrix("y", tokens)
        self.z = self.matrix("z", tokens)

    def reset(self, pristine):
        self.y.copy_(pristine.view(self.y.shape))

    def result(self):
        return self.z.reshape(-1)

    def norm(self, x, out):
        return rms_norm_into(self.ctx.torch, x, self.ctx.weight, out)

    def close(self):
        super().close()
        self.buffers = {}
        self.y = self.z = None


class TorchAllReduce(Step):
    name = "torch_all_reduce"

    def op(self):
        self.ctx.dist.all_reduce(self.y)
        self.norm(self.y, self.z)


class PrepareAllReduce(Step):
    name = "prepare_all_reduce"

    def allocate(self, max_tokens):
        self.ctx.prepare_collectives()
        super().allocate(max_tokens)

    def op(self):
        self.ctx.prepare_collectives().all_reduce(self.y)
        self.norm(self.y, self.z)


class PrepareSequenceParallel(Step):
    name = "prepare_sequence_parallel"

    def allocate(self, max_tokens):
        self.ctx.prepare_collectives()
        super().allocate(max_tokens)

    def bind(self, tokens):
        super().bind(tokens)
        owned = len(owned_rows(tokens, self.ctx.world, self.ctx.rank))
        self.mine = self.matrix("mine", owned)
        self.normed = self.matrix("normed", owned)

    def op(self):
        collectives = self.ctx.prepare_collectives()
        collectives.reduce_scatter(self.y, out=self.mine)
        self.norm(self.mine, self.normed)
        collectives.all_gather(self.normed, out=self.z)


class TorchSequenceParallel(Step):
    """PyTorch's collectives take equal rows per rank: the tokens are padded with zero rows."""

    name = "torch_sequence_parallel"

    def bind(self, tokens):
        world = self.ctx.world
        padded = -(-tokens // world) * world
        self.tokens = tokens
        self.y_padded = self.matrix("y", padded)
        self.y_padded[tokens:].zero_()
        self.y = self.y_padded[:tokens]
        self.z_padded = self.matrix("z", padded)
        self.z = self.z_padded[:tokens]
        self.mine = self.matrix("mine", padded // world)
        self.normed = self.matrix("normed", padded // world)

    def op(self):
        dist = self.ctx.dist
        dist.reduce_scatter_tensor(self.mine, self.y_padded)
        self.norm(self.mine, self.normed)
        dist.all_gather_into_tensor(self.z_padded, self.normed)


STEP_TYPES = {
    step.name: step
    for step in (TorchAllReduce, TorchSequenceParallel, PrepareAllReduce, PrepareSequenceParallel)
}


def partial_sum(bench, elements, seed):
    """A rank's partial sum: normal values in bf16 (finite under the few in-place all-reduces
    one replay holds)."""
    torch = bench.torch
    generator = torch.Generator(device=bench.device)
    generator.manual_seed(seed)
    values = torch.randn(elements, generator=generator, device=bench.device)
    return values.to(torch.bfloat16)


def run_steps(bench):
    """Every token count of `bench.args.tokens`, one after the other: rows, notes and JSON."""
    torch = bench.torch
    args = bench.args
    hidden = args.hidden
    generator = torch.Generator(device=bench.device)
    generator.manual_seed(4321)
    weight = torch.randn(hidden, generator=generator, device=bench.device) / 8 + 1
    bench.weight = weight.to(torch.bfloat16)
    bench.header["sequence_parallel"] = {"hidden": hidden, "tokens": list(args.tokens)}
    bench.contenders = [STEP_TYPES[name](bench) for name in args.contenders]
    for contender in bench.contenders:
        bench.kick(f"allocating {contender.name}")
        contender.error = bench.agreed_error(
            bench.attempt(lambda c=contender: c.allocate(max(args.tokens)))
        )
    for index, tokens in enumerate(args.tokens):
        nbytes = tokens * hidden * 2
        log(bench.rank, f"{tokens} tokens x {hidden} ({format_bytes(nbytes)})")
        rows = step_rows(bench, tokens, index)
        bench.rows.extend(rows)
        bench.print_rows(rows)
    bench.print_notes()
    bench.write_json(complete=True)
    bench.kick("releasing buffers")
    bench.drop_graphs()
    torch.cuda.synchronize()
    bench.agree(None)
    for contender in bench.contenders:
        contender.close()
    if bench.prepare is not None:
        bench.prepare.close()
        bench.prepare = None


def step_rows(bench, tokens, index):
    """One token count's rows: every step checked and timed against the others."""
    torch = bench.torch
    hidden = bench.args.hidden
    elements = tokens * hidden
    nbytes = elements * 2
    state = {}

    def make_inputs():
        seed = bench.input_seed(index, bench.rank)
        state["pristine"] = partial_sum(bench, elements, seed)
        total = None
        for rank in range(bench.world):
            part = partial_sum(bench, elements, bench.input_seed(index, rank)).float()
            total = part if total is None else total.add_(part)
        summed = total.to(torch.bfloat16).view(tokens, hidden)
        expected = torch.empty_like(summed)
        state["reference"] = rms_norm_into(torch, summed, bench.weight, expected).reshape(-1)
        torch.cuda.synchronize()

    bench.row_shape = {"tokens": tokens, "hidden": hidden}
    error = bench.agreed_error(bench.attempt(make_inputs))
    if error is not None:
        return [bench.error_row(nbytes, c, c.error or f"inputs: {error}") for c in bench.contenders]
    rows = bench.time_contenders(
        nbytes, tokens, bench.contenders, state["pristine"], state["reference"]
    )
    for row in rows:
        # A step is two collectives and a norm: no one bus bandwidth.
        row["bus_gbps"] = None
    return rows
