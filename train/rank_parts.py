"""Each rank's own part of a checkpoint (its random generators, its comm hook's residuals),
sent to the keeper in one collective a save.

torch's gather_object pickles every part (each tensor through a torch.save of its own),
all-gathers the sizes, then gathers the bytes padded to the largest: two collectives a save,
~3 ms of the keeper's 12 ms on the lab (benchmarks/recovery.py). Here a part is a pickle of
everything but its tensors, which follow as raw bytes; the ranks agree once, at the first save,
on a capacity every part then fitted in, and each save is one gather of that many bytes behind
a length. A part that outgrows it (PowerSGD's residuals once compression starts) sends the
rest to the keeper point to point: its rank knows it from its own length, the keeper from the
length in the header, so no one needs another collective to agree on it. The keeper unpacks
the parts in the writer thread, off the step's path.
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

_LENGTH = struct.Struct("<Q")


class Packed(bytes):
    """A rank's part as it arrived: `unpack` makes it objects again."""


class _Pickler(pickle.Pickler):
    def __init__(self, file, tensors: list[torch.Tensor]):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            self.tensors.append(obj)
            return (str(obj.dtype).removeprefix("torch."), tuple(obj.shape))
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, data: memoryview):
        super().__init__(file)
        self.data, self.offset = data, 0

    def persistent_load(self, pid):
        dtype_name, shape = pid
        out = torch.empty(shape, dtype=getattr(torch, dtype_name))
        size = out.numel() * out.element_size()
        out.reshape(-1).view(torch.uint8).numpy()[:] = np.frombuffer(
            self.data[self.offset:self.offset + size], dtype=np.uint8)
        self.offset += size
        return out


def pack(part: Any) -> bytes:
    """The pickle's length, the pickle of `part` with its tensors left out, then each tensor's
    bytes (on CPU, contiguous) in the order the pickle names them."""
    head, tensors = io.BytesIO(), []
    _Pickler(head, tensors).dump(part)
    pickled = head.getvalue()
    return b"".join([_LENGTH.pack(len(pickled)), pickled, *(
        t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        for t in tensors)])


def unpack(blob: bytes) -> Any:
    (length,) = _LENGTH.unpack_from(blob)
    view = memoryview(blob)
    start = _LENGTH.size
    return _Unpickler(io.BytesIO(view[start:start + length]), view[start + length:]).load()


class PartGather:
    """Gathers every rank's part on the keeper; every rank calls `gather` at the same save."""

    def __init__(self, keeper: int, rank: int, world: int, device: torch.device):
        self.keeper, self.rank, self.world, self.device = keeper, rank, world, device
        self.capacity: int | None = None   # bytes of a part in the gather, agreed at the first

    def gather(self, part: Any) -> list[Any] | None:
        """On the keeper: every rank's part, its own as given and the others `Packed`; None
        on the other ranks."""
        if self.world == 1:
            return [part]
        mine = b"" if self.rank == self.keeper else pack(part)   # the keeper keeps its own
        if self.capacity is None:
            longest = torch.tensor([len(mine)], dtype=torch.int64, device=self.device)
            dist.all_reduce(longest, op=dist.ReduceOp.MAX)
            # Headroom: a pickle's length moves a little between saves (ints, floats).
            self.capacity = int(longest.item()) + max(4096, int(longest.item()) // 4)
        slot = _LENGTH.size + self.capacity
        inline = _LENGTH.pack(len(mine)) + mine[:self.capacity]
        send = np.zeros(slot, dtype=np.uint8)
        send[:len(inline)] = np.frombuffer(inline, dtype=np.uint8)
        send = torch.from_numpy(send).to(self.device)
        slots = [torch.empty(slot, dtype=torch.uint8, device=self.device)
                 for _ in range(self.world)] if self.rank == self.keeper else None
        dist.gather(send, slots, dst=self.keeper)
        if self.rank != self.keeper:
            if len(mine) > self.capacity:
                rest = np.frombuffer(mine, dtype=np.uint8, offset=self.capacity).copy()
                dist.send(torch.from_numpy(rest).to(self.device), dst=self.keeper)
            return None
        parts: list[Any] = []
        for source, got in enumerate(slots):
            if source == self.keeper:
                parts.append(part)
                continue
            raw = got.cpu().numpy().tobytes()
            (length,) = _LENGTH.unpack_from(raw)
            blob = raw[_LENGTH.size:_LENGTH.size + min(length, self.capacity)]
            if length > self.capacity:
                rest = torch.empty(length - self.capacity, dtype=torch.uint8, device=self.device)
                dist.recv(rest, src=source)
                blob += rest.cpu().numpy().tobytes()
            parts.append(Packed(blob))
        return parts
