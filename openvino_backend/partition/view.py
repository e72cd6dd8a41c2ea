"""A proposed partition as the rules see it, and what they say about its nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch.export import ExportedProgram

from openvino_backend.graph import owned_constants
from openvino_backend.ops import is_copy

# What a rule says about one node: keep it out, and why.
Objection = tuple[torch.fx.Node, str]
Rule = Callable[["PartitionView"], Iterable[Objection]]


@dataclass(frozen=True)
class Rejection:
    """A node kept out of OpenVINO: which node, the rule that kept it out, and why."""

    node: torch.fx.Node
    rule: str
    reason: str


def rule_name(rule: Callable[..., object]) -> str:
    """How reports name ``rule``: its function name, or its class's for a rule object."""
    return getattr(rule, "__name__", None) or type(rule).__name__


@dataclass(frozen=True)
class PartitionView:
    """One proposed partition inside its program, with edge queries."""

    nodes: frozenset[torch.fx.Node]
    program: ExportedProgram
    # What the rules compute about this partition and may share (its conversion), for one round.
    memo: dict[str, object] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def leaves(self, node: torch.fx.Node) -> bool:
        """True when ``node``'s result is used outside the partition."""
        return any(user not in self.nodes for user in node.users)

    @cached_property
    def _owned_constants(self) -> frozenset[torch.fx.Node]:
        return frozenset(owned_constants(self.program, self.nodes))

    def inputs(self) -> Iterator[torch.fx.Node]:
        """Nodes outside the partition whose results it reads at run time."""
        seen: set[torch.fx.Node] = set()
        for node in self.ordered():
            for source in node.all_input_nodes:
                if source not in self.nodes and source not in seen and source not in self._owned_constants:
                    seen.add(source)
                    yield source

    def outputs(self) -> Iterator[torch.fx.Node]:
        return (node for node in self.ordered() if self.leaves(node))

    def ordered(self) -> list[torch.fx.Node]:
        """The partition's nodes in graph (topological) order."""
        return [node for node in self.program.graph.nodes if node in self.nodes]

    def copy_root(self, node: torch.fx.Node) -> torch.fx.Node:
        """The tensor ``node`` is a copy of, following copy chains inside the partition."""
        while is_copy(node) and node in self.nodes:
            node = node.args[0]
        return node
