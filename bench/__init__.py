"""Benchmarks (``python -m bench``): what the safe backend costs in lowering and inference time."""

import os
from typing import TextIO

# ExecuTorch's Python binding copies a program's outputs with PyTorch, whose OpenMP workers then
# spin, waiting for more work, on the cores OpenVINO's and XNNPACK's own threads need next: on two
# cores that added a millisecond to a 1.6 ms call. A C++ runner has no such pool; passive waiting
# measures what it would see. Set before PyTorch loads (this package's import comes first).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def answer_stream() -> TextIO:
    """The process's stdout, kept for its answer (JSON lines). From here on everything the libraries
    print, from C or Python, goes to stderr."""
    import sys

    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return stream
