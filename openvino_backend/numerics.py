"""Run each proposed partition in OpenVINO and in PyTorch, on the same values, before committing.

The copy rules and the conversion check know the ways a partition is known
to go wrong; this check assumes none of them. Every node of the program is
computed once in eager PyTorch on sample values (the user's, or draws shaped
by ``meta["val"]``); each proposed partition is then converted as preprocess
converts it, compiled for the target device with the properties the runtime
will use (none: so in the precision it really computes in), and run the way
the stock runtime runs it, inputs bound before outputs pre-filled with values
that cannot pass for a result. Its outputs are compared with PyTorch's.

A disagreement beyond what the device's precision allows is confirmed with
OpenVINO forced to f32, where anything above 1e-3 is a real error and not
rounding; a confirmed one is narrowed to the node whose addition makes a
prefix of the partition wrong, and that node stays on the CPU.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import openvino as ov
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind

from openvino_backend.boundary import PartitionView, Rejection, is_getitem, non_default_dim_order
from openvino_backend.conversion_check import ConvertedPartition, compile_key, convert_partition, converted
from openvino_backend.diagnostics import OpenvinoExportError, op_name
from openvino_backend.edge_layout import DimOrder, inverse
from openvino_backend.precision import (
    Tolerance,
    default_precision,
    effective_dtype,
    inference_precision,
    openvino_core,
    precision_name,
    supported_precisions,
)
from openvino_backend.quantized import is_quantize, quantizes, step_judges
from openvino_backend.timing import timed
from openvino_backend.validate import user_input_nodes

logger = logging.getLogger(__name__)

SampleValues = dict[torch.fx.Node, object]

# An f32 result further than this (relative to its magnitude) from PyTorch's is wrong, not rounded.
F32_ERROR = 1e-3
# Integer inputs no index op reads are drawn from [-INT_RANGE, INT_RANGE).
INT_RANGE = 8

# op -> (position of the indexed tensor, position of the dim or None, position of the index)
_INDEX_OPS = {
    "aten.embedding.default": (0, None, 1),
    "aten.index_select.default": (0, 1, 2),
    "aten.gather.default": (0, 1, 2),
    "aten.scatter.src": (0, 1, 2),
    "aten.scatter.value": (0, 1, 2),
    "aten.scatter_add.default": (0, 1, 2),
    "aten.scatter_reduce.two": (0, 1, 2),
}


@timed("numerical_check")
def sample_values(
    program: ExportedProgram, sample_inputs: Sequence[object] | None = None, *, seed: int = 0
) -> SampleValues | None:
    """Every node's value in eager PyTorch, from ``sample_inputs`` or from draws; None if that fails.

    Drawn integer inputs stay in a range every index op reading them accepts;
    if eager still refuses the draws (a division by zero, say), positive
    integers are tried once more.
    """
    placeholders = program.graph.find_nodes(op="placeholder")
    specs = program.graph_signature.input_specs
    if len(placeholders) != len(specs):
        logger.warning("numerical check skipped: the program's signature does not match its placeholders")
        return None
    user_inputs = [node for node, spec in zip(placeholders, specs, strict=True) if spec.kind == InputKind.USER_INPUT]
    attempts: list[list[object]] = []
    if sample_inputs is not None:
        given = [x for x in torch.utils._pytree.tree_leaves(sample_inputs)]
        if len(given) != len(user_inputs):
            raise ValueError(f"sample_inputs has {len(given)} tensors; the program takes {len(user_inputs)} inputs")
        attempts.append(given)
    else:
        for low in (None, 1):
            generator = torch.Generator().manual_seed(seed)
            attempts.append([_draw(node, generator, low) for node in user_inputs])
    error: Exception | None = None
    for inputs in attempts:
        try:
            return _propagate(program, inputs)
        except Exception as failure:  # eager refused these values; the check cannot run on them
            error = failure
    logger.warning("numerical check skipped: PyTorch could not run the program on sample values (%s)", error)
    return None


def _propagate(program: ExportedProgram, user_inputs: list[object]) -> SampleValues:
    values: SampleValues = {}
    constants = {**program.state_dict, **program.constants}
    fake = sorted(name for name, value in constants.items() if isinstance(value, FakeTensor))
    if fake:
        raise ValueError(f"the program's weights are fake tensors ({', '.join(fake[:3])}...)")
    given = iter(user_inputs)
    flat = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            flat.append(next(given))
        elif spec.target in constants:
            flat.append(constants[spec.target])
        else:
            raise ValueError(f"no value for input {spec.arg.name} ({spec.kind.name})")

    class Recorder(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> object:
            values[node] = result = super().run_node(node)
            return result

    with torch.no_grad():
        Recorder(program.graph_module).run(*flat, enable_io_processing=False)
    return values


def _hint(size: int | torch.SymInt) -> int:
    if isinstance(size, int):
        return size
    hint = size.node.hint
    return int(hint) if hint is not None else int(size.node.shape_env.size_hint(size.node.expr))


def _draw(node: torch.fx.Node, generator: torch.Generator, low: int | None) -> object:
    val = node.meta.get("val")
    if isinstance(val, (int, torch.SymInt)):
        return _hint(val)
    if not isinstance(val, torch.Tensor):
        raise ValueError(f"cannot draw a value for input {node.name}")
    shape = [_hint(d) for d in val.shape]
    if val.dtype == torch.bool:
        x = torch.rand(shape, generator=generator) < 0.5
    elif val.dtype.is_floating_point:
        x = torch.randn(shape, generator=generator).to(val.dtype)
    else:
        bound = _index_bound(node)
        lo = low if low is not None else (0 if bound is not None else -INT_RANGE)
        hi = max(lo + 1, bound if bound is not None else INT_RANGE)
        x = torch.randint(lo, hi, shape, generator=generator, dtype=val.dtype)
    order = non_default_dim_order(val)
    if order is not None:  # same logical values, laid out in the input's dim order
        x = x.permute(order).contiguous().permute(tuple(np.argsort(order)))
    return x


def _index_bound(node: torch.fx.Node) -> int | None:
    """The smallest size ``node``'s values index into, over the index ops reading it."""
    bounds = []
    for user in node.users:
        where = _INDEX_OPS.get(op_name(user))
        if where is not None and len(user.args) > where[2] and user.args[where[2]] is node:
            data, dim = user.args[where[0]], (user.args[where[1]] if where[1] is not None else 0)
            bounds.append(_hint(data.meta["val"].shape[dim]))
        elif op_name(user) == "aten.index.Tensor":
            data, indices = user.args[0], user.args[1]
            bounds += [_hint(data.meta["val"].shape[i]) for i, index in enumerate(indices) if index is node]
    return min(bounds) if bounds else None


@dataclass(frozen=True)
class Mismatch:
    """An output of a (sub)partition that OpenVINO computes differently from PyTorch."""

    node: torch.fx.Node
    detail: str


class NumericalCheck:
    """A partition rule: keep out the node that makes OpenVINO disagree with PyTorch."""

    def __init__(
        self, program: ExportedProgram, values: SampleValues, device: str = "CPU", precision: str | None = None
    ) -> None:
        self.program = program
        self.values = values
        self.device = device
        # The precision the target computes in: compiled for and judged by, whatever this machine's default.
        self.precision = precision_name(inference_precision(device, precision))
        self._computes_in = self.precision if self.precision in supported_precisions(device) else "f32"
        default = precision_name(default_precision(device))
        self._properties = {} if self._computes_in == default else {"INFERENCE_PRECISION_HINT": self._computes_in}
        users = set(user_input_nodes(program))
        self._constants = frozenset(n for n in program.graph.find_nodes(op="placeholder") if n not in users)
        self.narrowed: list[tuple[str, str]] = []  # (op, why) of each node the check kept out
        self.unchecked = 0  # partitions the check could not run

    @timed("numerical_check")
    def __call__(self, part: PartitionView) -> Iterator[Rejection]:
        nodes = part.ordered()
        try:
            mismatch = self.run(nodes, lambda: converted(part))
            if mismatch is None:
                return
            culprit, mismatch = self.narrow(nodes, mismatch)
        except Exception as error:  # a check that cannot run must not take the export down with it
            logger.warning("numerical check could not run a partition of %d nodes: %s", len(nodes), error)
            self.unchecked += 1
            return
        reason = (
            f"OpenVINO computes this {op_name(culprit)} differently from PyTorch: {mismatch.detail} "
            "(found by running the partition on sample values; please report the op)"
        )
        self.narrowed.append((op_name(culprit), mismatch.detail))
        yield culprit, reason

    def narrow(self, nodes: list[torch.fx.Node], mismatch: Mismatch) -> tuple[torch.fx.Node, Mismatch]:
        """The node whose addition to a prefix of ``nodes`` makes OpenVINO wrong (bisection)."""
        units = _units(nodes)
        good, bad = 0, len(units)  # prefix of `good` units agrees; of `bad` units disagrees
        while bad - good > 1:
            middle = (good + bad) // 2
            found = self.run([n for unit in units[:middle] for n in unit])
            if found is None:
                good = middle
            else:
                bad, mismatch = middle, found
        return units[bad - 1][0], mismatch

    def run(
        self, nodes: list[torch.fx.Node], convert: Callable[[], ConvertedPartition] | None = None
    ) -> Mismatch | None:
        """Run ``nodes`` as one partition in OpenVINO; the first output PyTorch disagrees with."""
        try:
            partition = convert() if convert is not None else convert_partition(self.program, nodes)
        except OpenvinoExportError:
            return None  # the conversion check and preprocess explain what does not convert
        inputs, outputs = partition.inputs, partition.outputs
        if not all(_checkable(self.values.get(node)) for node in inputs) or not all(
            _checkable(self.values.get(node), scalar=False) for node in outputs
        ):
            return None
        feeds = [_as_bound(self.values[n], order) for n, order in zip(inputs, partition.input_orders, strict=True)]
        expected = [self.values[node] for node in outputs]
        orders = partition.output_orders
        found = self._compare(partition, feeds, expected, nodes, outputs, orders, self._properties, confirm=False)
        if found is None:
            return None
        # Rounding, or a wrong result? f32 at a relative error of F32_ERROR tells them apart.
        f32 = self._properties if self._computes_in == "f32" else {"INFERENCE_PRECISION_HINT": "f32"}
        confirmed = self._compare(partition, feeds, expected, nodes, outputs, orders, f32, confirm=True)
        if confirmed is None:
            logger.debug("%s: within rounding once computed in f32 (%s)", found.node.name, found.detail)
        return confirmed  # its detail is the one that decides

    def _compare(
        self,
        partition: ConvertedPartition,
        feeds: list[object],
        expected: list[torch.Tensor],
        nodes: Sequence[torch.fx.Node],
        outputs: Sequence[torch.fx.Node],
        orders: Sequence[DimOrder | None],
        properties: Mapping[str, str],
        *,
        confirm: bool,
    ) -> Mismatch | None:
        depths = _depths(nodes)
        try:
            key = compile_key(self.device, properties)
            compiled = partition.compiled.get(key)
            if compiled is None:
                compiled = openvino_core().compile_model(partition.model, self.device, dict(properties))
                partition.compiled[key] = compiled
            planned = [_as_bound(want, order) for want, order in zip(expected, orders, strict=True)]
            bound, overwritten = run_like_runtime(compiled, feeds, planned)
            actual = [_from_bound(b, o, w.shape) for b, o, w in zip(bound, orders, expected, strict=True)]
        except RuntimeError as error:
            logger.debug("numerical check could not run a partition: %s", error)
            return None
        if overwritten:
            return Mismatch(outputs[0], "running it overwrote one of its inputs")
        tolerances = [
            _tolerance(want, self.device, self.precision, confirm=confirm, ops=2 * depths.get(node, 1))
            for node, want in zip(outputs, expected, strict=True)
        ]
        pairs = enumerate(zip(actual, expected, strict=True))
        failed = [i for i, (got, want) in pairs if not tolerances[i].check(got, want)]
        if not failed:
            return None
        # A quantized value a step from PyTorch's is rounding too: judged in steps (quantized.py), once
        # computed in f32 (a reduced precision's own rounding would blur a step).
        in_f32 = confirm or self._computes_in == "f32"
        judges = step_judges(nodes, outputs, self.values, self._constants) if in_f32 and quantizes(nodes) else []
        for index in failed:
            node, got, want, tolerance = outputs[index], actual[index], expected[index], tolerances[index]
            judge = judges[index] if judges else None
            if judge is None or got.shape != want.shape:
                return Mismatch(node, _describe(got, want, tolerance, self.precision, confirm))
            ok, how = judge.judge(got, want, tolerance.atol, tolerance.rtol)
            logger.debug("%s: %s (%s)", node.name, how, "agrees" if ok else "disagrees")
            if not ok:
                return Mismatch(node, f"{_describe(got, want, tolerance, self.precision, confirm)}, {how}")
        return None


def run_like_runtime(
    compiled: ov.CompiledModel, feeds: Sequence[object], expected: Sequence[torch.Tensor]
) -> tuple[list[torch.Tensor], bool]:
    """Infer as the stock runtime does: inputs bound first, then output buffers it planned.

    Output buffers start with values no correct result has (NaN, or each
    expected value plus one), so an output OpenVINO never writes shows.
    Returns the outputs and whether an input buffer changed.
    """
    request = compiled.create_infer_request()
    given = [_as_tensor(x) for x in feeds]
    kept = [x.clone() for x in given]
    for index, x in enumerate(given):
        request.set_input_tensor(index, ov.Tensor(x.numpy(), shared_memory=True))
    outputs = [_not_a_result(want) for want in expected]
    for index, out in enumerate(outputs):
        request.set_output_tensor(index, ov.Tensor(out.numpy(), shared_memory=True))
    request.infer()
    overwritten = any(not torch.equal(a, b) for a, b in zip(given, kept, strict=True))
    return outputs, overwritten


def _as_bound(value: object, order: DimOrder | None) -> object:
    """``value`` as the runtime binds it: its logical sizes over memory laid out in ``order``."""
    if order is None or not isinstance(value, torch.Tensor):
        return value
    return value.permute(order).contiguous().reshape(value.shape)


def _from_bound(value: torch.Tensor, order: DimOrder | None, shape: Sequence[int]) -> torch.Tensor:
    """The logical tensor whose memory, laid out in ``order``, the runtime bound as ``value``."""
    if order is None:
        return value
    return value.reshape([shape[d] for d in order]).permute(inverse(order))


def _as_tensor(value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().contiguous().clone()
    return torch.tensor([int(value)], dtype=torch.int64)  # the runtime binds an int input as i64[1]


def _not_a_result(want: torch.Tensor) -> torch.Tensor:
    if want.dtype == torch.bool:
        return ~want.contiguous()
    if want.dtype.is_floating_point and not want.isnan().any():
        return torch.full_like(want, math.nan, memory_format=torch.contiguous_format)
    return (want + 1).contiguous()


def _checkable(value: object, *, scalar: bool = True) -> bool:
    """Values the check can bind through OpenVINO's Python API (numpy has no bf16); ints if ``scalar``."""
    if isinstance(value, (int, torch.SymInt)):
        return scalar
    return isinstance(value, torch.Tensor) and value.dtype not in (torch.bfloat16,) and not value.is_complex()


def _tolerance(want: torch.Tensor, device: str, precision: str, *, confirm: bool, ops: int) -> Tolerance:
    scale = float(want.abs().max()) if want.numel() and want.dtype.is_floating_point else 1.0
    scale = max(scale, 1.0) if math.isfinite(scale) else 1.0
    if confirm:  # in f32, where anything beyond F32_ERROR is wrong and not rounding
        return Tolerance(atol=F32_ERROR * scale, rtol=F32_ERROR) if want.dtype.is_floating_point else Tolerance(0, 0)
    return Tolerance.for_output(want.dtype, device, scale=scale, ops=max(ops, 4), target=precision)


def _describe(got: torch.Tensor, want: torch.Tensor, tolerance: Tolerance, precision: str, confirm: bool) -> str:
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} where PyTorch gives {tuple(want.shape)}"
    diff = (got.double() - want.double()).abs().nan_to_num(nan=math.inf)
    where = int(diff.flatten().argmax()) if diff.numel() else 0
    precision = "f32" if confirm else str(effective_dtype(want.dtype, target=precision)).removeprefix("torch.")
    return (
        f"max error {float(diff.max()):.3g} (element {where}: {got.flatten()[where].item()!r} where PyTorch gives "
        f"{want.flatten()[where].item()!r}), allowed {tolerance.atol:.3g} + {tolerance.rtol:.3g}*|value| in {precision}"
    )


def _units(nodes: list[torch.fx.Node]) -> list[list[torch.fx.Node]]:
    """``nodes`` in order, each with what cannot be split from it: the getitems reading it, and
    a quantize's dequantizes (``boundary.keep_quantize_pairs_together``)."""
    units: list[list[torch.fx.Node]] = []
    owner: dict[torch.fx.Node, list[torch.fx.Node]] = {}
    for node in nodes:
        source = node.args[0] if node.args and isinstance(node.args[0], torch.fx.Node) else None
        if source in owner and (is_getitem(node) or is_quantize(source)):
            owner[source].append(node)
            owner[node] = owner[source]
        else:
            units.append(owner.setdefault(node, [node]))
    return units


def _depths(nodes: Sequence[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """How many ops of ``nodes`` the longest path to each node goes through (roundings in sequence)."""
    depth: dict[torch.fx.Node, int] = {}
    for node in nodes:
        depth[node] = (0 if is_getitem(node) else 1) + max((depth.get(n, 0) for n in node.all_input_nodes), default=0)
    return depth
