"""The fused all-reduce + residual add + RMSNorm against its peers (no torch at import): per
token count, bf16 x (tokens x hidden) on every rank, a residual every rank shares and a
weight; each contender leaves `residual_out` (the sum plus the residual, in the residual) and
`normed` (RMSNorm of it times the weight).

* `torch_nccl_rms_norm`: `dist.all_reduce(x)`, `residual += x`, `torch.nn.functional.rms_norm`;
* `torch_nccl_triton`: `dist.all_reduce(x)`, then a Triton kernel, one program per row, adding
  the residual in fp32 and normalising the rounded row (the unfused peer where FlashInfer
  cannot be installed);
* `prepare_fused`: `prepare.Collectives.all_reduce_add_rms_norm(x, residual, weight, eps,
  out=normed)` (the package's tuned choice: fused, or an all-reduce then `add_rms_norm`);
* `flashinfer_fp32_acc`, `flashinfer_bf16_acc`: FlashInfer's `allreduce_fusion` (TensorRT-LLM's
  kernels, its `trtllm` backend, no multicast) with `fp32_acc` on and off; unavailable, with
  the import's error, where flashinfer cannot be imported.

Every contender's outputs are compared bit for bit with prepare's reference
(`epilogue_reference`, docs/design.md) once per token count, the differing elements counted
per rank; exactness is reported, not asserted. Each is timed with the bench's method (graphs
of back-to-back calls, interleaved rounds, the slowest rank's median) and, in the decode
emulation, as 61 layers x 2 calls of batch x hidden in one graph."""

from .common import format_bytes, log
from .contenders import Contender
from .epilogue_reference import differing, reference_epilogue

EPS = 1e-6
# The decode model: layers x epilogues per layer (the attention's and the MLP's outputs).
DECODE_LAYERS = 61
DECODE_PER_LAYER = 2
FLASHINFER = ("flashinfer_fp32_acc", "flashinfer_bf16_acc")


def epilogue_summary(rows):
    """Per token count, each timed contender's median over `prepare_fused`'s (above 1: prepare
    is faster), from the table's rows: {tokens: {contender: ratio}}."""
    by_tokens = {}
    for row in rows:
        if row.get("median_us") is not None:
            by_tokens.setdefault(row["tokens"], {})[row["contender"]] = row["median_us"]
    summary = {}
    for tokens, medians in sorted(by_tokens.items()):
        fused = medians.get("prepare_fused")
        if fused:
            summary[tokens] = {
                name: median / fused for name, median in medians.items() if name != "prepare_fused"
            }
    return summary


def summary_lines(summary):
    """The ratio lines printed after the table."""
    lines = []
    for tokens, ratios in summary.items():
        parts = ", ".join(f"{name} {ratio:.2f}x" for name, ratio in sorted(ratios.items()))
        lines.append(f"{tokens} tokens: over prepare_fused: {parts}")
    return lines


def mismatch_note(label, name, counts):
    """The note for a contender whose outputs differ from the reference somewhere: per rank
    the differing elements of normed and of residual_out."""
    per_rank = ", ".join(
        f"rank {rank}: normed {normed}, residual_out {residual}"
        for rank, (normed, residual) in enumerate(counts)
    )
    return f"{label} {name}: not bit-exact against prepare's epilogue reference ({per_rank})"


def triton_kernel(triton, tl):
    """The fused add + RMSNorm after NCCL: one program per row. The sum is added to the
    residual in fp32 and rounded once (residual_out); the rounded row's squares are summed
    with `tl.sum`; `normed = bf16((r * rsqrt(mean + eps)) * w)`."""

    @triton.jit
    def add_rms_norm(x_ptr, residual_ptr, weight_ptr, normed_ptr, hidden, eps,
                     BLOCK: tl.constexpr):
        row = tl.program_id(0)
        offsets = tl.arange(0, BLOCK)
        mask = offsets < hidden
        base = row * hidden
        x = tl.load(x_ptr + base + offsets, mask=mask, other=0.0).to(tl.float32)
        residual = tl.load(residual_ptr + base + offsets, mask=mask, other=0.0).to(tl.float32)
        summed = (x + residual).to(tl.bfloat16)
        tl.store(residual_ptr + base + offsets, summed, mask=mask)
        r = summed.to(tl.float32)
        mean = tl.sum(r * r, axis=0) / hidden
        inv = 1.0 / tl.sqrt(mean + eps)
        w = tl.load(weight_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        tl.store(normed_ptr + base + offsets, ((r * inv) * w).to(tl.bfloat16), mask=mask)

    return add_rms_norm


class Epilogue(Contender):
    """One way from x and the residual to `residual_out` and `normed` on every rank."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.hidden = ctx.args.hidden
        self.tokens = 0
        self.buffers = {}
        self.x = self.residual = self.normed = None

    def matrix(self, name, rows):
        return self.buffers[name][: rows * self.hidden].view(rows, self.hidden)

    def allocate(self, max_tokens):
        for name in ("x", "residual", "normed"):
            self.buffers[name] = self._empty(max_tokens * self.hidden)

    def bind(self, tokens):
        self.tokens = tokens
        self.x = self.matrix("x", tokens)
        self.residual = self.matrix("residual", tokens)
        self.normed = self.matrix("normed", tokens)

    def reset(self, pristine):
        x, residual = pristine
        self.x.copy_(x.view(self.x.shape))
        self.residual.copy_(residual.view(self.residual.shape))

    def result(self):
        torch = self.ctx.torch
        return torch.cat([self.normed.reshape(-1), self.residual.reshape(-1)])

    def close(self):
        super().close()
        self.buffers = {}
        self.x = self.residual = self.normed = None


class TorchNcclRmsNorm(Epilogue):
    name = "torch_nccl_rms_norm"

    def op(self):
        torch = self.ctx.torch
        self.ctx.dist.all_reduce(self.x)
        self.residual.add_(self.x)
        self.normed.copy_(
            torch.nn.functional.rms_norm(self.residual, (self.hidden,), self.ctx.weight, EPS)
        )


class TorchNcclTriton(Epilogue):
    name = "torch_nccl_triton"

    def allocate(self, max_tokens):
        import triton
        import triton.language as tl

        self.kernel = triton_kernel(triton, tl)
        self.block = triton.next_power_of_2(self.hidden)
        super().allocate(max_tokens)

    def op(self):
        self.ctx.dist.all_reduce(self.x)
        self.kernel[(self.tokens,)](
            self.x, self.residual, self.ctx.weight, self.normed, self.hidden, EPS,
            BLOCK=self.block, num_warps=8,
        )


class PrepareFused(Epilogue):
    name = "prepare_fused"

    def allocate(self, max_tokens):
        self.ctx.prepare_collectives()
        super().allocate(max_tokens)

    def op(self):
        self.ctx.prepare_collectives().all_reduce_add_rms_norm(
            self.x, self.residual, self.ctx.weight, EPS, out=self.normed
        )


class FlashInfer(Epilogue):
    """`flashinfer.comm.allreduce_fusion` with the `kARResidualRMSNorm` pattern: residual_out
    into a buffer of its own, copied back over the residual by `result` only (the next call
    reads the residual as given, as a server's next layer would read residual_out)."""

    fp32_acc = True

    def allocate(self, max_tokens):
        import flashinfer.comm as comm

        self.comm = comm
        self.workspace = comm.create_allreduce_fusion_workspace(
            backend="trtllm",
            world_size=self.ctx.world,
            rank=self.ctx.rank,
            max_token_num=max_tokens,
            hidden_dim=self.hidden,
            dtype=self.ctx.torch.bfloat16,
        )
        super().allocate(max_tokens)
        for name in ("residual_out", "allreduce_out"):
            self.buffers[name] = self._empty(max_tokens * self.hidden)

    def bind(self, tokens):
        super().bind(tokens)
        self.residual_out = self.matrix("residual_out", tokens)
        self.allreduce_out = self.matrix("allreduce_out", tokens)

    def op(self):
        self.comm.allreduce_fusion(
            input=self.x,
            workspace=self.workspace,
            pattern=self.comm.AllReduceFusionPattern.kARResidualRMSNorm,
            launch_with_pdl=False,
            output=self.allreduce_out,
            residual_in=self.residual,
            residual_out=self.residual_out,
            norm_out=self.normed,
            rms_gamma=self.ctx.weight,
            rms_eps=EPS,
            fp32_acc=self.fp32_acc,
        )

    def result(self):
        torch = self.ctx.torch
        return torch.cat([self.normed.reshape(-1), self.residual_out.reshape(-1)])

    def close(self):
        workspace = getattr(self, "workspace", None)
        if workspace is not None:
            workspace.destroy()
            self.workspace = None
        super().close()


class FlashInferFp32Acc(FlashInfer):
    name = "flashinfer_fp32_acc"
    fp32_acc = True


class FlashInferBf16Acc(FlashInfer):
    name = "flashinfer_bf16_acc"
    fp32_acc = False


EPILOGUE_TYPES = {
    kind.name: kind
    for kind in (TorchNcclRmsNorm, TorchNcclTriton, PrepareFused, FlashInferFp32Acc,
                 FlashInferBf16Acc)
}


def flashinfer_refusal():
    """Why FlashInfer's contenders cannot run here, or None when `flashinfer.comm` imports
    with `allreduce_fusion` and its workspace set-up."""
    try:
        import flashinfer.comm as comm
    except Exception as exc:  # noqa: BLE001 - any failure to import is the reason
        return f"flashinfer cannot be imported: {type(exc).__name__}: {exc}"
    missing = [name for name in ("allreduce_fusion", "create_allreduce_fusion_workspace",
                                 "AllReduceFusionPattern") if not hasattr(comm, name)]
    if missing:
        return f"flashinfer.comm has no {', '.join(missing)}"
    return None


def normal_bf16(bench, elements, seed, scale=1.0, shift=0.0):
    """Normal values times `scale` plus `shift`, in bf16 (finite under the few in-place
    all-reduces one replay holds)."""
    torch = bench.torch
    generator = torch.Generator(device=bench.device)
    generator.manual_seed(seed)
    values = torch.randn(elements, generator=generator, device=bench.device) * scale + shift
    return values.to(torch.bfloat16)


def run_epilogue(bench):
    """Every token count of `bench.args.tokens`, then the decode emulation: rows, notes, JSON."""
    torch = bench.torch
    args = bench.args
    hidden = args.hidden
    bench.weight = normal_bf16(bench, hidden, 4321, scale=1 / 8, shift=1.0)
    refusal = flashinfer_refusal() if any(n in FLASHINFER for n in args.contenders) else None
    bench.header["epilogue"] = {
        "hidden": hidden,
        "tokens": list(args.tokens),
        "eps": EPS,
        "decode": {"layers": DECODE_LAYERS, "per_layer": DECODE_PER_LAYER,
                   "batches": list(args.decode_batches)},
        "flashinfer": refusal or "imported",
    }
    bench.contenders = [EPILOGUE_TYPES[name](bench) for name in args.contenders]
    most = max(list(args.tokens) + list(args.decode_batches))
    for contender in bench.contenders:
        if contender.name in FLASHINFER and refusal is not None:
            contender.error = refusal
            continue
        bench.kick(f"allocating {contender.name}")
        contender.error = bench.agreed_error(
            bench.attempt(lambda c=contender: c.allocate(most))
        )
    for index, tokens in enumerate(args.tokens):
        log(bench.rank, f"{tokens} tokens x {hidden} ({format_bytes(tokens * hidden * 2)})")
        rows = epilogue_rows(bench, tokens, index, ops=None)
        bench.rows.extend(rows)
        bench.print_rows(rows)
    for index, batch in enumerate(args.decode_batches):
        log(bench.rank, f"decode: {DECODE_LAYERS} x {DECODE_PER_LAYER} of {batch} x {hidden}")
        rows = epilogue_rows(bench, batch, 1000 + index, ops=DECODE_LAYERS * DECODE_PER_LAYER)
        bench.rows.extend(rows)
        bench.print_rows(rows)
    summary = epilogue_summary([row for row in bench.rows if not row.get("decode")])
    bench.header["epilogue"]["over_prepare_fused"] = {
        str(tokens): ratios for tokens, ratios in summary.items()
    }
    if bench.rank == 0:
        for line in summary_lines(summary):
            print(line)
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


def epilogue_rows(bench, tokens, index, ops):
    """One token count's rows: every contender checked against the reference and timed against
    the others; with `ops`, the decode step (that many calls per replay, times per step)."""
    torch = bench.torch
    hidden = bench.args.hidden
    elements = tokens * hidden
    nbytes = elements * 2
    state = {}

    def make_inputs():
        x = [normal_bf16(bench, elements, bench.input_seed(index, rank))
             for rank in range(bench.world)]
        residual = normal_bf16(bench, elements, bench.input_seed(index, 7777))
        state["pristine"] = (x[bench.rank], residual)
        if ops is None:
            as_bits = [part.view(torch.int16).tolist() for part in x]
            normed, residual_out = reference_epilogue(
                [[value & 0xFFFF for value in part] for part in as_bits],
                [value & 0xFFFF for value in residual.view(torch.int16).tolist()],
                [value & 0xFFFF for value in bench.weight.view(torch.int16).tolist()],
                hidden,
                EPS,
            )
            state["reference"] = (normed, residual_out)
        torch.cuda.synchronize()

    bench.row_shape = {"tokens": tokens, "hidden": hidden}
    if ops is not None:
        bench.row_shape["decode"] = True
    error = bench.agreed_error(bench.attempt(make_inputs))
    if error is not None:
        return [bench.error_row(nbytes, c, c.error or f"inputs: {error}") for c in bench.contenders]
    rows = bench.time_contenders(
        nbytes, tokens, bench.contenders, state["pristine"], state.get("reference"),
        fixed_ops=ops,
        check=lambda c, p, r: check_epilogue(bench, c, p, r),
        note=mismatch_note,
    )
    for row, contender in zip(rows, bench.contenders, strict=True):
        row["mismatched"] = getattr(contender, "mismatched", None) if ops is None else None
        row["bus_gbps"] = None
        if ops is not None and row["median_us"] is not None:
            for key in ("median_us", "min_us", "max_us"):
                row[key] *= ops
    return rows


def check_epilogue(bench, contender, pristine, reference):
    """Differing elements of (normed, residual_out) of one captured call, on this rank."""
    torch = bench.torch
    contender.reset(pristine)
    bench.barrier()
    contender.single.replay()
    torch.cuda.synchronize()
    got = [value & 0xFFFF for value in contender.result().view(torch.int16).tolist()]
    normed, residual_out = reference
    half = len(normed)
    return [differing(got[:half], normed), differing(got[half:], residual_out)]
