"""Find pass-throughs (and mistyped outputs) by converting proposed partitions.

The copy list in ``boundary.py`` is the fast path; it is kept by hand. Before
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
from executorch.exir.passes.memory_format_ops_pass import DimOrderOpsRevertPass
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from openvino_backend.boundary import PartitionView, Rejection
from openvino_backend.convert import convert, failed_node_names
from openvino_backend.diagnostics import OpenvinoExportError, op_name
from openvino_backend.validate import find_passthroughs, find_type_mismatches

logger = logging.getLogger(__name__)


def partition_graph(part: PartitionView) -> tuple[torch.fx.GraphModule, tuple[torch.fx.Node, ...]]:
    """A stand-alone copy of the partition's graph, and its outputs in the original graph."""
    nodes = [node for node in part.program.graph.nodes if node in part.nodes]
    graph_module, _, outputs = fuse_as_graphmodule(
        part.program.graph_module, nodes, "openvino_partition", always_return_tuple=True
    )
    result = DimOrderOpsRevertPass()(graph_module)
    if result is not None and result.graph_module is not None:
        graph_module = result.graph_module
    return graph_module, tuple(outputs)


def keep_converted_passthroughs_out(part: PartitionView) -> Iterator[Rejection]:
    """Outputs OpenVINO would feed straight from a Parameter, found by converting the partition."""
    try:
        graph_module, outputs = partition_graph(part)
        model = convert(graph_module)
    except OpenvinoExportError as error:
        # OpenVINO names the ops it could not convert by their FX node names:
        # keep those out. Otherwise preprocess converts again and explains.
        failed = set(failed_node_names(" ".join(error.notes)))
        for node in part.nodes:
            if node.name in failed:
                yield node, f"OpenVINO cannot convert this {op_name(node)}: {error.why.split(': ', 1)[-1]}"
        if not failed:
            logger.debug("conversion check could not convert a partition: %s", error)
        return
    for passthrough in find_passthroughs(model):
        node = outputs[passthrough.output]
        yield (
            node,
            (
                f"OpenVINO converts {op_name(node)} to nothing here, so this output would be the partition's "
                f"input `{passthrough.parameter_name}` unchanged (found by converting the partition; "
                "not on the copy list: please report the op)"
            ),
        )
    for mismatch in find_type_mismatches(model, [_dtype(node) for node in outputs]):
        node = outputs[mismatch.output]
        yield (
            node,
            (
                f"OpenVINO computes {op_name(node)} in {mismatch.actual} where PyTorch gives "
                f"{str(mismatch.expected).removeprefix('torch.')} (found by converting the partition): "
                "values could differ and the runtime cannot bind it"
            ),
        )


def _dtype(node: torch.fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None
