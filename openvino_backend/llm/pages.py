"""A memory-mapped checkpoint read once, weight by weight, at the cost of the weights being read:
its pages released as the read goes (resident pages of a mapping count as the process's memory)."""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import torch

MADV_DONTNEED = 4


def file_mappings(tensors: Iterable[torch.Tensor]) -> list[tuple[int, int]]:
    """The address ranges of the file mappings (a memory-mapped checkpoint) ``tensors`` live in."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split()
        if len(fields) > 5 and fields[5].startswith("/"):
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    pointers = {t.untyped_storage().data_ptr() for t in tensors}
    return [(a, b) for a, b in ranges if any(a <= p < b for p in pointers)]


def release_pages(ranges: Sequence[tuple[int, int]]) -> None:
    """Drop this process's resident pages of file mappings: the file keeps the data, and a later read
    faults it in again (the kernel's page cache usually still has it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    for start, end in ranges:
        libc.madvise(start, end - start, MADV_DONTNEED)


@contextlib.contextmanager
def releasing_pages(tensors: Iterable[torch.Tensor], every: float = 0.25) -> Iterator[None]:
    """While the block runs, the pages of the file mappings ``tensors`` live in are released every
    ``every`` seconds: a checkpoint read once, weight by weight, costs what the weights being read
    cost, not the whole file (resident pages of a mapping count as the process's memory)."""
    ranges = file_mappings(tensors) if sys.platform == "linux" else []
    if not ranges:
        yield
        return
    done = threading.Event()

    def release() -> None:
        while not done.wait(every):
            release_pages(ranges)

    worker = threading.Thread(target=release, name="release-checkpoint-pages", daemon=True)
    worker.start()
    try:
        yield
    finally:
        done.set()
        worker.join()
        release_pages(ranges)
