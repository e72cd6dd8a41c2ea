"""Which FX nodes OpenVINO can take, one decision per node.

The table of supported ops is OpenVINO's own (the one its ``torch.compile``
backend uses), so this backend never claims an op OpenVINO cannot convert and
never lags behind one it can. Partition-edge rules live in ``boundary.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from functools import lru_cache

import torch
from openvino.frontend.pytorch.torchdynamo.op_support import OperatorSupport
from torch.fx.passes.operator_support import OperatorSupportBase

from openvino_backend.diagnostics import op_name
from openvino_backend.dynamic import PAD_OP, is_bound_pad, restores_size

logger = logging.getLogger(__name__)

# Ops OpenVINO's table does not list but this backend handles: preprocess
# rewrites the dim-order ops to their aten forms before conversion.
EXTRA_SUPPORTED_OPS = frozenset(
    {
        "dim_order_ops._clone_dim_order.default",
        "dim_order_ops._to_dim_order_copy.default",
        # The FX frontend translates these (reflect Pad) though the Python table omits them.
        "aten.reflection_pad1d.default",
        "aten.reflection_pad2d.default",
        "aten.reflection_pad3d.default",
        # Translated by the FX frontend (LogicalAnd/Or/Xor) though the table omits them; a
        # causal mask is built with logical_and.
        "aten.logical_and.default",
        "aten.logical_or.default",
        "aten.logical_xor.default",
        # convert.py turns it into an OpenVINO Pad; it has no CPU kernel, so it is always delegated.
        PAD_OP,
    }
)

# Kept whole during to_edge so OpenVINO sees the op it has a translator for
# (the list of ExecuTorch 1.5.1's OpenVINO partitioner), plus reflection
# padding: decomposed, it becomes arange/abs/index arithmetic that OpenVINO
# 2026.4.1 computes wrongly; whole, it maps to OpenVINO's own reflect Pad.
OPS_TO_NOT_DECOMPOSE: tuple[torch._ops.OpOverload, ...] = (
    torch.ops.aten.pixel_shuffle.default,
    torch.ops.aten.upsample_bilinear2d.default,
    torch.ops.aten.upsample_bilinear2d.vec,
    torch.ops.aten.upsample_nearest2d.default,
    torch.ops.aten.upsample_nearest2d.vec,
    torch.ops.aten.stack.default,
    torch.ops.aten.reflection_pad1d.default,
    torch.ops.aten.reflection_pad2d.default,
    torch.ops.aten.reflection_pad3d.default,
)


@lru_cache(maxsize=1)
def openvino_supported_ops() -> frozenset[str]:
    """Qualified names (``aten.add.Tensor``) of the ops OpenVINO converts."""
    table = OperatorSupport([])._support_dict
    prefix = "torch.ops."
    return frozenset(name.removeprefix(prefix) for name in table) | EXTRA_SUPPORTED_OPS


# Ops OpenVINO converts but computes differently from PyTorch (measured against
# eager with OpenVINO 2026.4.1; ExecuTorch's backend suite finds both). Each
# check returns why a node must stay on the CPU, or None.
def _avg_pool_ceil_overhang(node: torch.fx.Node) -> str | None:
    """PyTorch shrinks the divisor of a last ceil-mode window that overhangs the padded input; OpenVINO does not."""
    args = list(node.args) + [None] * 7
    x, kernel, stride, padding, ceil_mode = args[0], args[1], args[2] or args[1], args[3] or 0, args[4]
    if not ceil_mode or not isinstance(x, torch.fx.Node) or "val" not in x.meta:
        return None
    spatial = x.meta["val"].shape[-len(kernel) :]
    pads = padding if isinstance(padding, (list, tuple)) else [padding] * len(kernel)
    pads = list(pads) * len(kernel) if len(pads) == 1 else pads
    for size, k, s, p in zip(spatial, kernel, stride, pads, strict=True):
        out = -(-(size + 2 * p - k) // s) + 1
        if (out - 1) * s >= size + p:
            out -= 1
        if (out - 1) * s - p + k > size + p:
            return "a ceil-mode window overhangs the padded input; OpenVINO averages it differently from PyTorch"
    return None


WRONG_RESULTS: dict[str, Callable[[torch.fx.Node], str | None]] = {
    "aten.avg_pool2d.default": _avg_pool_ceil_overhang,
    "aten.avg_pool3d.default": _avg_pool_ceil_overhang,
}


class OpenvinoOperatorSupport(OperatorSupportBase):
    """Answers "may this node go to OpenVINO?", recording every "no" and its reason.

    ``excluded`` holds nodes the partition-edge rules have already kept out,
    with their reasons; they are refused here so the partitioner can propose
    partitions again without them. ``rejected`` collects every refusal of
    this instance, for the partitioner to report once it has settled.
    ``candidates``, when given, limits a proposal round to those nodes.
    """

    def __init__(
        self,
        op_types_to_skip: Collection[str] = (),
        op_names_to_skip: Collection[str] = (),
        excluded: Mapping[torch.fx.Node, str] | None = None,
        candidates: Collection[torch.fx.Node] | None = None,
    ) -> None:
        self.rejected: dict[torch.fx.Node, str] = {}
        self._op_types_to_skip = frozenset(op_types_to_skip)
        self._op_names_to_skip = frozenset(op_names_to_skip)
        self._excluded = excluded or {}
        self._candidates = candidates

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
        if self._candidates is not None and node not in self._candidates:
            return False  # not proposed this round (kept in, or out, as the last round decided)
        reason = self.rejection(node)
        if reason is None:
            return True
        self.rejected[node] = reason
        return False

    def rejection(self, node: torch.fx.Node) -> str | None:
        """Why ``node`` may not be delegated, or None when it may."""
        op = op_name(node)
        if node in self._excluded:
            return self._excluded[node]
        if is_bound_pad(node):
            return None
        if restores_size(node):
            return "cuts a padded OpenVINO output back to its run-time size; runs on the CPU, whose kernel resizes"
        if op in self._op_types_to_skip or node.name in self._op_names_to_skip:
            return "skipped by the partitioner's op_types_to_skip / op_names_to_skip"
        if op == "getitem":
            return None
        if isinstance(node.meta.get("val"), (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            # A delegate returns tensors; ExecuTorch evaluates size arithmetic on the CPU at run time.
            return "computes a size (a scalar, not a tensor), which ExecuTorch evaluates on the CPU"
        if op not in openvino_supported_ops():
            return f"OpenVINO's PyTorch frontend has no conversion for {op}"
        if op in WRONG_RESULTS:
            return WRONG_RESULTS[op](node)
        return None
