"""Shape arguments in the forms OpenVINO folds."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult
from torch.fx.experimental.symbolic_shapes import statically_known_true

from openvino_backend.lowering.passes.common import EDGE, rewritten


class ConstantShapeArgumentsPass(ExportPass):
    """Symbolic sizes in ``view_copy`` and ``expand_copy`` written as -1 where that means the same.

    A size computed from a symbolic dim (``view_copy(x, [9*s, 4, 16])``)
    reaches OpenVINO as a run-time input or a shape subgraph: the Reshape's
    target is data, OpenVINO loses the static dims around it ([?,?,?,?]
    where [1,4,?,16] is known) and re-infers shapes on every call. A view with
    one symbolic dim gets ``-1`` there (the element count fixes it, as long as
    it cannot be zero); an expand gets ``-1`` wherever it keeps the input's
    size. The targets are then constants.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        for node in graph_module.graph.find_nodes(op="call_function", target=EDGE.view_copy.default):
            shape = node.meta["val"].shape
            symbolic = [i for i, d in enumerate(shape) if not isinstance(d, int)]
            if len(symbolic) != 1 or not statically_known_true(node.meta["val"].numel() > 0):
                continue
            size = [-1 if isinstance(d, torch.SymInt) else d for d in shape]
            if size != list(node.args[1]):
                node.args = (node.args[0], size, *node.args[2:])
                modified = True
        for node in graph_module.graph.find_nodes(op="call_function", target=EDGE.expand_copy.default):
            source = node.args[0].meta["val"].shape
            size = list(node.args[1])
            offset = len(size) - len(source)
            kept = [i for i in range(offset, len(size)) if _same_size(size[i], source[i - offset])]
            for i in kept:
                size[i] = -1
            if kept:
                node.args = (node.args[0], size, *node.args[2:])
                modified = True
        return rewritten(graph_module, modified)


def _same_size(entry: object, size: int | torch.SymInt) -> bool:
    """True if ``entry`` (an expand's size argument) is the symbolic ``size`` itself."""
    value = entry.meta.get("val") if isinstance(entry, torch.fx.Node) else None
    return isinstance(value, torch.SymInt) and isinstance(size, torch.SymInt) and value.node.expr == size.node.expr
