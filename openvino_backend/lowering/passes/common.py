"""What the passes share: the edge ops they match and build, and how a pass reports its result."""

from __future__ import annotations

import torch
from executorch.exir.dialects._ops import ops as exir_ops
from executorch.exir.pass_base import ExportPass, PassResult
from torch.fx.experimental.symbolic_shapes import statically_known_true

EDGE = exir_ops.edge.aten
QUANT = exir_ops.edge.quantized_decomposed


def retraced(export_pass: ExportPass, graph_module: torch.fx.GraphModule, modified: bool) -> PassResult:
    """The pass's result: ``graph_module`` as it is, or retraced so new nodes get their ``meta["val"]``."""
    if not modified:
        return PassResult(graph_module, False)
    graph_module.recompile()
    return PassResult(ExportPass.call(export_pass, graph_module).graph_module, True)


def rewritten(graph_module: torch.fx.GraphModule, modified: bool) -> PassResult:
    """The result of a pass that rewrote ``graph_module`` in place: what it left unread removed."""
    if modified:
        graph_module.graph.eliminate_dead_code()
        graph_module.recompile()
    return PassResult(graph_module, modified)


def same_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b, strict=True))
