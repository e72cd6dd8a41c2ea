"""A proposed partition as the rules see it, and what they say about its nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import OutputKind

from openvino_backend.graph import owned_constants
from openvino_backend.ops import is_copy
from openvino_backend.partition.mutable_buffers import held_buffers

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
    # Whether the partition will hold the buffers it reads and updates as OpenVINO state
    # (``OpenvinoPartitioner(take_over_mutable_buffers=...)``): then they never cross its edge.
    holds_state: bool = True

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

    @cached_property
    def held_state(self) -> dict[torch.fx.Node, torch.fx.Node]:
        """The buffers this partition will hold as OpenVINO state: by placeholder, the node computing
        the buffer's new value (``partition/mutable_buffers.py``)."""
        return held_buffers(self.program, self.nodes) if self.holds_state else {}

    def bound_inputs(self) -> Iterator[torch.fx.Node]:
        """The inputs the runtime binds at each call: ``inputs()`` but the buffers held as state."""
        return (source for source in self.inputs() if source not in self.held_state)

    def bound_outputs(self) -> Iterator[torch.fx.Node]:
        """The outputs the runtime binds at each call: ``outputs()`` but those read outside the
        partition only as the new value of a buffer held as state."""
        return (node for node in self.outputs() if self._bound_outside(node))

    def _bound_outside(self, node: torch.fx.Node) -> bool:
        outside = [user for user in node.users if user not in self.nodes]
        if any(user.op != "output" for user in outside) or node not in self.held_state.values():
            return bool(outside)
        # Read by the program's output only: bound unless every place it takes there is the
        # mutation of a buffer this partition holds.
        held = {
            self.program.graph_signature.inputs_to_buffers[placeholder.name]
            for placeholder, new_value in self.held_state.items()
            if new_value is node
        }
        output = self.program.graph.output_node()
        specs = self.program.graph_signature.output_specs
        return any(
            value is node and not (spec.kind == OutputKind.BUFFER_MUTATION and spec.target in held)
            for value, spec in zip(output.args[0], specs, strict=True)
        )

    def ordered(self) -> list[torch.fx.Node]:
        """The partition's nodes in graph (topological) order."""
        return [node for node in self.program.graph.nodes if node in self.nodes]

    def copy_root(self, node: torch.fx.Node) -> torch.fx.Node:
        """The tensor ``node`` is a copy of, following copy chains inside the partition."""
        while is_copy(node) and node in self.nodes:
            node = node.args[0]
        return node
