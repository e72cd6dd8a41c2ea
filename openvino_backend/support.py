"""Which FX nodes OpenVINO can take, one decision per node.

The table of supported ops is OpenVINO's own (the one its ``torch.compile``
backend uses), so this backend never claims an op OpenVINO cannot convert and
never lags behind one it can. Partition-edge rules live in ``boundary.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Mapping
from functools import lru_cache

import torch
from openvino.frontend.pytorch.torchdynamo.op_support import OperatorSupport
from torch.fx.passes.operator_support import OperatorSupportBase

from openvino_backend.diagnostics import op_name

logger = logging.getLogger(__name__)

# Ops OpenVINO's table does not list but this backend handles: preprocess
# rewrites the dim-order ops to their aten forms before conversion.
EXTRA_SUPPORTED_OPS = frozenset(
    {
        "dim_order_ops._clone_dim_order.default",
        "dim_order_ops._to_dim_order_copy.default",
    }
)

# Kept whole during to_edge so OpenVINO sees the op it has a translator for
# (the same list as ExecuTorch 1.5.1's OpenVINO partitioner).
OPS_TO_NOT_DECOMPOSE: tuple[torch._ops.OpOverload, ...] = (
    torch.ops.aten.pixel_shuffle.default,
    torch.ops.aten.upsample_bilinear2d.default,
    torch.ops.aten.upsample_bilinear2d.vec,
    torch.ops.aten.upsample_nearest2d.default,
    torch.ops.aten.upsample_nearest2d.vec,
    torch.ops.aten.stack.default,
)


@lru_cache(maxsize=1)
def openvino_supported_ops() -> frozenset[str]:
    """Qualified names (``aten.add.Tensor``) of the ops OpenVINO converts."""
    table = OperatorSupport([])._support_dict
    prefix = "torch.ops."
    return frozenset(name.removeprefix(prefix) for name in table) | EXTRA_SUPPORTED_OPS


class OpenvinoOperatorSupport(OperatorSupportBase):
    """Answers "may this node go to OpenVINO?", recording every "no" and its reason.

    ``excluded`` holds nodes the partition-edge rules have already kept out,
    with their reasons; they are refused here so the partitioner can propose
    partitions again without them. ``rejected`` collects every refusal of
    this instance, for the partitioner to report once it has settled.
    """

    def __init__(
        self,
        op_types_to_skip: Collection[str] = (),
        op_names_to_skip: Collection[str] = (),
        excluded: Mapping[torch.fx.Node, str] | None = None,
    ) -> None:
        self.rejected: dict[torch.fx.Node, str] = {}
        self._op_types_to_skip = frozenset(op_types_to_skip)
        self._op_names_to_skip = frozenset(op_names_to_skip)
        self._excluded = excluded or {}

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        if node.op != "call_function":
            return False
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
        if op in self._op_types_to_skip or node.name in self._op_names_to_skip:
            return "skipped by the partitioner's op_types_to_skip / op_names_to_skip"
        if op == "getitem":
            return None
        if op not in openvino_supported_ops():
            return f"OpenVINO's PyTorch frontend has no conversion for {op}"
        return None
