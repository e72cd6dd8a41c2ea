"""Whole models through the real runtime."""

from __future__ import annotations

import pytest
import torch

from openvino_backend.tools.examples import EXAMPLES
from tests.harness import execute_layer_test, non_delegated_ops


@pytest.mark.parametrize("name", EXAMPLES.keys())
def test_builtin_example_lowers_runs_and_matches(name: str) -> None:
    example = EXAMPLES[name]
    inputs = example.inputs(torch.Generator().manual_seed(0))
    # Tolerance: bf16 unit roundoff (2**-8) x 4 roundings per op x sqrt(terms)
    # x the output's magnitude, where terms is the number of matmuls in
    # sequence (errors of independent roundings add as a random walk). A stale
    # output is off by the size of the values themselves, far above that.
    program = execute_layer_test(example.build(), inputs, terms=example.terms)
    # Every copy of an input that the model returns is made by ExecuTorch.
    assert all("clone" in op for op in non_delegated_ops(program))
