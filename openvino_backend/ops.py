"""Everything this backend knows about particular ops, one entry per op family.

Each stage asks here instead of keeping its own list: the op-support check
(``convertible``, ``computes_differently``), ``ops_to_not_decompose``
(``keep_whole``), the copy rule (``copy``), the CPU-kernel check
(``changes_layout``), the numerical check's sample inputs (``index``), the
quantization-aware comparison (``quantize_range``) and constant folding
(``fold``). Adding what is known about an op is adding one ``OpFacts``.

What OpenVINO converts in general is OpenVINO's own table
(``openvino_supported_ops``); the entries here are only the exceptions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cache
from typing import Literal

import torch
from executorch.exir.operator.util import _QUANT_PRIMITIVES

from openvino_backend.graph import dtype_of, op_name

# This package's own op (``transform/dynamic.py``): a dynamic output padded to its upper bound.
PAD_OP = "openvino_backend.pad_to_bound.default"


@dataclass(frozen=True)
class OpFacts:
    """What is known about a family of ops (qualified names: ``aten.clone.default``)."""

    names: tuple[str, ...]
    # OpenVINO's PyTorch frontend converts them, though its op-support table does not list them.
    convertible: bool = False
    # Kept whole during to_edge (``ops_to_not_decompose``) so OpenVINO sees the op it translates.
    keep_whole: bool = False
    # OpenVINO converts them to nothing: always, or when they keep the dtype (else a Convert).
    copy: Literal["always", "same_dtype"] | None = None
    # Their job is to change the dim order: ExecuTorch's kernels for them take any pair of orders.
    changes_layout: bool = False
    # Positions of the indexed tensor, of the dim (None: 0) and of the index among the arguments.
    index: tuple[int, int | None, int] | None = None
    # A PT2E quantize: positions of quant_min and quant_max among the arguments.
    quantize_range: tuple[int, int] | None = None
    # Constant folding may compute them (else they reach OpenVINO as they are).
    fold: bool = True
    # Why OpenVINO computes this node differently from PyTorch, or None (measured against eager).
    computes_differently: Callable[[torch.fx.Node], str | None] | None = None


def pool_windows(node: torch.fx.Node) -> list[tuple[int, int, int, int, int]] | None:
    """Per spatial dim of an ``avg_pool`` node: (input size, kernel, stride, padding, output size) as
    PyTorch computes them (sizes may be symbolic); None when the input's shape is not known."""
    args = list(node.args) + [None] * 7
    x, kernel, stride, padding, ceil_mode = args[0], args[1], args[2] or args[1], args[3] or 0, args[4]
    if not isinstance(x, torch.fx.Node) or "val" not in x.meta:
        return None
    spatial = x.meta["val"].shape[-len(kernel) :]
    pads = padding if isinstance(padding, (list, tuple)) else [padding] * len(kernel)
    pads = list(pads) * len(kernel) if len(pads) == 1 else pads
    windows = []
    for size, k, s, p in zip(spatial, kernel, stride, pads, strict=True):
        if ceil_mode:
            out = -(-(size + 2 * p - k) // s) + 1
            if (out - 1) * s >= size + p:
                out -= 1
        else:
            out = (size + 2 * p - k) // s + 1
        windows.append((size, k, s, p, out))
    return windows


def whole_input_kernel(node: torch.fx.Node) -> list[int] | None:
    """The kernel that computes this ceil-mode ``avg_pool`` the same way in OpenVINO, when its only
    overhanging windows are single windows larger than the padded input (a "global" pool written as
    a huge kernel): each averages the whole padded input, which a kernel of that size does in
    OpenVINO too. None when there is nothing to clamp, or a window overhangs otherwise."""
    args = list(node.args) + [None] * 7
    if not args[4] or args[6] is not None:  # not ceil mode, or a divisor override
        return None
    windows = pool_windows(node)
    if windows is None or not all(isinstance(size, int) for size, *_ in windows):
        return None  # a dynamic size: its windows are not known until run time
    if all(k <= size + 2 * p for size, k, _, p, _ in windows):
        return None
    if any(out != 1 and (out - 1) * s - p + k > size + p for size, k, s, p, out in windows):
        return None
    return [min(k, size + 2 * p) for size, k, _, p, _ in windows]


def _avg_pool_ceil_overhang(node: torch.fx.Node) -> str | None:
    """PyTorch shrinks the divisor of a last ceil-mode window that overhangs the padded input; OpenVINO does not."""
    args = list(node.args) + [None] * 7
    windows = pool_windows(node)
    if not args[4] or windows is None or whole_input_kernel(node) is not None:
        return None  # lowering/passes/pooling.py clamps a whole-input window's kernel
    if any((out - 1) * s - p + k > size + p for size, k, s, p, out in windows):
        return "a ceil-mode window overhangs the padded input; OpenVINO averages it differently from PyTorch"
    return None


FAMILIES: tuple[OpFacts, ...] = (
    # OpenVINO's FX frontend translates these to nothing (``op::skip_node``).
    OpFacts(
        (
            "aten.clone.default",
            "aten.alias.default",
            "aten.alias_copy.default",
            "aten.detach.default",
            "aten.detach_copy.default",
            "aten.lift_fresh_copy.default",
        ),
        copy="always",
    ),
    # Preprocess rewrites the dim-order ops to their aten forms before conversion.
    OpFacts(("dim_order_ops._clone_dim_order.default",), convertible=True, copy="always", changes_layout=True),
    OpFacts(("dim_order_ops._to_dim_order_copy.default",), convertible=True, copy="same_dtype", changes_layout=True),
    OpFacts(("aten._to_copy.default",), copy="same_dtype", changes_layout=True),
    # ``aten.clone`` is a copy to OpenVINO, and a layout change to ExecuTorch's kernels.
    OpFacts(("aten.clone.default",), changes_layout=True),
    # Kept whole as ExecuTorch 1.5.1's own OpenVINO partitioner keeps them: OpenVINO translates the op.
    OpFacts(
        (
            "aten.pixel_shuffle.default",
            "aten.upsample_bilinear2d.default",
            "aten.upsample_bilinear2d.vec",
            "aten.upsample_nearest2d.default",
            "aten.upsample_nearest2d.vec",
            "aten.stack.default",
        ),
        keep_whole=True,
    ),
    # Decomposed, reflection padding becomes arange/abs/index arithmetic that OpenVINO 2026.4.1
    # computes wrongly; whole, it maps to OpenVINO's reflect Pad, which the FX frontend translates
    # though the table omits it.
    OpFacts(
        ("aten.reflection_pad1d.default", "aten.reflection_pad2d.default", "aten.reflection_pad3d.default"),
        convertible=True,
        keep_whole=True,
    ),
    # Translated by the FX frontend (a MatMul with the weight transposed), though the table omits it
    # (OpenVINO's torch.compile backend decomposes it). Decomposed unless a partitioner is asked to
    # keep it whole (``OpenvinoPartitioner(keep_whole=...)``; ``export-llm`` does).
    OpFacts(("aten.linear.default",), convertible=True),
    # Translated by the FX frontend (LogicalAnd/Or/Xor) though the table omits them; a causal
    # mask is built with logical_and. OpenVINO 2025.4's frontend has a rule for logical_and only:
    # there the conversion check keeps the other two out, by the op names OpenVINO reports.
    OpFacts(("aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default"), convertible=True),
    # NNCF's 4-bit weights are unpacked with it: the FX frontend translates it (though the table
    # omits it) and folds the unpacking into a u4 constant, so the weight stays compressed. Only
    # there: converted alone, 2025.4's and 2026.4's frontends report no rule for it. It is no
    # core ATen op: to_edge needs it in EdgeCompileConfig's _core_aten_ops_exception_list.
    OpFacts(("aten.bitwise_right_shift.Tensor_Scalar",), convertible=True),
    # lowering/convert.py turns it into an OpenVINO Pad; it has no CPU kernel, so it is always delegated.
    OpFacts((PAD_OP,), convertible=True),
    OpFacts(("aten.avg_pool2d.default", "aten.avg_pool3d.default"), computes_differently=_avg_pool_ceil_overhang),
    OpFacts(("aten.embedding.default",), index=(0, None, 1)),
    OpFacts(
        (
            "aten.index_select.default",
            "aten.gather.default",
            "aten.scatter.src",
            "aten.scatter.value",
            "aten.scatter_add.default",
            "aten.scatter_reduce.two",
        ),
        index=(0, 1, 2),
    ),
    OpFacts(
        ("quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_tensor.tensor"),
        quantize_range=(3, 4),
        fold=False,
    ),
    OpFacts(("quantized_decomposed.quantize_per_channel.default",), quantize_range=(4, 5), fold=False),
    # A filled tensor is cheaper to build than to store.
    OpFacts(("aten.full.default",), fold=False),
)


def _merged(families: Iterable[OpFacts]) -> dict[str, OpFacts]:
    """One entry per op name; an op in two families gets the facts of both."""
    merged: dict[str, dict[str, object]] = {}
    defaults = OpFacts(())
    for family in families:
        for name in family.names:
            entry = merged.setdefault(name, {})
            for field in OpFacts.__dataclass_fields__:
                value = getattr(family, field)
                if field != "names" and value != getattr(defaults, field):
                    entry[field] = value
    return {name: OpFacts((name,), **fields) for name, fields in merged.items()}


FACTS: dict[str, OpFacts] = _merged(FAMILIES)
_NONE = OpFacts(())


def facts(op: str | torch.fx.Node) -> OpFacts:
    """What is known about ``op`` (a qualified name or a node); empty facts when nothing is."""
    name = op_name(op) if isinstance(op, torch.fx.Node) else op
    return FACTS.get(name, _NONE)


def _with(predicate: Callable[[OpFacts], object]) -> frozenset[str]:
    return frozenset(name for name, entry in FACTS.items() if predicate(entry))


CONVERTIBLE_BEYOND_TABLE = _with(lambda f: f.convertible)
KEEP_WHOLE = _with(lambda f: f.keep_whole)
COPY_OPS = _with(lambda f: f.copy == "always")
CAST_OPS = _with(lambda f: f.copy == "same_dtype")
LAYOUT_OPS = _with(lambda f: f.changes_layout)


def overload(name: str) -> torch._ops.OpOverload:
    """``aten.stack.default`` as the ``OpOverload`` it names."""
    namespace, op, variant = name.split(".")
    return getattr(getattr(getattr(torch.ops, namespace), op), variant)


def ops_to_keep_whole() -> tuple[torch._ops.OpOverload, ...]:
    return tuple(overload(name) for name in sorted(KEEP_WHOLE))


@cache
def not_folded() -> frozenset[torch._ops.OpOverload]:
    """What constant folding leaves alone: these ops, and every quantization primitive (they must
    reach OpenVINO as a pattern; ExecuTorch's constant propagation skips the same)."""
    return frozenset(overload(name) for name in _with(lambda f: not f.fold)) | frozenset(_QUANT_PRIMITIVES)


@cache
def openvino_supported_ops() -> frozenset[str]:
    """Qualified names (``aten.add.Tensor``) of the ops OpenVINO converts: OpenVINO's own table
    (the one its ``torch.compile`` backend uses), and the ops above it converts beyond that."""
    from openvino.frontend.pytorch.torchdynamo.op_support import OperatorSupport

    table = OperatorSupport([])._support_dict
    return frozenset(name.removeprefix("torch.ops.") for name in table) | CONVERTIBLE_BEYOND_TABLE


def is_copy(node: torch.fx.Node) -> bool:
    """True when OpenVINO would convert ``node`` to its input unchanged."""
    if node.op != "call_function":
        return False
    kind = facts(node).copy
    if kind == "same_dtype":
        source = node.args[0] if node.args else None
        return isinstance(source, torch.fx.Node) and dtype_of(source) == dtype_of(node)
    return kind == "always"


def is_quantize(node: torch.fx.Node) -> bool:
    """A PT2E quantize: its result is the integer tensor a dequantize reads."""
    return node.op == "call_function" and facts(node).quantize_range is not None


def is_bound_pad(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and op_name(node) == PAD_OP
