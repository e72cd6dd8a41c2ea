"""FX graph -> ``ov.Model``, through OpenVINO's PyTorch frontend."""

from __future__ import annotations

import logging
import re
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


_FAILED_NODE = re.compile(r"conversion of operation ([^/\s]+)/")
_FAILED_OPS = re.compile(r"Conversion is failed for: (.+)")


def failed_node_names(message: str) -> list[str]:
    """FX node names OpenVINO's frontend reports it could not convert (friendly names carry them)."""
    return list(dict.fromkeys(_FAILED_NODE.findall(message)))


def conversion_error(
    what: str, graph_module: torch.fx.GraphModule, partition: int | None, error: BaseException
) -> ConversionError:
    message = str(error)
    calls = [n for n in graph_module.graph.nodes if n.op == "call_function"]
    failed = set(failed_node_names(message))
    culprits = [n for n in calls if n.name in failed]
    nodes = tuple(NodeRef.from_node(n) for n in culprits or calls)
    reported = {op for match in _FAILED_OPS.findall(message) for op in match.split(", ")}
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
