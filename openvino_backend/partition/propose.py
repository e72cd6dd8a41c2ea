"""Propose partitions, let the rules object, propose again: until no rule objects.

Nodes go to OpenVINO when OpenVINO converts their op (``partition/support.py``). The
partitions proposed from that are checked by stages of rules, cheapest
first: the partition-edge rules on the FX graph (``edge_rules.py``), then
converting each partition (``conversion.py``), then running it
(``numerical.py``). A node a rule objects to is refused with a ``Rejection``
naming the rule, and the partitions it touched are proposed again.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch.export import ExportedProgram
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition

from openvino_backend.graph import is_getitem, op_name
from openvino_backend.partition.support import OpenvinoOperatorSupport
from openvino_backend.partition.view import PartitionView, Rejection, Rule, rule_name

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Proposal:
    """Partitions every rule accepts, one view each, and every node refused with its rejection."""

    partitions: list[Partition]
    views: list[PartitionView]
    rejected: dict[torch.fx.Node, Rejection]

    @property
    def delegated(self) -> set[torch.fx.Node]:
        return {node for partition in self.partitions for node in partition.nodes}


def propose(
    program: ExportedProgram,
    stages: Sequence[Sequence[Rule]],
    op_types_to_skip: Collection[str] = (),
    op_names_to_skip: Collection[str] = (),
    holds_state: bool = True,
) -> Proposal:
    """Partitions that satisfy every rule of every stage. Tags nothing. ``holds_state``: the
    partitions will hold the buffers they read and update as OpenVINO state."""
    excluded = feeding_only_checks(program.graph)
    refused: dict[torch.fx.Node, Rejection] = {}  # by the op-support check, over all rounds
    kept: list[tuple[Partition, PartitionView]] = []  # partitions no rule touched last round
    candidates: frozenset[torch.fx.Node] | None = None  # what this round may partition (None: all)
    while True:
        support = OpenvinoOperatorSupport(op_types_to_skip, op_names_to_skip, excluded, candidates)
        # torch's proposal is quadratic on long chains: after the first round it runs again only
        # over the partitions a rule cut, the others are kept as they are.
        fresh = CapabilityBasedPartitioner(
            program.graph_module, support, allows_single_node_partition=True
        ).propose_partitions()
        refused.update(support.rejected)
        # One view per partition: the checks that convert share the conversion, across rounds too.
        proposal = kept + [
            (p, PartitionView(frozenset(p.nodes), program, holds_state=holds_state)) for p in fresh if _has_compute(p)
        ]
        views = [view for _, view in proposal]
        rejected: dict[torch.fx.Node, Rejection] = {}
        for rules in stages:
            rejected = _apply(rules, views, excluded)
            if rejected:
                break
        if not rejected:
            return Proposal([partition for partition, _ in proposal], views, refused)
        for node, rejection in rejected.items():
            logger.info(
                "keeping %s (%s) out of OpenVINO [%s]: %s", node.name, op_name(node), rejection.rule, rejection.reason
            )
        excluded.update(rejected)
        cut = {v for _, v in proposal if not rejected.keys().isdisjoint(v.nodes)}
        kept = [(p, v) for p, v in proposal if v not in cut]
        candidates = frozenset(node for view in cut for node in view.nodes)


def _apply(
    rules: Sequence[Rule], views: list[PartitionView], excluded: dict[torch.fx.Node, Rejection]
) -> dict[torch.fx.Node, Rejection]:
    rejected: dict[torch.fx.Node, Rejection] = {}
    for view in views:
        for rule in rules:
            for node, reason in rule(view):
                # torch's partitioner puts a getitem in its producer's partition whatever
                # the support check says, so refusing the getitem alone would change nothing.
                target = node.args[0] if is_getitem(node) else node
                if target not in excluded:
                    rejected.setdefault(target, Rejection(target, rule_name(rule), reason))
    return rejected


def feeding_only_checks(graph: torch.fx.Graph) -> dict[torch.fx.Node, Rejection]:
    """Nodes whose results reach no output, only run-time checks (``_assert_async`` and the like).

    Delegated, they would leave a partition whose only reader is a node with
    no users, which ExecuTorch's partition fusing can move past the output
    node (an invalid program: "last node must be output").
    """
    reaches_output: set[torch.fx.Node] = set()
    for node in reversed(graph.nodes):
        if node.op == "output" or any(user in reaches_output for user in node.users):
            reaches_output.add(node)
    why = "its result only feeds a run-time check, which ExecuTorch runs on the CPU"
    return {
        node: Rejection(node, "feeds_only_a_check", why)
        for node in graph.nodes
        if node.op == "call_function" and node not in reaches_output
    }


def _has_compute(partition: Partition) -> bool:
    # A partition of getitems alone would be an empty delegate.
    return any(node.op == "call_function" and not is_getitem(node) for node in partition.nodes)
