"""Find pass-throughs (and mistyped outputs) by converting proposed partitions.

The copy list (``ops.py``, used by ``edge_rules.py``) is the fast path; it is kept by hand. Before
the partitioner commits, each proposed partition is converted with
OpenVINO's frontend (no compile) and any output that comes straight from a
Parameter names a node to keep out, whatever its op; so does an output
OpenVINO types differently from PyTorch. Such nodes are reported with their
op, so the list can learn from them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import torch

from openvino_backend.diagnostics import OpenvinoExportError
from openvino_backend.graph import dtype_of, op_name
from openvino_backend.lowering.convert import failed_node_names, failed_op_names
from openvino_backend.lowering.handover import hand_over
from openvino_backend.lowering.partition_model import ConvertedPartition, convert_partition
from openvino_backend.lowering.validate import find_passthroughs, find_type_mismatches
from openvino_backend.ops import is_bound_pad
from openvino_backend.partition.view import Objection, PartitionView
from openvino_backend.timing import timed

logger = logging.getLogger(__name__)


def converted(part: PartitionView) -> ConvertedPartition:
    """``convert_partition`` of a proposed partition, once for all the checks of a round."""
    if "converted" not in part.memo:
        try:
            part.memo["converted"] = convert_partition(part.program, part.ordered())
        except OpenvinoExportError as error:
            part.memo["converted"] = error
    result = part.memo["converted"]
    if isinstance(result, OpenvinoExportError):
        raise result
    return result


@timed("conversion_check")
def keep_converted_passthroughs_out(part: PartitionView) -> Iterator[Objection]:
    """Outputs OpenVINO would feed straight from a Parameter, found by converting the partition."""
    try:
        partition = converted(part)
        model, outputs = partition.model, partition.outputs
    except OpenvinoExportError as error:
        # OpenVINO names the nodes it could not convert by their FX names, and the ops it has no
        # rule for by their op names: keep those out. Otherwise preprocess converts again and explains.
        message = " ".join(error.notes)
        failed, unknown = set(failed_node_names(message)), set(failed_op_names(message))
        kept = 0
        for node in part.nodes:
            if node.name in failed or op_name(node) in unknown:
                kept += 1
                yield node, f"OpenVINO cannot convert this {op_name(node)}: {error.why.split(': ', 1)[-1]}"
        if not kept:
            logger.debug("conversion check could not convert a partition: %s", error)
        return
    for passthrough in find_passthroughs(model):
        node = _unpadded(outputs[passthrough.output])
        yield (
            node,
            (
                f"OpenVINO converts {op_name(node)} to nothing here, so this output would be the partition's "
                f"input `{passthrough.parameter_name}` unchanged (found by converting the partition; "
                "not on the copy list: please report the op)"
            ),
        )
    for mismatch in find_type_mismatches(model, [dtype_of(node) for node in outputs]):
        # A padded dynamic output carries the type of what it pads; the pad itself must stay.
        node = _unpadded(outputs[mismatch.output])
        yield (
            node,
            (
                f"OpenVINO computes {op_name(node)} in {mismatch.actual} where PyTorch gives "
                f"{str(mismatch.expected).removeprefix('torch.')} (found by converting the partition): "
                "values could differ and the runtime cannot bind it"
            ),
        )


def _unpadded(node: torch.fx.Node) -> torch.fx.Node:
    return node.args[0] if is_bound_pad(node) else node


def offer_conversion(part: PartitionView) -> str | None:
    """Hand this final partition's conversion to preprocess (``lowering/handover.py``); its handle,
    or None when the checks did not convert it. A partition that holds state is converted again by
    preprocess, with its buffers as variables: its conversion, weights and compiled form and all,
    is let go here rather than kept until then."""
    if part.held_state:
        part.memo.pop("converted", None)
        return None
    result = part.memo.get("converted")
    return hand_over(part.nodes, result) if isinstance(result, ConvertedPartition) else None
