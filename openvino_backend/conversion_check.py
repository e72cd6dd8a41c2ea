"""Find pass-throughs (and mistyped outputs) by converting proposed partitions.

The copy list in ``boundary.py`` is the fast path; it is kept by hand. Before
the partitioner commits, each proposed partition is converted with
OpenVINO's frontend (no compile) and any output that comes straight from a
Parameter names a node to keep out, whatever its op; so does an output
OpenVINO types differently from PyTorch. Such nodes are reported with their
op, so the list can learn from them.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import openvino as ov
import torch
from torch.export import ExportedProgram
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from openvino_backend.boundary import PartitionView, Rejection, non_default_dim_order, owned_constants
from openvino_backend.convert import convert, failed_node_names
from openvino_backend.diagnostics import OpenvinoExportError, op_name
from openvino_backend.dynamic import is_bound_pad
from openvino_backend.edge_layout import DimOrder, adapt_edge_layouts
from openvino_backend.passes import prepare_for_frontend
from openvino_backend.timing import timed
from openvino_backend.validate import find_passthroughs, find_type_mismatches, output_nodes, user_input_nodes

logger = logging.getLogger(__name__)


def partition_graph(
    program: ExportedProgram, nodes: Sequence[torch.fx.Node]
) -> tuple[torch.fx.GraphModule, tuple[torch.fx.Node, ...], tuple[torch.fx.Node, ...]]:
    """``nodes`` as preprocess will see them once delegated: a stand-alone graph, constants it
    alone reads as attributes, the same passes run; with its run-time inputs and its outputs
    (nodes of the original graph)."""
    graph_module, inputs, outputs = fuse_as_graphmodule(
        program.graph_module, list(nodes), "openvino_partition", always_return_tuple=True
    )
    # The passes retrace placeholders, not attributes: run them first.
    graph_module = prepare_for_frontend(graph_module)
    constants = owned_constants(program, set(nodes))
    graph = graph_module.graph
    runtime_inputs = []
    for placeholder, source in zip(graph.find_nodes(op="placeholder"), inputs, strict=True):
        if source not in constants:
            runtime_inputs.append(source)
            continue
        name = f"_constant_{source.name}"
        graph_module.register_buffer(name, constants[source].detach())
        with graph.inserting_before(placeholder):
            attribute = graph.get_attr(name)
        attribute.meta = dict(placeholder.meta)
        placeholder.replace_all_uses_with(attribute)
        graph.erase_node(placeholder)
    graph_module.recompile()
    return graph_module, tuple(runtime_inputs), tuple(outputs)


@dataclass(frozen=True)
class ConvertedPartition:
    """A proposed partition converted as preprocess converts it, edge layouts adapted."""

    model: ov.Model
    inputs: tuple[torch.fx.Node, ...]  # run-time inputs, in Parameter order
    outputs: tuple[torch.fx.Node, ...]  # in Result order
    input_orders: tuple[DimOrder | None, ...]
    output_orders: tuple[DimOrder | None, ...]
    constants: dict[str, torch.Tensor]  # baked in, by the name of the placeholder that lifted each
    # The graph that was converted (passes run, bound pads taken out): names nodes in preprocess's errors.
    graph_module: torch.fx.GraphModule = field(compare=False, repr=False)
    # Compiled by the numerical check, by (device, properties): preprocess can export one as it is.
    compiled: dict[tuple[str, str], ov.CompiledModel] = field(default_factory=dict, compare=False, repr=False)


def compile_key(device: str, properties: Mapping[str, str]) -> tuple[str, str]:
    return device, repr(sorted(properties.items()))


# The final partitions' conversions, handed from the partitioner's checks to preprocess under a
# handle the partitioner puts in each partition's compile specs (ExecuTorch partitions every method
# before it preprocesses any). Preprocess takes one only when the partition it is given computes
# the same nodes from the same inputs into the same outputs, by name; otherwise it converts.
_HANDED_OVER: dict[str, tuple[frozenset[str], ConvertedPartition]] = {}
_HANDLES = itertools.count()
_KEPT = 64  # handles never taken (an export that failed after partitioning) are dropped past this


def hand_over(part: PartitionView) -> str | None:
    """Offer preprocess the conversion the checks made of this final partition; its handle."""
    result = part.memo.get("converted")
    if not isinstance(result, ConvertedPartition):
        return None
    handle = str(next(_HANDLES))
    _HANDED_OVER[handle] = (_key(part.nodes), result)
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
    constants = _constants_by_name(program, program.graph.nodes)
    same = (
        key == _key(program.graph.nodes)
        and [n.name for n in handed.inputs] == inputs
        and [n.name for n in handed.outputs] == outputs
        and constants.keys() == handed.constants.keys()
        and all(_same_tensor(constants[name], value) for name, value in handed.constants.items())
    )
    if not same:
        logger.debug("the checks converted this partition otherwise (nodes, inputs, outputs or constants)")
        return None
    return handed


def _constants_by_name(program: ExportedProgram, nodes: Iterable[torch.fx.Node]) -> dict[str, torch.Tensor]:
    """The constants only ``nodes`` read, by the name of the placeholder that lifted each."""
    return {node.name: value for node, value in owned_constants(program, set(nodes)).items()}


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and (a is b or torch.equal(a, b))


def _key(nodes: Iterable[torch.fx.Node]) -> frozenset[str]:
    return frozenset(node.name for node in nodes if node.op == "call_function")


def convert_partition(program: ExportedProgram, nodes: Sequence[torch.fx.Node]) -> ConvertedPartition:
    """Raises ``OpenvinoExportError`` (a ``ConversionError``, a ``DimOrderError``) as preprocess would."""
    graph_module, inputs, outputs = partition_graph(program, nodes)
    constants = _constants_by_name(program, nodes)
    model = convert(graph_module)
    input_orders = tuple(non_default_dim_order(node.meta.get("val")) for node in inputs)
    output_orders = tuple(non_default_dim_order(node.meta.get("val")) for node in outputs)
    adapt_edge_layouts(model, input_orders, output_orders)
    return ConvertedPartition(model, inputs, outputs, input_orders, output_orders, constants, graph_module)


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
def keep_converted_passthroughs_out(part: PartitionView) -> Iterator[Rejection]:
    """Outputs OpenVINO would feed straight from a Parameter, found by converting the partition."""
    try:
        partition = converted(part)
        model, outputs = partition.model, partition.outputs
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
        node = _unpadded(outputs[passthrough.output])
        yield (
            node,
            (
                f"OpenVINO converts {op_name(node)} to nothing here, so this output would be the partition's "
                f"input `{passthrough.parameter_name}` unchanged (found by converting the partition; "
                "not on the copy list: please report the op)"
            ),
        )
    for mismatch in find_type_mismatches(model, [_dtype(node) for node in outputs]):
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


def _dtype(node: torch.fx.Node) -> torch.dtype | None:
    val = node.meta.get("val")
    return val.dtype if isinstance(val, torch.Tensor) else None
