"""Shared by the GPU scripts: torchrun set-up, qualification-like random bf16 data, the
reference sum, bit comparison and the graph-replay timer."""

import os

os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")

import datetime  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402


def init():
    """Process group (NCCL) and this rank's GPU from torchrun's variables."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", device_id=torch.device("cuda", local_rank),
                            timeout=datetime.timedelta(seconds=300))
    return dist.get_rank(), dist.get_world_size(), torch.device("cuda", local_rank)


def random_bf16(elements, seed, device):
    """Random bf16 like the qualification's data (src/reference.rs random_value): mostly
    magnitudes 2^-15..2^16, with zeros of both signs, subnormals, the smallest normals,
    magnitudes near the largest bf16 (sums overflow), infinities and NaN."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    draw = torch.randint(0, 1 << 62, (elements,), generator=generator, device=device,
                         dtype=torch.int64)
    sign = ((draw >> 8) & 1) * 0x8000
    mantissa = (draw >> 16) & 0x7F
    exponent = (draw >> 24) & 0xFFFF
    kind = draw & 0xFF
    ordinary = ((112 + exponent % 31) << 7) | mantissa
    magnitude = torch.where(kind >= 50, ordinary, ((0xF0 + exponent % 15) << 7) | mantissa)
    magnitude = torch.where(kind <= 33, ((1 + exponent % 8) << 7) | mantissa, magnitude)
    magnitude = torch.where(kind <= 25, torch.clamp(mantissa, min=1), magnitude)
    magnitude = torch.where(kind <= 9, torch.zeros_like(magnitude), magnitude)
    magnitude = torch.where(kind == 1, torch.full_like(magnitude, 0x7F80), magnitude)
    magnitude = torch.where(kind == 0, 0x7F80 | torch.clamp(mantissa, min=1), magnitude)
    bits = (sign | magnitude).to(torch.int32)
    # Two's complement int16 holding the bit pattern.
    bits = torch.where(bits >= 0x8000, bits - 0x10000, bits).to(torch.int16)
    return bits.view(torch.bfloat16)


def reference_sum(tensor, group=None):
    """Every rank's `tensor` summed in fp32 in rank order, starting from rank 0's value, then
    rounded once to bf16 (to nearest even)."""
    world = dist.get_world_size(group)
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(gathered, tensor.contiguous(), group=group)
    accumulator = gathered[0].float()
    for other in gathered[1:]:
        accumulator = accumulator + other.float()
    return accumulator.to(torch.bfloat16)


def first_difference(got, expected):
    """Index of the first element whose bits differ (NaN matches any NaN: the kernels write
    the canonical 0x7FFF, torch its own), or None when all match."""
    same = (got.view(torch.int16) == expected.view(torch.int16)) | (
        torch.isnan(got) & torch.isnan(expected))
    if bool(same.all()):
        return None
    return int((~same).nonzero()[0].item())


def any_rank(flag, device):
    """True on every rank when `flag` is true on any."""
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())
