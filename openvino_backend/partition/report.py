"""What a ``partition`` call decided, for users (``WhyNoPartitionReporter``) and tools."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from executorch.exir.backend.utils import WhyNoPartitionReporter
from torch.export import ExportedProgram

from openvino_backend.diagnostics import NodeRef
from openvino_backend.graph import is_getitem
from openvino_backend.ops import is_bound_pad
from openvino_backend.partition.propose import Proposal
from openvino_backend.transform.dynamic import restores_size


class KeptOut(NamedTuple):
    """A node of the model left on the CPU: where it is, the rule that kept it out, and why."""

    node: NodeRef
    rule: str
    reason: str


@dataclass(frozen=True)
class PartitionReport:
    """What the last ``partition`` call decided."""

    partitions: int = 0
    delegated_nodes: int = 0
    kept_out: tuple[KeptOut, ...] = ()
    # Ops computing tensors in the program (getitems and size arithmetic aside).
    total_nodes: int = 0
    # The precision f32 partitions were checked in: the target's (compile spec), or this machine's.
    precision: str = "f32"
    # Buffers the program updates that live in OpenVINO as state (``take_over_mutable_buffers``).
    state_buffers: tuple[str, ...] = ()

    @property
    def delegated_share(self) -> float:
        return self.delegated_nodes / self.total_nodes if self.total_nodes else 0.0


def report(
    program: ExportedProgram, proposal: Proposal, precision: str
) -> tuple[WhyNoPartitionReporter, PartitionReport]:
    """ExecuTorch's reporter (every refused node, "<rule>: <reason>") and the summary."""
    reporter = WhyNoPartitionReporter()
    for node, rejection in proposal.rejected.items():
        reporter.report_reject(node, f"{rejection.rule}: {rejection.reason}")
    summary = PartitionReport(
        partitions=len(proposal.partitions),
        delegated_nodes=sum(1 for p in proposal.partitions for n in p.nodes if computes(n)),
        kept_out=tuple(
            KeptOut(NodeRef.from_node(node), rejection.rule, rejection.reason)
            for node, rejection in proposal.rejected.items()
            if computes(node)
        ),
        total_nodes=sum(1 for n in program.graph.nodes if computes(n)),
        precision=precision,
    )
    return reporter, summary


def computes(node: torch.fx.Node) -> bool:
    """An op of the model that computes tensors (not a getitem, size arithmetic, or the pads and
    slices ``transform/dynamic.py`` adds)."""
    val = node.meta.get("val")
    return (
        node.op == "call_function"
        and isinstance(val, (torch.Tensor, tuple, list))
        and not (is_getitem(node) or is_bound_pad(node) or restores_size(node))
    )
