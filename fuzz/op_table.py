"""The ops the fuzzer composes: each with the values it accepts, the value it gives, and its source.

Identity-like ops (copies, views, casts that keep the dtype) exercise the
stale-memory defences; compute and arithmetic ops exercise the numerical one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

DTYPES = ("float32", "float16", "int64", "int8", "bool")
# PT2E's quantize / dequantize, on a grid bf16 holds exactly (so OpenVINO's reduced precision never
# moves a value across a quantization level: any difference is a real one).
QUANT_ARGS = "0.25, 0, -128, 127, torch.int8"
DYNAMIC_RANGE = (2, 6)


@dataclass(frozen=True)
class Value:
    shape: tuple[int, ...]
    dtype: str
    on_grid: bool = False  # a float exactly on the quantization grid (a dequantize's result)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numeric(self) -> bool:
        return self.dtype != "bool"

    @property
    def floating(self) -> bool:
        return self.dtype.startswith("float")


@dataclass(frozen=True)
class Op:
    """One op the generator may apply: where it applies, what it makes, how it reads."""

    name: str
    arity: int
    applies: Callable[[tuple[Value, ...], bool], bool]
    template: Callable[[tuple[str, ...], tuple[Value, ...], int], str]
    # Same shape and dtype as the first argument, off the quantization grid unless an identity.
    result: Callable[[tuple[Value, ...], int], Value] = lambda vals, p: Value(vals[0].shape, vals[0].dtype)
    identity: bool = False
    terms: Callable[[tuple[Value, ...], int], int] = lambda vals, p: 1


def result_of(op: Op, args: tuple[Value, ...], param: int) -> Value:
    """What ``op`` makes of ``args``: an identity-like op returns its argument's value, grid and all."""
    return args[0] if op.identity else op.result(args, param)


def _any(vals: tuple[Value, ...], dim_order: bool) -> bool:
    return True


def _ranked(minimum: int) -> Callable[[tuple[Value, ...], bool], bool]:
    return lambda vals, dim_order: vals[0].rank >= minimum


def _numeric(vals: tuple[Value, ...], dim_order: bool) -> bool:
    return vals[0].numeric


def _floating(vals: tuple[Value, ...], dim_order: bool) -> bool:
    return vals[0].floating


def _channels_last_ok(vals: tuple[Value, ...], dim_order: bool) -> bool:
    # ExecuTorch runs channels-last only with dim order on.
    return dim_order and vals[0].rank == 4


def _reducible(vals: tuple[Value, ...], dim_order: bool) -> bool:
    return vals[0].rank >= 1 and vals[0].numeric


def _binary(vals: tuple[Value, ...], dim_order: bool) -> bool:
    a, b = vals
    if a.dtype != b.dtype or not a.numeric:
        return False
    try:
        torch.broadcast_shapes(a.shape, b.shape)
    except RuntimeError:
        return False
    return True


def _broadcast(vals: tuple[Value, ...], p: int) -> Value:
    return Value(tuple(torch.broadcast_shapes(vals[0].shape, vals[1].shape)), vals[0].dtype)


def _dim(vals: tuple[Value, ...], p: int) -> int:
    return p % vals[0].rank


def _reduced(vals: tuple[Value, ...], p: int) -> Value:
    shape = list(vals[0].shape)
    shape[_dim(vals, p)] = 1
    return Value(tuple(shape), vals[0].dtype)


def _sum_dtype(dtype: str) -> str:
    """torch sums small integers in int64."""
    return "int64" if dtype in ("int8", "bool") else dtype


def _summed(vals: tuple[Value, ...], p: int) -> Value:
    return Value(_reduced(vals, p).shape, _sum_dtype(vals[0].dtype))


IDENTITY_OPS = (
    Op("clone", 1, _any, lambda a, v, p: f"{a[0]}.clone()", identity=True),
    Op("detach", 1, _any, lambda a, v, p: f"{a[0]}.detach()", identity=True),
    Op("slice_all", 1, _ranked(1), lambda a, v, p: f"{a[0]}[:]", identity=True),
    Op("slice_all_2d", 1, _ranked(2), lambda a, v, p: f"{a[0]}[:, :]", identity=True),
    Op("view_same", 1, _any, lambda a, v, p: f"{a[0]}.view({a[0]}.shape)", identity=True),
    Op("reshape_same", 1, _any, lambda a, v, p: f"{a[0]}.reshape({a[0]}.shape)", identity=True),
    Op("permute_identity", 1, _ranked(1), lambda a, v, p: f"{a[0]}.permute({tuple(range(v[0].rank))})", identity=True),
    Op("transpose_twice", 1, _ranked(2), lambda a, v, p: f"{a[0]}.transpose(0, -1).transpose(0, -1)", identity=True),
    Op("to_same_dtype", 1, _any, lambda a, v, p: f"{a[0]}.to(torch.{v[0].dtype})", identity=True),
    Op("contiguous", 1, _any, lambda a, v, p: f"{a[0]}.contiguous()", identity=True),
    Op("expand_same", 1, _ranked(1), lambda a, v, p: f"{a[0]}.expand({a[0]}.shape)", identity=True),
    Op("cat_one", 1, _ranked(1), lambda a, v, p: f"torch.cat([{a[0]}])", identity=True),
    Op("unsqueeze_squeeze", 1, _any, lambda a, v, p: f"{a[0]}.unsqueeze(0).squeeze(0)", identity=True),
    Op("narrow_full", 1, _ranked(1), lambda a, v, p: f"{a[0]}.narrow(0, 0, {a[0]}.shape[0])", identity=True),
    Op("mul_one", 1, _numeric, lambda a, v, p: f"{a[0]} * 1", identity=True),
    Op("add_zero", 1, _numeric, lambda a, v, p: f"{a[0]} + 0", identity=True),
    Op(
        "clone_channels_last",
        1,
        _channels_last_ok,
        lambda a, v, p: f"{a[0]}.clone(memory_format=torch.channels_last)",
        identity=True,
    ),
    Op(
        "to_channels_last",
        1,
        _channels_last_ok,
        lambda a, v, p: f"{a[0]}.to(memory_format=torch.channels_last)",
        identity=True,
    ),
)

COMPUTE_OPS = (
    Op("sin", 1, _floating, lambda a, v, p: f"torch.sin({a[0]})"),
    Op("relu", 1, _floating, lambda a, v, p: f"torch.relu({a[0]})"),
    Op("neg", 1, _numeric, lambda a, v, p: f"-{a[0]}"),
    Op("abs", 1, _numeric, lambda a, v, p: f"torch.abs({a[0]})"),
    Op("logical_not", 1, lambda v, d: v[0].dtype == "bool", lambda a, v, p: f"torch.logical_not({a[0]})"),
    Op(
        "sum_keepdim",
        1,
        _reducible,
        lambda a, v, p: f"{a[0]}.sum(dim={_dim(v, p)}, keepdim=True)",
        _summed,
        terms=lambda v, p: v[0].shape[_dim(v, p)],
    ),
    Op(
        "mean_keepdim",
        1,
        lambda v, d: v[0].rank >= 1 and v[0].floating,
        lambda a, v, p: f"{a[0]}.mean(dim={_dim(v, p)}, keepdim=True)",
        _reduced,
    ),
    Op("amax_keepdim", 1, _reducible, lambda a, v, p: f"{a[0]}.amax(dim={_dim(v, p)}, keepdim=True)", _reduced),
    Op("add", 2, _binary, lambda a, v, p: f"{a[0]} + {a[1]}", _broadcast),
    Op("mul", 2, _binary, lambda a, v, p: f"{a[0]} * {a[1]}", _broadcast),
    Op(
        "dequantize",
        1,
        lambda v, d: v[0].dtype == "int8",
        lambda a, v, p: f"torch.ops.quantized_decomposed.dequantize_per_tensor({a[0]}, {QUANT_ARGS})",
        lambda v, p: Value(v[0].shape, "float32", on_grid=True),
    ),
    Op(
        "quantize",
        1,
        lambda v, d: v[0].on_grid,
        lambda a, v, p: f"torch.ops.quantized_decomposed.quantize_per_tensor({a[0]}, {QUANT_ARGS})",
        lambda v, p: Value(v[0].shape, "int8"),
    ),
)


def _float_rank(minimum: int) -> Callable[[tuple[Value, ...], bool], bool]:
    return lambda vals, dim_order: vals[0].floating and vals[0].rank >= minimum


def _int(vals: tuple[Value, ...], dim_order: bool) -> bool:
    return vals[0].dtype == "int64"


def _image(vals: tuple[Value, ...], dim_order: bool) -> bool:
    """A float NCHW tensor whose spatial dims a 2x2 window fits."""
    return vals[0].floating and vals[0].rank == 4 and min(vals[0].shape[2:]) >= 2


def _same(vals: tuple[Value, ...], dim_order: bool) -> bool:
    return vals[0] == vals[1] and vals[0].floating and vals[0].rank >= 2


def _as(dtype: str) -> Callable[[tuple[Value, ...], int], Value]:
    return lambda vals, p: Value(vals[0].shape, dtype)


def _shape(fn: Callable[[tuple[int, ...], int], tuple[int, ...]]) -> Callable[[tuple[Value, ...], int], Value]:
    return lambda vals, p: Value(tuple(fn(vals[0].shape, p)), vals[0].dtype)


def _pooled(shape: tuple[int, ...], p: int) -> tuple[int, ...]:
    return (*shape[:2], shape[2] // 2, shape[3] // 2)


def _cat(shape: tuple[int, ...], p: int) -> tuple[int, ...]:
    dim = p % len(shape)
    return tuple(2 * d if i == dim else d for i, d in enumerate(shape))


def _last(vals: tuple[Value, ...]) -> int:
    return vals[0].shape[-1]


# Compute ops for the compute-graph property: the kinds of op OpenVINO claims (elementwise,
# reductions, shape ops, pooling, interpolation, padding, normalization, index arithmetic,
# integer ops). Continuous in their float inputs where rounding could flip a result (no floor
# of a computed float): the property compares through OpenVINO's reduced precision.
ARITH_OPS = (
    Op("exp", 1, _floating, lambda a, v, p: f"torch.exp({a[0]}.clamp(-4, 4))"),
    Op("tanh", 1, _floating, lambda a, v, p: f"torch.tanh({a[0]})"),
    Op("sigmoid", 1, _floating, lambda a, v, p: f"torch.sigmoid({a[0]})"),
    Op("sqrt_abs", 1, _floating, lambda a, v, p: f"torch.sqrt({a[0]}.abs() + 0.5)"),
    Op("gelu", 1, _floating, lambda a, v, p: f"torch.nn.functional.gelu({a[0]})"),
    Op("clamp", 1, _numeric, lambda a, v, p: f"{a[0]}.clamp(-2, 2)"),
    Op("where_positive", 1, _floating, lambda a, v, p: f"torch.where({a[0]} > 0, {a[0]}, {a[0]} * 0.1)"),
    Op("softmax", 1, _float_rank(1), lambda a, v, p: f"torch.softmax({a[0]}, dim={_dim(v, p)})"),
    Op("log_softmax", 1, _float_rank(1), lambda a, v, p: f"torch.log_softmax({a[0]}, dim=-1)"),
    Op(
        "cumsum",
        1,
        _reducible,
        lambda a, v, p: f"torch.cumsum({a[0]}, dim={_dim(v, p)})",
        lambda v, p: Value(v[0].shape, _sum_dtype(v[0].dtype)),
        terms=lambda v, p: v[0].shape[_dim(v, p)],
    ),
    Op(
        "var_keepdim",
        1,
        _float_rank(1),
        lambda a, v, p: f"{a[0]}.var(dim=-1, keepdim=True, correction=0)",
        _shape(lambda s, p: (*s[:-1], 1)),
        terms=lambda v, p: _last(v),
    ),
    Op(
        "layer_norm",
        1,
        _float_rank(1),
        lambda a, v, p: f"torch.nn.functional.layer_norm({a[0]}, {a[0]}.shape[-1:])",
        terms=lambda v, p: _last(v),
    ),
    Op("normalize", 1, _float_rank(1), lambda a, v, p: f"torch.nn.functional.normalize({a[0]}, dim=-1)"),
    Op(
        "matmul_self",
        2,
        _same,
        lambda a, v, p: f"{a[0]} @ {a[1]}.transpose(-1, -2)",
        _shape(lambda s, p: (*s[:-1], s[-2])),
        terms=lambda v, p: _last(v),
    ),
    Op(
        "permute_reverse",
        1,
        _ranked(2),
        lambda a, v, p: f"{a[0]}.permute({tuple(reversed(range(v[0].rank)))})",
        _shape(lambda s, p: tuple(reversed(s))),
    ),
    Op(
        "flatten",
        1,
        _ranked(2),
        lambda a, v, p: f"{a[0]}.flatten(1)",
        _shape(lambda s, p: (s[0], int(torch.tensor(s[1:]).prod()))),
    ),
    Op("flip", 1, _ranked(1), lambda a, v, p: f"{a[0]}.flip(-1)"),
    Op("cat_self", 1, _reducible, lambda a, v, p: f"torch.cat([{a[0]}, {a[0]} * 2], dim={_dim(v, p)})", _shape(_cat)),
    Op(
        "repeat",
        1,
        _ranked(1),
        lambda a, v, p: f"{a[0]}.repeat({(1,) * (v[0].rank - 1) + (2,)})",
        _shape(lambda s, p: (*s[:-1], 2 * s[-1])),
    ),
    Op(
        "pad_constant",
        1,
        _float_rank(1),
        lambda a, v, p: f"torch.nn.functional.pad({a[0]}, (1, 2), value=0.5)",
        _shape(lambda s, p: (*s[:-1], s[-1] + 3)),
    ),
    Op(
        "pad_reflect",
        1,
        lambda v, d: v[0].floating and v[0].rank in (2, 3) and v[0].shape[-1] >= 2,
        lambda a, v, p: f"torch.nn.functional.pad({a[0]}, (1, 1), mode='reflect')",
        _shape(lambda s, p: (*s[:-1], s[-1] + 2)),
    ),
    Op("max_pool2d", 1, _image, lambda a, v, p: f"torch.nn.functional.max_pool2d({a[0]}, 2)", _shape(_pooled)),
    Op("avg_pool2d", 1, _image, lambda a, v, p: f"torch.nn.functional.avg_pool2d({a[0]}, 2)", _shape(_pooled)),
    Op(
        "adaptive_avg_pool2d",
        1,
        _image,
        lambda a, v, p: f"torch.nn.functional.adaptive_avg_pool2d({a[0]}, 1)",
        _shape(lambda s, p: (*s[:2], 1, 1)),
    ),
    Op(
        "upsample_nearest",
        1,
        _float_rank(4),
        lambda a, v, p: f"torch.nn.functional.interpolate({a[0]}, scale_factor=2, mode='nearest')",
        _shape(lambda s, p: (*s[:2], 2 * s[2], 2 * s[3])),
    ),
    Op(
        "upsample_bilinear",
        1,
        _float_rank(4),
        lambda a, v, p: f"torch.nn.functional.interpolate({a[0]}, scale_factor=2, mode='bilinear')",
        _shape(lambda s, p: (*s[:2], 2 * s[2], 2 * s[3])),
    ),
    Op(
        "add_arange",
        1,
        lambda v, d: v[0].numeric and v[0].rank >= 1,
        lambda a, v, p: f"{a[0]} + torch.arange({a[0]}.shape[-1]).to({a[0]}.dtype)",
    ),
    Op(
        "add_abs_range",
        1,
        lambda v, d: v[0].numeric and v[0].rank >= 1,
        lambda a, v, p: f"{a[0]} - torch.arange(-{p}, {a[0]}.shape[-1] - {p}).abs().to({a[0]}.dtype)",
    ),
    Op(
        "index_select_rolled",
        1,
        _ranked(1),
        lambda a, v, p: f"{a[0]}.index_select(-1, (torch.arange({a[0]}.shape[-1]) + {p + 1}) % {a[0]}.shape[-1])",
    ),
    Op(
        "gather_argmax",
        1,
        lambda v, d: v[0].floating and v[0].rank >= 1,
        lambda a, v, p: f"{a[0]}.gather(-1, {a[0]}.argmax(-1, keepdim=True))",
        _shape(lambda s, p: (*s[:-1], 1)),
    ),
    Op("floor_divide", 1, _int, lambda a, v, p: f"torch.floor_divide({a[0]}, {p + 2})"),
    Op("remainder", 1, _int, lambda a, v, p: f"torch.remainder({a[0]}, {p + 2})"),
    Op("int_mul_add", 1, _int, lambda a, v, p: f"{a[0]} * {p + 3} - 7"),
    Op("to_float", 1, lambda v, d: not v[0].floating, lambda a, v, p: f"{a[0]}.to(torch.float32)", _as("float32")),
    Op("gt_zero", 1, _numeric, lambda a, v, p: f"{a[0]} > 0", _as("bool")),
    Op("sub", 2, _binary, lambda a, v, p: f"{a[0]} - {a[1]}", _broadcast),
    Op("maximum", 2, _binary, lambda a, v, p: f"torch.maximum({a[0]}, {a[1]})", _broadcast),
)

OPS = {op.name: op for op in IDENTITY_OPS + COMPUTE_OPS + ARITH_OPS}
