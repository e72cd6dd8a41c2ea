"""Batched matmuls recomposed from ExecuTorch's bmm decomposition."""

from __future__ import annotations

import torch
from executorch.exir.pass_base import ExportPass, PassResult

from openvino_backend.lowering.passes.common import EDGE, rewritten, same_shape


class RecomposeMatmulPass(ExportPass):
    """``view(bmm(view(expand(a)), view(expand(b))))`` -> ``matmul(a, b)``.

    PyTorch decomposes a batched ``matmul`` into expands that materialize the
    broadcast batch, reshapes to 3-d, ``bmm`` and a reshape back. OpenVINO's
    MatMul broadcasts batch dims itself; given the decomposed form it runs
    five ops instead of one, and its attention fusions do not see the MatMul
    -> Softmax -> MatMul chain. A weight expanded to a batch (``linear`` of a
    3-d view with a dynamic dim) stays a matrix, which OpenVINO runs as one
    fully connected layer instead of a copy of the weight per batch element.
    The rewrite applies only where the result's shape is exactly
    ``matmul``'s (the batch dims broadcast, the matrix dims untouched by the
    expands).
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.find_nodes(op="call_function", target=EDGE.bmm.default)):
            if len(node.users) != 1:
                continue
            (out,) = node.users
            if out.target != EDGE.view_copy.default:
                continue
            out_batch = out.meta["val"].shape[:-2]
            sources = [_batched_source(operand, out_batch) for operand in node.args[:2]]
            if any(source is None for source in sources) or all(s.meta["val"].dim() < 3 for s in sources):
                continue  # two matrices: the bmm's own batch is the only one
            a, b = (source.meta["val"] for source in sources)
            try:
                batch = torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])
            except RuntimeError:
                continue
            if not same_shape((*batch, a.shape[-2], b.shape[-1]), out.meta["val"].shape):
                continue
            with graph.inserting_before(out):
                # The frontend has no rule for aten.matmul; it translates bmm as MatMul, which
                # broadcasts batch dims. This graph is only ever read by the frontend.
                matmul = graph.call_function(EDGE.bmm.default, tuple(sources))
            matmul.meta.update(out.meta)
            out.replace_all_uses_with(matmul)
            modified = True
        return rewritten(graph_module, modified)


def _batched_source(operand: torch.fx.Node, batch: tuple) -> torch.fx.Node | None:
    """The tensor a ``bmm`` operand was flattened from (before any expand), if the flattened
    dims are exactly ``batch`` and the matrix dims are untouched."""
    if not isinstance(operand, torch.fx.Node) or operand.target != EDGE.view_copy.default:
        return None
    source = operand.args[0]
    while isinstance(source, torch.fx.Node) and source.target == EDGE.clone.default:  # the same values
        source = source.args[0]
    if not isinstance(source, torch.fx.Node) or not same_shape(source.meta["val"].shape[:-2], batch):
        return None  # the batch elements would pair up differently
    if source.target == EDGE.expand_copy.default:
        expanded = source.args[0]
        if expanded.meta["val"].dim() >= 2 and same_shape(
            expanded.meta["val"].shape[-2:], source.meta["val"].shape[-2:]
        ):
            source = expanded
    shape = source.meta["val"].shape
    if len(shape) < 2 or not same_shape(shape[-2:], operand.meta["val"].shape[-2:]):
        return None
    return source
