"""Mutable buffers (an LLM's KV cache) handed to the partition that reads and updates them.

Left to ExecuTorch, a buffer the program updates is a delegate input, its new
value a delegate output, and a CPU ``copy_`` writes it back after every call:
the whole cache crosses the edge twice per token. Handed to the delegate, it
becomes OpenVINO state and stays put (``lowering/state.py``).

Only where that is exact: every node reading the buffer and the node
computing its new value sit in one partition, so nothing outside could read a
value the delegate no longer writes back; and its dtype is one a variable can
start from. Held so, the buffer never crosses the partition's edge: the
rules about tensors the runtime binds there (``partition/edge_rules.py``)
do not judge it (``PartitionView.bound_inputs``), so a 0-d buffer, which the
runtime cannot bind, takes the ops reading it into OpenVINO with it.
"""

from __future__ import annotations

import logging
from collections.abc import Collection

import torch
from torch.export import ExportedProgram

from openvino_backend.lowering.state import STATE_DTYPES

logger = logging.getLogger(__name__)


def held_buffers(program: ExportedProgram, nodes: Collection[torch.fx.Node]) -> dict[torch.fx.Node, torch.fx.Node]:
    """The buffers ``program`` updates that a partition of ``nodes`` would hold as OpenVINO state:
    by placeholder, the node computing its new value. Every reader of the buffer and that node are
    in ``nodes``, and its dtype is one a variable can start from."""
    signature = program.graph_signature
    new_value_of = {target: name for name, target in signature.buffers_to_mutate.items()}
    by_name = {node.name: node for node in program.graph.nodes}
    held = {}
    for placeholder in program.graph.find_nodes(op="placeholder"):
        target = signature.inputs_to_buffers.get(placeholder.name)
        producer = by_name.get(new_value_of[target]) if target in new_value_of else None
        val = placeholder.meta.get("val")
        if producer not in nodes or not isinstance(val, torch.Tensor) or val.dtype not in STATE_DTYPES:
            continue
        if placeholder.users and all(user in nodes for user in placeholder.users):
            held[placeholder] = producer
    return held


def take_over_mutable_buffers(program: ExportedProgram) -> tuple[str, ...]:
    """Tag each mutated buffer that can live in its partition with that partition's tag; their names.

    Run after the partitions (and their constants) are tagged: ExecuTorch then
    lowers the buffer into the delegate that owns it.
    """
    partitions: dict[str, set[torch.fx.Node]] = {}
    for node in program.graph.nodes:
        if (tag := node.meta.get("delegation_tag")) is not None and node.op != "placeholder":
            partitions.setdefault(tag, set()).add(node)
    taken = []
    for tag, nodes in partitions.items():
        for placeholder in held_buffers(program, nodes):
            placeholder.meta["delegation_tag"] = tag
            taken.append(program.graph_signature.inputs_to_buffers[placeholder.name])
    delegated = {node.name for nodes in partitions.values() for node in nodes}
    for new_value, target in program.graph_signature.buffers_to_mutate.items():
        if target not in taken and new_value in delegated:
            logger.info("buffer %s stays with ExecuTorch: it is read outside the partition that updates it", target)
    return tuple(taken)
