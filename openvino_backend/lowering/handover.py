"""The partitioner's conversions, handed to preprocess.

The partitioner's checks convert (and the numerical check compiles) every
final partition; preprocess, which ExecuTorch calls with the partition's
program and compile specs only, takes that work over through a handle the
partitioner puts in the compile specs, rather than converting again.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable

import torch
from torch.export import ExportedProgram

from openvino_backend.graph import output_nodes, user_input_nodes
from openvino_backend.lowering.partition_model import ConvertedPartition, constants_by_name, same_tensor

logger = logging.getLogger(__name__)

# The final partitions' conversions, handed from the partitioner's checks to preprocess under a
# handle the partitioner puts in each partition's compile specs (ExecuTorch partitions every method
# before it preprocesses any). Preprocess takes one only when the partition it is given computes
# the same nodes from the same inputs into the same outputs, by name; otherwise it converts.
_HANDED_OVER: dict[str, tuple[frozenset[str], ConvertedPartition]] = {}
_HANDLES = itertools.count()
_KEPT = 64  # handles never taken (an export that failed after partitioning) are dropped past this


def hand_over(nodes: Iterable[torch.fx.Node], result: ConvertedPartition) -> str:
    """Offer preprocess the conversion the checks made of this final partition; its handle."""
    handle = str(next(_HANDLES))
    _HANDED_OVER[handle] = (_key(nodes), result)
    while len(_HANDED_OVER) > _KEPT:
        _HANDED_OVER.pop(next(iter(_HANDED_OVER)))
    return handle


def take_over(handle: str | None, program: ExportedProgram) -> ConvertedPartition | None:
    """The checks' conversion of this partition (once), if it computes the same thing: the same
    nodes, from the same inputs into the same outputs, with the same constants (by value: the
    partitioner saw a copy of the program whose weights it restored itself)."""
    key, handed = _HANDED_OVER.pop(handle, (None, None)) if handle is not None else (None, None)
    if handed is None:
        return None
    inputs = [node.name for node in user_input_nodes(program)]
    outputs = [node.name if isinstance(node, torch.fx.Node) else "" for node in output_nodes(program.graph_module)]
    constants = constants_by_name(program, program.graph.nodes)
    same = (
        key == _key(program.graph.nodes)
        and [n.name for n in handed.inputs] == inputs
        and [n.name for n in handed.outputs] == outputs
        and constants.keys() == handed.constants.keys()
        and all(same_tensor(constants[name], value) for name, value in handed.constants.items())
    )
    if not same:
        logger.debug("the checks converted this partition otherwise (nodes, inputs, outputs or constants)")
        return None
    return handed


def release(handle: str | None) -> None:
    """Drop the checks' conversion of a partition preprocess converts itself (one with state):
    held, it would keep an OpenVINO model and its compiled form, weights and all, alive for as
    long as the process runs."""
    if handle is not None:
        _HANDED_OVER.pop(handle, None)


def _key(nodes: Iterable[torch.fx.Node]) -> frozenset[str]:
    return frozenset(node.name for node in nodes if node.op == "call_function")
