"""FX graph -> ``ov.Model``, through OpenVINO's PyTorch frontend."""

from __future__ import annotations

import logging
from functools import lru_cache

import openvino as ov
import torch
from openvino.frontend import FrontEnd, FrontEndManager
from openvino.frontend.pytorch.fx_decoder import TorchFXPythonDecoder
from openvino.frontend.pytorch.utils import pt_to_ov_type_map

from openvino_backend.diagnostics import ConversionError, Finding, NodeRef
from openvino_backend.precision import openvino_version

logger = logging.getLogger(__name__)


@lru_cache(maxsize=1)
def pytorch_frontend() -> FrontEnd:
    return FrontEndManager().load_by_framework("pytorch")


def input_signature(graph_module: torch.fx.GraphModule) -> list[tuple[ov.Type, ov.PartialShape]]:
    """Element type and shape of each placeholder, from its ``meta["val"]``."""
    signature = []
    for node in graph_module.graph.find_nodes(op="placeholder"):
        val = node.meta.get("val")
        if isinstance(val, torch.Tensor):
            # A symbolic size (dynamic shape) stays dynamic; the runtime binds the real one per call.
            dims = [d if isinstance(d, int) else -1 for d in val.shape]
            signature.append((pt_to_ov_type_map[str(val.dtype)], ov.PartialShape(dims)))
        else:  # a SymInt / int input: the runtime binds it as i64[1]
            signature.append((ov.Type.i64, ov.PartialShape([1])))
    return signature


def convert(graph_module: torch.fx.GraphModule, partition: int | None = None) -> ov.Model:
    """Convert one partition's graph; raise ``ConversionError`` if OpenVINO refuses it."""
    frontend = pytorch_frontend()
    try:
        # The decoder must outlive frontend.convert: passed as a temporary it can
        # be collected mid-conversion ("pure virtual function ... decoder_type_name").
        decoder = TorchFXPythonDecoder(graph_module)
        model = frontend.convert(frontend.load(decoder))
        for parameter, (element_type, shape) in zip(model.get_parameters(), input_signature(graph_module), strict=True):
            parameter.set_element_type(element_type)
            parameter.set_partial_shape(shape)
        model.validate_nodes_and_infer_types()
    except Exception as error:  # OpenVINO raises bare RuntimeErrors with C++ check text
        raise conversion_error(
            "OpenVINO's PyTorch frontend could not convert", graph_module, partition, error
        ) from error
    return model


def conversion_error(
    what: str, graph_module: torch.fx.GraphModule, partition: int | None, error: BaseException
) -> ConversionError:
    nodes = tuple(NodeRef.from_node(n) for n in graph_module.graph.nodes if n.op == "call_function")
    detail = _summarize(str(error))
    return ConversionError(
        summary=f"{what} this partition ({len(nodes)} ops)",
        findings=(Finding("the partition's ops, in order:", nodes),),
        why=f"OpenVINO {openvino_version()} reported: {detail}",
        fix=(
            "keep the op OpenVINO rejects out of the partition, e.g.\n"
            "OpenvinoPartitioner(compile_spec, op_types_to_skip={'<op>'}), and please report it\n"
            "with the full message below (run with logging at DEBUG for the graph)"
        ),
        partition=partition,
        notes=(str(error).strip(),),
    )


def _summarize(message: str) -> str:
    """OpenVINO's own words (last line) and the check that failed (first ``Check`` line)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    check = next((line for line in lines if line.startswith("Check ")), None)
    return f"{lines[-1]}\n({check})" if check and check != lines[-1] else lines[-1]
