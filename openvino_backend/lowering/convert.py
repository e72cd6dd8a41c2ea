"""FX graph -> ``ov.Model``, through OpenVINO's PyTorch frontend."""

from __future__ import annotations

import logging
import re
from functools import lru_cache

import numpy as np
import openvino as ov
import openvino.opset13 as opset
import torch
from openvino.frontend import FrontEnd, FrontEndManager
from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder
from openvino.frontend.pytorch.utils import pt_to_ov_type_map

from openvino_backend.diagnostics import ConversionError, Finding, NodeRef
from openvino_backend.graph import output_nodes
from openvino_backend.lowering.edge_layout import int_constant
from openvino_backend.lowering.model_passes.attention_scale import hoist_query_scales, scale_queries
from openvino_backend.lowering.model_passes.expand_broadcast import expands_as_numpy_broadcasts
from openvino_backend.lowering.model_passes.grouped_attention import ungroup_attention
from openvino_backend.lowering.model_passes.scalar_fills import fills_as_scalars
from openvino_backend.lowering.model_passes.wide_weights import dequantize_wide_weights
from openvino_backend.ops import is_bound_pad
from openvino_backend.runtime import int8_weight_bits, openvino_version

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def pytorch_frontend() -> FrontEnd:
    return FrontEndManager().load_by_framework("pytorch")


def input_signature(graph_module: torch.fx.GraphModule) -> list[tuple[ov.Type, ov.PartialShape | None]]:
    """Element type and shape of each placeholder, from its ``meta["val"]`` (None: an int input)."""
    signature = []
    for node in graph_module.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            # A symbolic size stays dynamic; the runtime binds the real one per call. (Bounded
            # dimensions gained no speed in bench, and with them the dynamic MLP test failed at
            # run time with error 0x1.)
            dims = [d if isinstance(d, int) else -1 for d in val.shape]
            signature.append((pt_to_ov_type_map[str(val.dtype)], ov.PartialShape(dims)))
        else:  # a SymInt / int input: a scalar to the frontend, bound by the runtime as i64[1]
            signature.append((ov.Type.i64, None))
    return signature


def _bind_scalar_as_vector(parameter: ov.Node) -> None:
    """The runtime binds an int input as i64[1]; the converted ops read it as a scalar, except a
    Slice's bounds, which must be 1-D (the frontend leaves them as they come when their rank was
    unknown at conversion, as a size passed into the partition's is)."""
    readers = list(parameter.output(0).get_target_inputs())
    parameter.set_partial_shape(ov.PartialShape([1]))
    scalar = opset.squeeze(parameter, int_constant([0]))
    for reader in readers:
        bound = reader.get_node().get_type_name() == "Slice" and reader.get_index() > 0
        reader.replace_source_output(parameter.output(0) if bound else scalar.output(0))


class NodeList(list):
    """The decoder's list of a graph's nodes, ``index`` by a table: OpenVINO's FX decoder looks up
    each node's inputs with ``list.index``, quadratic in the graph's length (a 0.5 B decoder's
    graph: seconds per conversion). Nodes compare by identity, so the table finds what ``index``
    finds, the first position of that node."""

    def __init__(self, nodes: list[torch.fx.Node]) -> None:
        super().__init__(nodes)
        self._positions: dict[torch.fx.Node, int] = {}
        for position, node in enumerate(nodes):
            self._positions.setdefault(node, position)

    def index(self, node: object, *args: int) -> int:
        position = self._positions.get(node) if isinstance(node, torch.fx.Node) and not args else None
        return super().index(node, *args) if position is None else position


def fx_decoder(graph_module: torch.fx.GraphModule) -> TorchFXPythonDecoder:
    """OpenVINO's decoder of ``graph_module``, whose node decoders find their inputs by table."""
    decoder = TorchFXPythonDecoder(graph_module)
    if isinstance(getattr(decoder, "_nodes", None), list):
        decoder._nodes = NodeList(decoder._nodes)
    return decoder


def convert(graph_module: torch.fx.GraphModule, partition: int | None = None) -> ov.Model:
    """Convert one partition's graph; raise ``ConversionError`` if OpenVINO refuses it.

    ``pad_to_bound`` outputs (``transform/dynamic.py``) are taken out of ``graph_module``
    (in place) and become OpenVINO ``Pad`` ops on their Results.
    """
    frontend = pytorch_frontend()
    try:
        bounds = take_bound_pads(graph_module)
        # The decoder must outlive frontend.convert: passed as a temporary it can
        # be collected mid-conversion ("pure virtual function ... decoder_type_name").
        decoder = fx_decoder(graph_module)
        model = _with_every_input(frontend.convert(frontend.load(decoder)), graph_module)
        for parameter, (element_type, shape) in zip(model.get_parameters(), input_signature(graph_module), strict=True):
            parameter.set_element_type(element_type)
            if shape is None:
                _bind_scalar_as_vector(parameter)
            else:
                parameter.set_partial_shape(shape)
        model.validate_nodes_and_infer_types()
        if expanded := expands_as_numpy_broadcasts(model):
            logger.debug("%d expand(s) as NUMPY Broadcasts", expanded)
        if filled := fills_as_scalars(model):
            logger.debug("%d one-value fill(s) read as scalars", filled)
        if grouped := ungroup_attention(model):
            logger.debug("%d attention(s) read their key and value heads once per group", grouped)
        if scaled := scale_queries(model):
            logger.debug("%d attention(s) scale their queries", scaled)
        if hoisted := hoist_query_scales(model):
            logger.debug("%d query scale(s) applied by the projection's matmul", hoisted)
        if (bits := int8_weight_bits()) < 8 and (wide := dequantize_wide_weights(model, bits)):
            logger.debug("%d INT8 weight(s) past %d bits dequantized: no VNNI on this CPU", wide, bits)
        pad_results(model, bounds)
    except Exception as error:  # OpenVINO raises bare RuntimeErrors with C++ check text
        raise conversion_error(
            "OpenVINO's PyTorch frontend could not convert", graph_module, partition, error
        ) from error
    return model


def _with_every_input(model: ov.Model, graph_module: torch.fx.GraphModule) -> ov.Model:
    """``model`` with a Parameter for every placeholder, in order.

    The frontend drops an input its conversion does not read (a placeholder
    nothing reads, or one only an op it translates without it reads), but the
    runtime binds the delegate's inputs by position: without it, every later
    input would be bound to the wrong Parameter. The Parameters kept are
    matched to placeholders by name, or, when the frontend named them
    otherwise, the dropped ones are the placeholders nothing reads.
    """
    placeholders = graph_module.graph.find_nodes(op="placeholder")
    converted = list(model.get_parameters())
    if len(converted) == len(placeholders):
        return model
    by_name = {parameter.get_friendly_name(): parameter for parameter in converted}
    names = [node.name for node in placeholders]
    if set(by_name) <= set(names):
        kept = [by_name.get(name) for name in names]
    elif len(converted) + sum(1 for node in placeholders if not node.users) == len(placeholders):
        remaining = iter(converted)
        kept = [next(remaining) if node.users else None for node in placeholders]
    else:
        return model  # not as expected: the caller's strict zip says so
    logger.debug("inputs the frontend dropped: %s", ", ".join(n for n, p in zip(names, kept, strict=True) if p is None))
    parameters = [  # a dropped input's type and shape are set by the caller, as for the others
        parameter if parameter is not None else opset.parameter([1], ov.Type.i64, name=name)
        for name, parameter in zip(names, kept, strict=True)
    ]
    return ov.Model(model.get_results(), parameters, model.get_friendly_name())


def take_bound_pads(graph_module: torch.fx.GraphModule) -> dict[int, list[int]]:
    """Remove the ``pad_to_bound`` nodes that are outputs; their bound sizes by output index."""
    graph = graph_module.graph
    bounds = {}
    for index, node in enumerate(output_nodes(graph_module)):
        if isinstance(node, torch.fx.Node) and is_bound_pad(node):
            bounds[index] = list(node.args[1])
            graph.output_node().replace_input_with(node, node.args[0])
    for node in list(graph.nodes):
        if is_bound_pad(node) and not node.users:
            graph.erase_node(node)
    if bounds:
        graph_module.recompile()
    return bounds


def pad_results(model: ov.Model, bounds: dict[int, list[int]]) -> None:
    """Pad Result ``index`` with zeros at the end of each dim to ``bounds[index]`` (a static shape)."""
    results = model.get_results()
    for index, size in bounds.items():
        source = results[index].input_value(0)
        target = int_constant(size)
        pads_end = opset.subtract(target, opset.shape_of(source, "i64"))
        zero = opset.constant(np.zeros((), dtype=source.get_element_type().to_dtype()))
        padded = opset.pad(source, int_constant([0] * len(size)), pads_end, "constant", zero)
        results[index].input(0).replace_source_output(opset.reshape(padded, target, special_zero=False).output(0))
    if bounds:
        model.validate_nodes_and_infer_types()


# "... conversion of operation NODE/..." (a translator failed) and "While validating node '...' with
# friendly_name 'NODE/...'" (an op it built fails shape inference): both name the FX node.
_FAILED_NODE = re.compile(r"(?:conversion of operation |with friendly_name ')([^/\s']+)/")
# Ops OpenVINO failed on, and ops it has no rule for at all: both lines list ``aten.x.overload`` names.
_FAILED_OPS = re.compile(r"(?:Conversion is failed for|No conversion rule found for operations): (.+)")


def failed_node_names(message: str) -> list[str]:
    """FX node names OpenVINO's frontend reports it could not convert (friendly names carry them)."""
    return list(dict.fromkeys(_FAILED_NODE.findall(message)))


def failed_op_names(message: str) -> list[str]:
    """Op names (``aten.sub.Scalar``) OpenVINO's frontend reports it failed on or has no rule for."""
    return list(dict.fromkeys(op.strip() for line in _FAILED_OPS.findall(message) for op in line.split(", ")))


def conversion_error(
    what: str, graph_module: torch.fx.GraphModule, partition: int | None, error: BaseException
) -> ConversionError:
    message = str(error)
    calls = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    failed = set(failed_node_names(message))
    culprits = [n for n in calls if n.name in failed]
    nodes = tuple(NodeRef.from_node(n) for n in culprits or calls)
    reported = set(failed_op_names(message))
    ops = sorted(reported | {n.op for n in nodes if culprits})
    skip = ", ".join(repr(o) for o in ops) or repr("<op>")
    detail = _summarize(message)
    return ConversionError(
        summary=f"{what} this partition ({len(calls)} ops)",
        findings=(Finding("OpenVINO failed on:" if culprits else "the partition's ops, in order:", nodes),),
        why=f"OpenVINO {openvino_version()} reported: {detail}",
        fix=(
            "keep the op OpenVINO rejects out of the partition:\n"
            f"OpenvinoPartitioner(compile_spec, op_types_to_skip={{{skip}}})\n"
            "and please report it with the full message below"
        ),
        partition=partition,
        notes=(str(error).strip(),),
    )


def _summarize(message: str) -> str:
    """OpenVINO's own explanation: the frontend's line if it gave one, else its last line."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    frontend = [line for line in lines if line.startswith("[PyTorch Frontend]")]
    return frontend[-1] if frontend else lines[-1]
