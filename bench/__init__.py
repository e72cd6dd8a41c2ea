"""Benchmarks (``python -m bench``): what this backend costs and gains against the alternatives."""

import os

# ExecuTorch's Python binding copies a program's outputs with PyTorch, whose OpenMP workers then
# spin, waiting for more work, on the cores OpenVINO's and XNNPACK's own threads need next: on two
# cores that added a millisecond to a 1.6 ms call. A C++ runner has no such pool; passive waiting
# measures what it would see. Set before PyTorch loads (this package's import comes first).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
