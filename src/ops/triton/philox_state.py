"""Where a random kernel's Philox key and offset come from (docs/gpu.md#cuda-graphs).

Outside a CUDA graph capture the host passes LibTorch's generator state as values: seed, and the
offset as offset_lo, offset_hi (captured = 0). Inside a capture those values would be frozen into
the graph, and every replay would draw the same numbers; LibTorch's own kernels then read the seed
and a base offset from device memory that the generator updates before each replay, and add an
offset of their own within the graph (at::cuda::philox::unpack). So does philox_key: with
captured = 1 it loads the seed at seed_ptr and the base offset at offset_ptr, and adds
offset_hi:offset_lo (the offset within the graph). Outside a capture the pointers are never read.
"""

import triton
import triton.language as tl


@triton.jit
def philox_key(seed, offset_lo, offset_hi, seed_ptr, offset_ptr, captured):
    """(key, offset_lo, offset_hi) for tl.philox, as described above."""
    on_device = captured != 0
    device_seed = tl.load(seed_ptr, mask=on_device, other=0).to(tl.uint64)
    base = tl.load(offset_ptr, mask=on_device, other=0).to(tl.uint64)
    key = tl.where(on_device, device_seed, seed.to(tl.uint64))
    offset = base + ((offset_hi.to(tl.uint64) << 32) | offset_lo.to(tl.uint64))
    return key, (offset & 0xFFFFFFFF).to(tl.uint32), (offset >> 32).to(tl.uint32)


def launch_args(seed, offset, device=None, captured=None):
    """The six arguments (seed, offset_lo, offset_hi, seed_ptr, offset_ptr, captured) for a
    launch from Python: host values, or with captured = (seed tensor, offset tensor, offset
    within the graph) the device's, as src/ops/triton_launch.cpp passes them."""
    import torch
    if captured is None:
        unused = torch.zeros(1, dtype=torch.int64, device=device)
        return (seed, offset & 0xFFFFFFFF, offset >> 32, unused, unused, 0)
    seed_tensor, offset_tensor, intragraph = captured
    return (0, intragraph & 0xFFFFFFFF, intragraph >> 32, seed_tensor, offset_tensor, 1)
