"""Dim-order ops back to the aten forms OpenVINO's frontend knows."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult
from executorch.exir.passes.memory_format_ops_pass import MemoryFormatOpsMap, get_memory_format


class RevertDimOrderOpsPass(ExportPass):
    """Dim-order ops back to their memory-format forms, which the frontend translates.

    What ExecuTorch's ``DimOrderOpsRevertPass`` does, in place: that pass is an
    ``ExportPass`` that re-traces the whole graph to rename a few ops, the
    largest cost of converting a large partition. The values, and so every
    ``meta["val"]``, stay as they are.
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        for node in graph_module.graph.nodes:
            if node.op != "call_function" or node.target not in MemoryFormatOpsMap:
                continue
            target = MemoryFormatOpsMap[node.target]
            first = node.args[0]
            rank = len(first) if isinstance(first, (list, tuple)) else first.meta["val"].dim()
            kwargs = dict(node.kwargs)
            kwargs["memory_format"] = get_memory_format(kwargs.pop("dim_order", list(range(rank))))
            accepted = {argument.name for argument in target._schema.arguments}
            node.target = target
            node.kwargs = {name: value for name, value in kwargs.items() if name in accepted}
            modified = True
        if modified:
            graph_module.recompile()
        return PassResult(graph_module, modified)
