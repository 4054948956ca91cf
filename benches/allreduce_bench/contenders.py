"""The all-reduce paths the bench times, each behind the same small interface (no torch at
import: every torch call goes through the run's context)."""


class Contender:
    """One all-reduce path. `allocate` is local; `rendezvous` is collective."""

    name = ""

    def __init__(self, ctx):
        self.ctx = ctx
        self.error = None
        self.single = None  # one-op graph of the current size
        self.graph = None  # K-op graph of the current size
        self.ops = 0

    def allocate(self, max_elements):
        raise NotImplementedError

    def rendezvous(self):
        pass

    def bind(self, elements):
        """Views for a message of `elements` bf16 values."""
        raise NotImplementedError

    def reset(self, pristine):
        """Copies the size's input into the buffer the op reads (on the current stream)."""
        raise NotImplementedError

    def op(self):
        """Enqueues one all-reduce on the current stream."""
        raise NotImplementedError

    def result(self):
        raise NotImplementedError

    def _empty(self, elements):
        """`elements` bf16 values in ordinary memory on this rank's GPU, not initialised."""
        torch = self.ctx.torch
        return torch.empty(elements, dtype=torch.bfloat16, device=self.ctx.device)

    def drop_graphs(self):
        self.single = None
        self.graph = None
        self.ops = 0

    def close(self):
        self.drop_graphs()


class ViewContender(Contender):
    """A contender whose all-reduce reads `view`, the message's slice of `buffer`, and writes the
    sum to `output_view`: `view` itself (in place), or the same slice of `out` when it has one."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.buffer = None
        self.out = None
        self.view = None
        self.output_view = None

    def bind(self, elements):
        self.view = self.buffer[:elements]
        self.output_view = self.view if self.out is None else self.out[:elements]

    def reset(self, pristine):
        self.view.copy_(pristine)

    def result(self):
        return self.output_view

    def close(self):
        super().close()
        self.view = None
        self.output_view = None
        self.buffer = None
        self.out = None


class TorchNccl(ViewContender):
    name = "torch_nccl"

    def allocate(self, max_elements):
        self.buffer = self._empty(max_elements)

    def op(self):
        self.ctx.dist.all_reduce(self.view)


class SymmMemBase(Contender):
    """A contender whose `buffer` is in symmetric memory, met by every rank in `rendezvous`."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.handle = None

    def _symm_empty(self, elements):
        torch = self.ctx.torch
        return self.ctx.symm_mem.empty(elements, dtype=torch.bfloat16, device=self.ctx.device)

    def rendezvous(self):
        self.handle = self.ctx.symm_mem.rendezvous(self.buffer, self.ctx.group_name)

    def close(self):
        super().close()
        self.handle = None


class SymmMemOneShot(SymmMemBase, ViewContender):
    """Reads `view` in symmetric memory, writes the sum to `output_view` in ordinary memory."""

    name = "symm_mem_one_shot"

    def allocate(self, max_elements):
        self.buffer = self._symm_empty(max_elements)
        self.out = self._empty(max_elements)

    def op(self):
        self.ctx.torch.ops.symm_mem.one_shot_all_reduce_out(
            self.view, "sum", self.ctx.group_name, self.output_view
        )


class SymmMemTwoShot(SymmMemBase, ViewContender):
    name = "symm_mem_two_shot"

    def allocate(self, max_elements):
        self.buffer = self._symm_empty(max_elements)

    def op(self):
        self.ctx.torch.ops.symm_mem.two_shot_all_reduce_(self.view, "sum", self.ctx.group_name)


class PrepareBase(ViewContender):
    """prepare's Python path: one `prepare.Collectives` shared by both prepare contenders."""

    def collectives(self):
        return self.ctx.prepare_collectives()

    def op(self):
        self.collectives().all_reduce(self.view)


class PrepareZeroCopy(PrepareBase):
    name = "prepare_zero_copy"

    def allocate(self, max_elements):
        collectives = self.collectives()
        capacity = collectives.zero_copy_bytes() // 2
        self.buffer = collectives.empty(min(max_elements, capacity) if capacity else max_elements)

    def bind(self, elements):
        if elements > self.buffer.numel():
            raise ValueError(
                f"{elements * 2} bytes do not fit the zero-copy region "
                f"({self.buffer.numel() * 2} bytes)"
            )
        super().bind(elements)


class PrepareAnyTensor(PrepareBase):
    name = "prepare_any_tensor"

    def allocate(self, max_elements):
        self.collectives()
        self.buffer = self._empty(max_elements)
