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

    def drop_graphs(self):
        self.single = None
        self.graph = None
        self.ops = 0

    def close(self):
        self.drop_graphs()


class ViewContender(Contender):
    """A contender whose all-reduce works in place on `view`, the message's slice of `buffer`."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.buffer = None
        self.view = None

    def bind(self, elements):
        self.view = self.buffer[:elements]

    def reset(self, pristine):
        self.view.copy_(pristine)

    def result(self):
        return self.view

    def close(self):
        super().close()
        self.view = None
        self.buffer = None


class TorchNccl(ViewContender):
    name = "torch_nccl"

    def allocate(self, max_elements):
        torch = self.ctx.torch
        self.buffer = torch.empty(max_elements, dtype=torch.bfloat16, device=self.ctx.device)

    def op(self):
        self.ctx.dist.all_reduce(self.view)


class SymmMemBase(Contender):
    def _symm_empty(self, elements):
        torch = self.ctx.torch
        return self.ctx.symm_mem.empty(elements, dtype=torch.bfloat16, device=self.ctx.device)

    def _rendezvous(self, tensor):
        return self.ctx.symm_mem.rendezvous(tensor, self.ctx.group_name)


class SymmMemOneShot(SymmMemBase, ViewContender):
    """Reads `view` in symmetric memory, writes the sum to `output_view` in ordinary memory."""

    name = "symm_mem_one_shot"

    def allocate(self, max_elements):
        torch = self.ctx.torch
        self.buffer = self._symm_empty(max_elements)
        self.out = torch.empty(max_elements, dtype=torch.bfloat16, device=self.ctx.device)
        self.handle = None
        self.output_view = None

    def rendezvous(self):
        self.handle = self._rendezvous(self.buffer)

    def bind(self, elements):
        super().bind(elements)
        self.output_view = self.out[:elements]

    def op(self):
        self.ctx.torch.ops.symm_mem.one_shot_all_reduce_out(
            self.view, "sum", self.ctx.group_name, self.output_view
        )

    def result(self):
        return self.output_view

    def close(self):
        super().close()
        self.output_view = None
        self.handle = None
        self.out = None


class SymmMemTwoShot(SymmMemBase, ViewContender):
    name = "symm_mem_two_shot"

    def allocate(self, max_elements):
        self.buffer = self._symm_empty(max_elements)
        self.handle = None

    def rendezvous(self):
        self.handle = self._rendezvous(self.buffer)

    def op(self):
        self.ctx.torch.ops.symm_mem.two_shot_all_reduce_(self.view, "sum", self.ctx.group_name)

    def close(self):
        super().close()
        self.handle = None


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
        torch = self.ctx.torch
        self.collectives()
        self.buffer = torch.empty(max_elements, dtype=torch.bfloat16, device=self.ctx.device)
