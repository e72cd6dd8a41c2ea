"""Splits of a tensor with dynamic dims, as the slices they are.

``x.chunk(2, -1)`` of a ``[2*s, 256]`` tensor (a mixture-of-experts layer's
gate and up projections, for a prompt of any length) becomes ExecuTorch's
``split_with_sizes_copy``, whose meta kernel turns the symbolic dim into a
Python int: ExecuTorch's IR check then pins the prompt length to the
example's (the program takes only that length). A slice per piece computes
the same tensors and keeps the dims symbolic. Only splits along a dim of
known size, of a tensor with some dynamic dim, are rewritten.
"""

from __future__ import annotations

import logging
import operator

import torch
from torch.export import ExportedProgram

from openvino_backend.transform import copied

logger = logging.getLogger(__name__)

_aten = torch.ops.aten
_SPLITS = (_aten.split.Tensor, _aten.split_with_sizes.default, _aten.chunk.default)


def splits_as_slices(program: ExportedProgram) -> ExportedProgram:
    """A copy of ``program`` with such splits written as slices (``program`` itself when it has none)."""
    if not any(_pieces(node) is not None for node in program.graph.nodes):
        return program
    program = copied(program)
    graph = program.graph
    for node in list(graph.nodes):
        pieces = _pieces(node)
        if pieces is None:
            continue
        source, dim = node.args[0], _dim(node)
        for user in list(node.users):
            start, end = pieces[user.args[1]]
            with graph.inserting_before(user):
                piece = graph.call_function(_aten.slice.Tensor, (source, dim, start, end))
            piece.meta.update(user.meta)
            piece.meta["val"] = source.meta["val"].narrow(dim, start, end - start)
            user.replace_all_uses_with(piece)
            graph.erase_node(user)
        graph.erase_node(node)
    program.graph_module.recompile()
    logger.debug("splits of tensors with dynamic dims written as slices")
    return program


def _dim(node: torch.fx.Node) -> int:
    given = dict(zip(("self", "split", "dim"), node.args, strict=False)) | dict(node.kwargs)
    return given.get("dim", 0) % node.args[0].meta["val"].dim()


def _pieces(node: torch.fx.Node) -> list[tuple[int, int]] | None:
    """The (start, end) of each piece, if ``node`` is a split to rewrite."""
    if node.op != "call_function" or node.target not in _SPLITS or len(node.args) < 2:
        return None
    source = node.args[0]
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() == 0 or all(isinstance(d, int) for d in val.shape):
        return None
    size = val.shape[_dim(node)]
    if not isinstance(size, int) or not all(u.target is operator.getitem for u in node.users):
        return None
    split = node.args[1]
    if node.target is _aten.chunk.default:
        if not isinstance(split, int) or split < 1:
            return None
        step = -(-size // split)
        lengths = [min(step, size - start) for start in range(0, size, step)] if size else []
    elif isinstance(split, int):
        lengths = [min(split, size - start) for start in range(0, size, split)] if split > 0 else []
    elif isinstance(split, (list, tuple)) and all(isinstance(s, int) for s in split):
        lengths = list(split)
    else:
        return None
    if sum(lengths) != size:
        return None
    starts = [sum(lengths[:i]) for i in range(len(lengths))]
    return [(start, start + length) for start, length in zip(starts, lengths, strict=True)]
