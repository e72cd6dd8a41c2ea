"""Identity-like graphs as data, the hypothesis strategy that draws them, and their source.

A ``GraphSpec`` is a straight-line program over tensors: inputs, then steps
that each apply one op to earlier values, then outputs chosen from any value.
It renders to Python source, which is both what runs (compiled under a file
name that diagnostics can point at) and the reproduction printed on failure.
"""

from __future__ import annotations

import linecache
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count

import torch
from hypothesis import strategies as st

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


@dataclass(frozen=True)
class Input:
    shape: tuple[int, ...]
    dtype: str
    channels_last: bool = False


@dataclass(frozen=True)
class Step:
    op: str
    args: tuple[int, ...]
    param: int = 0


@dataclass(frozen=True)
class GraphSpec:
    inputs: tuple[Input, ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]
    dim_order: bool = True
    seed: int = 0
    # Exported with dim 0 dynamic (in DYNAMIC_RANGE) for every input whose dim 0 has this size.
    dynamic_size: int | None = None

    def dynamic_shapes(self) -> tuple[dict, ...] | None:
        if self.dynamic_size is None:
            return None
        n = torch.export.Dim("n", min=DYNAMIC_RANGE[0], max=DYNAMIC_RANGE[1])
        return tuple({0: n} if i.shape[:1] == (self.dynamic_size,) else {} for i in self.inputs)

    def run_shapes(self) -> list[list[tuple[int, ...]]]:
        """The input shapes to run at: the example's, and with the dynamic dim at both ends of its range."""
        example = [i.shape for i in self.inputs]
        if self.dynamic_size is None:
            return [example]
        marked = [bool(d) for d in self.dynamic_shapes()]
        return [example] + [
            [(size, *shape[1:]) if dynamic else shape for shape, dynamic in zip(example, marked, strict=True)]
            for size in DYNAMIC_RANGE
        ]

    def values(self) -> tuple[Value, ...]:
        values = [Value(i.shape, i.dtype) for i in self.inputs]
        for step in self.steps:
            values.append(result_of(OPS[step.op], tuple(values[i] for i in step.args), step.param))
        return tuple(values)

    def terms(self) -> int:
        """The longest product of reduction lengths in the graph (for tolerances)."""
        values = self.values()
        product = 1
        for step in self.steps:
            product *= OPS[step.op].terms(tuple(values[i] for i in step.args), step.param)
        return max(1, product)

    def name(self, index: int) -> str:
        return f"x{index}" if index < len(self.inputs) else f"v{index}"

    def forward_source(self) -> str:
        values = self.values()
        params = ", ".join(self.name(i) for i in range(len(self.inputs)))
        lines = ["class FuzzGraph(torch.nn.Module):", f"    def forward(self, {params}):"]
        for offset, step in enumerate(self.steps):
            index = len(self.inputs) + offset
            args = tuple(self.name(i) for i in step.args)
            vals = tuple(values[i] for i in step.args)
            lines.append(f"        {self.name(index)} = {OPS[step.op].template(args, vals, step.param)}")
        lines.append(f"        return ({', '.join(self.name(i) for i in self.outputs)},)")
        return "\n".join(lines) + "\n"

    def inputs_source(self) -> str:
        lines = [f"generator = torch.Generator().manual_seed({self.seed})", "inputs = ("]
        for spec in self.inputs:
            make = {
                "bool": f"torch.rand({spec.shape}, generator=generator) < 0.5",
                "int64": f"torch.randint(-5, 6, {spec.shape}, generator=generator)",
                "int8": f"torch.randint(-5, 6, {spec.shape}, generator=generator, dtype=torch.int8)",
            }.get(spec.dtype, f"torch.randn({spec.shape}, generator=generator).to(torch.{spec.dtype})")
            if spec.channels_last:
                make = f"({make}).to(memory_format=torch.channels_last)"
            lines.append(f"    {make},")
        lines.append(")")
        return "\n".join(lines) + "\n"

    def repro(self) -> str:
        config = "None" if self.dim_order else "EdgeCompileConfig(_skip_dim_order=True)"
        return (
            "import torch\n"
            "from executorch.exir import EdgeCompileConfig\n"
            "from openvino_backend.verify import check_run, lower\n\n\n"
            f"{self.forward_source()}\n\n"
            f"{self.inputs_source()}"
            f"dynamic_shapes = {self._dynamic_source()}\n"
            f"program = lower(FuzzGraph(), inputs, compile_config={config}, dynamic_shapes=dynamic_shapes)\n"
            "print(check_run(FuzzGraph(), program.buffer, inputs))\n"
        )

    def _dynamic_source(self) -> str:
        if self.dynamic_size is None:
            return "None"
        n = f"torch.export.Dim('n', min={DYNAMIC_RANGE[0]}, max={DYNAMIC_RANGE[1]})"
        dims = ", ".join("{0: n}" if d else "{}" for d in self.dynamic_shapes())
        return f"(lambda n: ({dims},))({n})"

    def build(self) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
        """The module (compiled from its source, so stack traces name real lines) and inputs."""
        filename = f"<fuzz-graph-{next(_graph_ids)}>"
        source = "import torch\n\n" + self.forward_source() + "\n" + self.inputs_source()
        lines = source.splitlines(keepends=True)
        linecache.cache[filename] = (len(source), None, lines, filename)
        namespace: dict[str, object] = {}
        exec(compile(source, filename, "exec"), namespace)
        module = namespace["FuzzGraph"]()
        return module, tuple(namespace["inputs"])


_graph_ids = count()


@st.composite
def graphs(draw: st.DrawFn, max_inputs: int = 3, max_steps: int = 8, max_outputs: int = 3) -> GraphSpec:
    dim_order = draw(st.booleans())
    # About half the graphs have a dynamic dim 0, shared by the inputs whose dim 0 has the drawn size.
    dynamic_size = draw(st.integers(DYNAMIC_RANGE[0], 4)) if draw(st.booleans()) else None
    inputs = _draw_inputs(draw, max_inputs, dim_order, dynamic_size, DTYPES, channels_last=st.booleans())
    return _draw_steps(
        draw,
        inputs,
        dim_order,
        dynamic_size,
        max_steps,
        max_outputs,
        # Identity-like ops are what this fuzzer is about: draw them more often.
        lambda: IDENTITY_OPS if draw(st.integers(0, 2)) else COMPUTE_OPS,
    )


def _draw_inputs(
    draw: st.DrawFn,
    max_inputs: int,
    dim_order: bool,
    dynamic_size: int | None,
    dtypes: tuple[str, ...],
    channels_last: st.SearchStrategy[bool],
) -> list[Input]:
    """1 to ``max_inputs`` inputs of rank 1 to 4; the first has dim 0 of ``dynamic_size`` if given."""
    inputs = []
    for index in range(draw(st.integers(1, max_inputs))):
        rank = draw(st.integers(1, 4))
        shape = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
        if dynamic_size is not None and index == 0:
            shape = (dynamic_size, *shape[1:])
        dtype = draw(st.sampled_from(dtypes))
        # ExecuTorch runs channels-last only with dim order on.
        inputs.append(Input(shape, dtype, rank == 4 and dim_order and draw(channels_last)))
    return inputs


def _draw_steps(
    draw: st.DrawFn,
    inputs: list[Input],
    dim_order: bool,
    dynamic_size: int | None,
    max_steps: int,
    max_outputs: int,
    pool: Callable[[], tuple[Op, ...]],
) -> GraphSpec:
    values = [Value(i.shape, i.dtype) for i in inputs]
    steps = []
    for _ in range(draw(st.integers(1, max_steps))):
        ops = pool()
        first = draw(st.integers(0, len(values) - 1))
        candidates = []
        for op in ops:
            if op.arity == 1:
                args = (first,)
            else:
                partners = [j for j in range(len(values)) if op.applies((values[first], values[j]), dim_order)]
                if not partners:
                    continue
                args = (first, partners[draw(st.integers(0, len(partners) - 1))])
            if op.applies(tuple(values[i] for i in args), dim_order):
                candidates.append((op, args))
        if not candidates:
            continue
        op, args = candidates[draw(st.integers(0, len(candidates) - 1))]
        param = draw(st.integers(0, 3))
        steps.append(Step(op.name, args, param))
        values.append(result_of(op, tuple(values[i] for i in args), param))
    n_out = draw(st.integers(1, max_outputs))
    # Prefer the newest values, so chains end in outputs, but allow any (inputs too).
    outputs = tuple(draw(st.one_of(st.integers(0, len(values) - 1), st.just(len(values) - 1))) for _ in range(n_out))
    seed = draw(st.integers(0, 2**16))
    return GraphSpec(tuple(inputs), tuple(steps), outputs, dim_order, seed, dynamic_size)


COMPUTE_DTYPES = ("float32", "int64", "bool")


@st.composite
def compute_graphs(draw: st.DrawFn, max_inputs: int = 3, max_steps: int = 8, max_outputs: int = 3) -> GraphSpec:
    """General compute graphs over the op kinds OpenVINO claims, with some identity-like ops mixed in."""
    dim_order = draw(st.booleans())
    dynamic_size = draw(st.integers(DYNAMIC_RANGE[0], 4)) if draw(st.booleans()) else None
    quarter = st.integers(0, 3).map(lambda n: n == 0)  # channels-last for a quarter of 4-d inputs
    inputs = _draw_inputs(draw, max_inputs, dim_order, dynamic_size, COMPUTE_DTYPES, channels_last=quarter)
    pools = (ARITH_OPS, ARITH_OPS, COMPUTE_OPS, IDENTITY_OPS)
    return _draw_steps(
        draw, inputs, dim_order, dynamic_size, max_steps, max_outputs, lambda: draw(st.sampled_from(pools))
    )


def describe(spec: GraphSpec) -> str:
    """One line: the ops in order, for summaries."""
    ops = " ".join(step.op for step in spec.steps)
    dynamic = f", dim 0 dynamic from size {spec.dynamic_size}" if spec.dynamic_size is not None else ""
    return (
        f"{len(spec.inputs)} inputs, {ops or 'no ops'} -> {len(spec.outputs)} outputs "
        f"(dim order {spec.dim_order}{dynamic})"
    )
