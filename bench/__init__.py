"""Benchmarks (``python -m bench``): what this backend costs and gains against the alternatives."""

import os

# ExecuTorch's Python binding copies outputs with PyTorch, whose OpenMP workers then spin on the cores
# OpenVINO's and XNNPACK's threads need (on two cores, +1 ms on a 1.6 ms call); a C++ runner has no
# such pool. Passive waiting measures what it would see. Set before PyTorch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
