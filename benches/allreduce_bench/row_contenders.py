"""The reduce-scatter and all-gather paths the bench times (no torch at import): PyTorch's
`reduce_scatter_tensor` / `all_gather_into_tensor` and prepare's `Collectives.reduce_scatter` /
`.all_gather`, each out of place from `input` into `output`, rows x width by the shape rule."""

from .contenders import Contender
from .rules import owned_rows


class RowContender(Contender):
    """A row collective from `input` (the whole message for a reduce-scatter, this rank's rows
    for an all-gather) into `output`; `bind` takes the shape."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.collective = ctx.args.collective
        self.buffer = None
        self.out = None
        self.input = None
        self.output = None
        self.rows = 0

    def allocate(self, max_elements):
        self.buffer = self._empty(max_elements)
        self.out = self._empty(max_elements)

    def shapes(self, rows, width):
        """(input shape, output shape) of this rank's part."""
        owned = len(owned_rows(rows, self.ctx.world, self.ctx.rank))
        if self.collective == "reduce_scatter":
            return (rows, width), (owned, width)
        return (owned, width), (rows, width)

    def bind_input(self, shape):
        count = shape[0] * shape[1]
        return self.buffer[:count].view(shape)

    def bind(self, shape):
        rows, width = shape
        self.rows = rows
        input_shape, output_shape = self.shapes(rows, width)
        self.input = self.bind_input(input_shape)
        self.output = self.out[: output_shape[0] * output_shape[1]].view(output_shape)

    def reset(self, pristine):
        self.input.copy_(pristine.view(self.input.shape))

    def result(self):
        return self.output.reshape(-1)

    def close(self):
        super().close()
        self.buffer = self.out = self.input = self.output = None


class TorchRows(RowContender):
    """torch.distributed's reduce_scatter_tensor / all_gather_into_tensor (NCCL), which need
    the rows to divide among the ranks."""

    name = "torch_nccl"

    def bind(self, shape):
        if shape[0] % self.ctx.world:
            raise ValueError(
                f"{shape[0]} rows do not divide among {self.ctx.world} ranks, which "
                f"torch's {self.collective} needs"
            )
        super().bind(shape)

    def op(self):
        dist = self.ctx.dist
        if self.collective == "reduce_scatter":
            dist.reduce_scatter_tensor(self.output, self.input)
        else:
            dist.all_gather_into_tensor(self.output, self.input)


class PrepareRows(RowContender):
    def collectives(self):
        return self.ctx.prepare_collectives()

    def allocate(self, max_elements):
        self.collectives()
        super().allocate(max_elements)

    def op(self):
        collectives = self.collectives()
        if self.collective == "reduce_scatter":
            collectives.reduce_scatter(self.input, out=self.output)
        else:
            collectives.all_gather(self.input, out=self.output)


class PrepareRowsZeroCopy(PrepareRows):
    """The input in the collective's zero-copy region (`Collectives.empty`): the
    reduce-scatter's whole message, the all-gather's rows."""

    name = "prepare_zero_copy"

    def bind_input(self, shape):
        collectives = self.collectives()
        capacity = collectives.zero_copy_bytes(collective=self.collective)
        nbytes = shape[0] * shape[1] * 2
        if capacity and nbytes > capacity:
            raise ValueError(
                f"{nbytes} bytes do not fit the {self.collective} zero-copy region "
                f"({capacity} bytes)"
            )
        return collectives.empty(shape, collective=self.collective)


class PrepareRowsAnyTensor(PrepareRows):
    name = "prepare_any_tensor"


ROW_CONTENDER_TYPES = {
    "torch_nccl": TorchRows,
    "prepare_zero_copy": PrepareRowsZeroCopy,
    "prepare_any_tensor": PrepareRowsAnyTensor,
}
