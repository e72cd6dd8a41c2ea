"""Attention recomposed from its decomposition into scaled_dot_product_attention."""

from __future__ import annotations

import math

import torch
from executorch.exir.pass_base import ExportPass, PassResult

from openvino_backend.lowering.passes.common import EDGE, rewritten, same_shape


class RecomposeAttentionPass(ExportPass):
    """Decomposed attention -> OpenVINO's ScaledDotProductAttention.

    PyTorch decomposes ``scaled_dot_product_attention`` into a MatMul of the
    scaled query and key, the mask added, ``_safe_softmax`` and a MatMul by the
    value. ``_safe_softmax`` guards rows whose scores are all ``-inf``: they
    give 0, where a softmax gives NaN. The guard reads the scores a second
    time, and OpenVINO's CPU plugin then runs every op of the chain on its
    own, static shapes or dynamic; given one ScaledDotProductAttention it runs
    one fused kernel. OpenVINO's kernel gives NaN for a fully masked row, so the guard is
    kept, computed from the mask: ``where(all(mask == -inf, -1), 0, attention)``.
    The two are the same whenever the query and key are finite (a row whose
    scores are all ``-inf`` only because the query or the key holds an infinity
    gives NaN here, 0 in PyTorch).
    """

    def call(self, graph_module: torch.fx.GraphModule) -> PassResult:
        graph = graph_module.graph
        modified = False
        for node in list(graph.find_nodes(op="call_function", target=EDGE.where.self)):
            match = _decomposed_attention(node)
            if match is None:
                continue
            query, key_t, value, mask, out = match
            # New values get their meta["val"] made from sizes already known: evaluating ops on the
            # program's fake tensors could add guards to its shape environment (and specialize a dim).
            with graph.inserting_before(out):
                # The scale is already in the query and key: PyTorch scales both before the MatMul.
                key, scale = _untransposed_key(key_t)
                if key is None:
                    rank = key_t.meta["val"].dim()
                    swapped = [*range(rank - 2), rank - 1, rank - 2]
                    key = _node(graph, EDGE.permute_copy.default, (key_t, swapped), like=key_t, sizes=swapped)
                result = _node(graph, EDGE.scaled_dot_product_attention.default, (query, key, value, mask), like=out)
                result.kwargs = {"scale": scale}
                if mask is not None:
                    rows = [*range(mask.meta["val"].dim() - 1)]
                    masked = _node(graph, EDGE.eq.Scalar, (mask, -math.inf), like=mask, dtype=torch.bool)
                    kept = _node(graph, EDGE.logical_not.default, (masked,), like=masked)
                    kept = _node(graph, EDGE.any.dim, (kept, -1, True), like=masked, sizes=rows, keepdim=True)
                    empty = _node(graph, EDGE.logical_not.default, (kept,), like=kept)
                    zeros = _node(graph, EDGE.full_like.default, (result, 0), like=out)
                    result = _node(graph, EDGE.where.self, (empty, zeros, result), like=out)
            out.replace_all_uses_with(result)
            modified = True
        return rewritten(graph_module, modified)


def _decomposed_attention(where: torch.fx.Node) -> tuple | None:
    """``where`` as the guard of a decomposed attention in float32: its query,
    transposed key, value, additive mask (or None) and the MatMul by the value; None otherwise."""
    condition, zeros, softmax = where.args
    if not all(isinstance(n, torch.fx.Node) for n in (condition, zeros, softmax)) or len(where.users) != 1:
        return None
    (out,) = where.users
    if (
        softmax.target != EDGE._softmax.default
        or softmax.args[2]
        or zeros.target != EDGE.full_like.default
        or zeros.args[1:] != (0,)
        or zeros.args[0] is not softmax
        or out.target != EDGE.bmm.default
        or out.args[0] is not where
    ):
        return None
    scores = softmax.args[0]
    val = scores.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.dtype != torch.float32 or val.dim() < 3:
        return None
    if softmax.args[1] not in (-1, val.dim() - 1):
        return None
    if _guarded_scores(condition, softmax.args[1]) is not scores:
        return None
    if set(softmax.users) != {where, zeros} or len(scores.users) != 2:
        return None
    matmul, mask = scores, None
    if scores.target == EDGE.add.Tensor and not scores.kwargs:
        matmul, mask = scores.args
        if not (isinstance(matmul, torch.fx.Node) and matmul.target == EDGE.bmm.default):
            mask, matmul = matmul, mask
        if not _is_mask(mask, val) or len(matmul.users) != 1:
            return None
    if not isinstance(matmul, torch.fx.Node) or matmul.target != EDGE.bmm.default:
        return None
    query, key_t = matmul.args
    value = out.args[1]
    shapes = [n.meta["val"].shape for n in (query, key_t, value)]
    if any(len(shape) != val.dim() for shape in shapes) or not all(
        same_shape(shape[:-2], val.shape[:-2]) for shape in shapes
    ):
        return None  # OpenVINO's kernel broadcasts no batch dim the MatMuls did
    return query, key_t, value, mask, out


def _untransposed_key(key_t: torch.fx.Node) -> tuple[torch.fx.Node | None, float]:
    """The key under ``key_t`` = ``mul(permute(key, last two swapped), s)`` (or the permute of
    the product) and ``s``; ``(None, 1.0)`` when ``key_t`` is not built so.

    Handing OpenVINO that key and ``s`` as the attention's scale spares it transposing and
    scaling the whole key on every call, twice (a transpose back comes otherwise): with a KV cache,
    the cache, whatever its filled length.
    """
    rank = key_t.meta["val"].dim()
    scale, node = 1.0, key_t
    if _scalar_product(node):
        scale, node = float(node.args[1]), node.args[0]
    if not (
        isinstance(node, torch.fx.Node)
        and node.target == EDGE.permute_copy.default
        and _swaps_last_two(node.args[1], rank)
    ):
        return None, 1.0
    node = node.args[0]
    if scale == 1.0 and _scalar_product(node):
        scale, node = float(node.args[1]), node.args[0]
    return (node, scale) if isinstance(node, torch.fx.Node) else (None, 1.0)


def _scalar_product(node: object) -> bool:
    """``node`` is ``mul(x, s)`` with ``s`` a number."""
    return (
        isinstance(node, torch.fx.Node)
        and node.target == EDGE.mul.Scalar
        and isinstance(node.args[1], (int, float))
        and not isinstance(node.args[1], bool)
        and not node.kwargs
    )


def _swaps_last_two(dims: object, rank: int) -> bool:
    return isinstance(dims, (list, tuple)) and [d % rank for d in dims] == [*range(rank - 2), rank - 1, rank - 2]


def _guarded_scores(condition: torch.fx.Node, dim: int) -> torch.fx.Node | None:
    """``x`` if ``condition`` is ``not(any(not(x == -inf), dim, keepdim))``: all of a row ``-inf``."""
    chain = [EDGE.logical_not.default, EDGE.any.dim, EDGE.logical_not.default, EDGE.eq.Scalar]
    node = condition
    for target in chain:
        if not isinstance(node, torch.fx.Node) or node.target != target or len(node.users) != 1:
            return None
        if target == EDGE.any.dim and (node.args[1] != dim or node.args[2:] != (True,)):
            return None
        if target == EDGE.eq.Scalar:
            return node.args[0] if node.args[1] == -math.inf else None
        node = node.args[0]
    return None


def _is_mask(mask: object, scores: torch.Tensor) -> bool:
    """An additive float mask that broadcasts to the scores without growing them."""
    val = mask.meta.get("val") if isinstance(mask, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dtype != scores.dtype or not 1 <= val.dim() <= scores.dim():
        return False
    try:
        return same_shape(tuple(torch.broadcast_shapes(val.shape, scores.shape)), tuple(scores.shape))
    except RuntimeError:
        return False


def _node(
    graph: torch.fx.Graph,
    target: object,
    args: tuple,
    *,
    like: torch.fx.Node,
    sizes: list[int] | None = None,
    keepdim: bool = False,
    dtype: torch.dtype | None = None,
) -> torch.fx.Node:
    """A new node whose ``meta["val"]`` is ``like``'s value (its dims picked by ``sizes``, a
    trailing 1 if ``keepdim``, in ``dtype``), made without evaluating ``target``."""
    node = graph.call_function(target, args)
    val = like.meta["val"]
    shape = [val.shape[i] for i in sizes] if sizes is not None else list(val.shape)
    if sizes is None and dtype is None and not keepdim:
        node.meta["val"] = val
        return node
    node.meta["val"] = val.new_empty([*shape, 1] if keepdim else shape, dtype=dtype or val.dtype)
    return node
