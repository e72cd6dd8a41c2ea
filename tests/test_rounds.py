"""Proposal rounds: after the first, only the partitions a rule cut are proposed again."""

from __future__ import annotations

import pytest
import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

import openvino_backend.partition.propose as propose_module
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.partition.support import OpenvinoOperatorSupport
from tests.harness import execute_layer_test


class Segments(torch.nn.Module):
    """Three partitions split by ``cos`` (skipped: on the CPU); the last starts with a copy of its
    input that leaves it, which the copy rule cuts out in the second round."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        a = torch.sin(x * 2).cos()
        b = (a + 1).tanh().cos()
        c = b.clone()
        return (c * 3).exp(), c


def test_a_second_round_proposes_only_the_cut_partition(monkeypatch: pytest.MonkeyPatch) -> None:
    proposals: list[frozenset | None] = []  # what each proposal round may partition

    class Recording(CapabilityBasedPartitioner):
        def __init__(self, graph_module, support: OpenvinoOperatorSupport, **kwargs) -> None:
            super().__init__(graph_module, support, **kwargs)
            proposals.append(support._candidates)

    monkeypatch.setattr(propose_module, "CapabilityBasedPartitioner", Recording)
    partitioner = OpenvinoPartitioner(op_types_to_skip={"aten.cos.default"})
    program = execute_layer_test(Segments(), (torch.randn(3, 4),), expected_partitions=3, partitioner=partitioner)
    assert program is not None
    assert proposals[0] is None  # the first round proposes over the whole graph
    assert len(proposals) == 2
    # The second, over the last partition alone: the copy and what reads it.
    names = sorted(node.name for node in proposals[1])
    assert any("clone" in name for name in names), names
    assert not any("sin" in name or "tanh" in name for name in names), names
    assert any("clone" in kept.node.op for kept in partitioner.report.kept_out), partitioner.report.kept_out
