"""A set of nodes as preprocess converts it: a stand-alone graph, the passes run, converted
by OpenVINO's frontend, its edge layouts adapted.

The partitioner's checks convert proposed partitions through here, so what
they judge is what preprocess would build.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import openvino as ov
import torch
from torch.export import ExportedProgram
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from openvino_backend.graph import as_attribute, non_default_dim_order, owned_constants
from openvino_backend.lowering.convert import convert
from openvino_backend.lowering.edge_layout import DimOrder, adapt_edge_layouts
from openvino_backend.lowering.passes import prepare_for_frontend


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
        as_attribute(graph_module, placeholder, constants[source])
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


def convert_partition(program: ExportedProgram, nodes: Sequence[torch.fx.Node]) -> ConvertedPartition:
    """Raises ``OpenvinoExportError`` (a ``ConversionError``, a ``DimOrderError``) as preprocess would."""
    graph_module, inputs, outputs = partition_graph(program, nodes)
    constants = constants_by_name(program, nodes)
    model = convert(graph_module)
    input_orders = tuple(non_default_dim_order(node.meta.get("val")) for node in inputs)
    output_orders = tuple(non_default_dim_order(node.meta.get("val")) for node in outputs)
    adapt_edge_layouts(model, input_orders, output_orders)
    return ConvertedPartition(model, inputs, outputs, input_orders, output_orders, constants, graph_module)


def constants_by_name(program: ExportedProgram, nodes: Iterable[torch.fx.Node]) -> dict[str, torch.Tensor]:
    """The constants only ``nodes`` read, by the name of the placeholder that lifted each."""
    return {node.name: value for node, value in owned_constants(program, set(nodes)).items()}


def same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and (a is b or torch.equal(a, b))
