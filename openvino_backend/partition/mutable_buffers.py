"""Mutable buffers (an LLM's KV cache) handed to the partition that reads and updates them.

Left to ExecuTorch, a buffer the program updates is a delegate input, its new
value a delegate output, and a CPU ``copy_`` writes it back after every call:
the whole cache crosses the edge twice per token. Handed to the delegate, it
becomes OpenVINO state and stays put (``lowering/state.py``).

Only where that is exact: every node reading the buffer and the node
computing its new value sit in one partition, so nothing outside could read a
value the delegate no longer writes back; and its dtype is one a variable can
start from.
"""

from __future__ import annotations

import logging

import torch
from torch.export import ExportedProgram

from openvino_backend.lowering.state import STATE_DTYPES

logger = logging.getLogger(__name__)


def take_over_mutable_buffers(program: ExportedProgram) -> tuple[str, ...]:
    """Tag each mutated buffer that can live in its partition with that partition's tag; their names.

    Run after the partitions (and their constants) are tagged: ExecuTorch then
    lowers the buffer into the delegate that owns it.
    """
    signature = program.graph_signature
    new_value_of = {target: name for name, target in signature.buffers_to_mutate.items()}
    by_name = {node.name: node for node in program.graph.nodes}
    taken = []
    for placeholder in program.graph.find_nodes(op="placeholder"):
        target = signature.inputs_to_buffers.get(placeholder.name)
        if target not in new_value_of:
            continue
        producer = by_name.get(new_value_of[target])
        tag = producer.meta.get("delegation_tag") if producer is not None else None
        val = placeholder.meta.get("val")
        if tag is None or not isinstance(val, torch.Tensor) or val.dtype not in STATE_DTYPES:
            continue
        if not placeholder.users or any(user.meta.get("delegation_tag") != tag for user in placeholder.users):
            logger.info("buffer %s stays with ExecuTorch: it is read outside the partition that updates it", target)
            continue
        placeholder.meta["delegation_tag"] = tag
        taken.append(target)
    return tuple(taken)
