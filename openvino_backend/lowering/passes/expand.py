"""Expands and views that change no shape, removed."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult

from openvino_backend.lowering.passes.common import EDGE, rewritten, same_shape


class DropSameShapeExpandPass(ExportPass):
    """``expand_copy(x, size)`` whose result has ``x``'s shape -> ``x``.

    Such an expand copies ``x`` and nothing else: ``repeat_interleave`` by 1 (a
    model's grouped-query attention with as many key heads as query heads)
    decomposes into one. With a dynamic dim OpenVINO cannot see that the
    target shape is the input's, and its CPU plugin then runs a Broadcast, a
    Reorder and a Multiply by ones on the whole tensor: with a KV cache, on the
    whole cache, once for the keys and once for the values of every layer, on
    every call.

    Values in OpenVINO are never written in place, so inside a partition a copy
    means nothing. An expand of a partition input stays: without it a Result
    could come straight from a Parameter, which the export-time checks keep
    out of OpenVINO. So does an expand that leaves the partition beside its
    source: without it two Results would name one tensor, which OpenVINO's
    frontend refuses.
    """

    TARGETS = (EDGE.expand_copy.default,)

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        modified = False
        found = [n for target in self.TARGETS for n in graph_module.graph.find_nodes(op="call_function", target=target)]
        for node in found:
            source = node.args[0]
            if not isinstance(source, torch.fx.Node) or source.op == "placeholder":
                continue
            if _is_output(node) and _is_output(source):
                continue
            before, after = source.meta.get("val"), node.meta.get("val")
            if not (isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor)):
                continue
            if before.dtype == after.dtype and same_shape(tuple(before.shape), tuple(after.shape)):
                node.replace_all_uses_with(source)
                modified = True
        return rewritten(graph_module, modified)


class DropSameShapeViewPass(DropSameShapeExpandPass):
    """``view_copy(x, size)`` whose result has ``x``'s shape -> ``x``, on the same terms.

    Transformers' attention reshapes its output to ``[batch, -1, length,
    head_dim]``, what it already is unless its queries were packed: with the
    length dynamic, OpenVINO keeps a ``Reshape`` per layer and call. Runs after
    the matmul and attention recompositions, which read PyTorch's views as
    their decompositions write them.
    """

    TARGETS = (EDGE.view_copy.default,)


def _is_output(node: torch.fx.Node) -> bool:
    return any(user.op == "output" for user in node.users)
