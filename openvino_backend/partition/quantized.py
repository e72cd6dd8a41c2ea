"""How far a correct result may sit from PyTorch's when a partition quantizes.

An INT8 engine computes the value it quantizes in its own order and
precision, and rounds ties its own way (OpenVINO rounds half away from zero,
PyTorch half to even), so a quantized value one step from PyTorch's is what
any correct engine produces, XNNPACK included. Comparing such values at float
tolerances refuses every INT8 model on some CPUs and none on others.

The unit of agreement is therefore what rounding otherwise does, measured by
PyTorch itself: it reruns the partition's nodes with every activation
quantize's values that lie within ``TIE_WINDOW`` of a rounding tie rounded
the other way (weights are stored values, left alone), and the flips
propagate through the rest of the partition as they would in an engine. A
correct result is no further from PyTorch's, beyond float rounding, than
that: in RMS, and in its furthest element. A zero point or a scale applied
wrongly moves every element a step or more, further in RMS than ties moving
half of them, and is refused however small the step.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch

from openvino_backend.graph import op_name
from openvino_backend.ops import facts, is_quantize


def quantizes(nodes: Sequence[torch.fx.Node]) -> bool:
    return any(is_quantize(node) for node in nodes)


@dataclass(frozen=True)
class StepJudge:
    """How one output of a quantized partition is judged: ``slack`` is how far PyTorch's own
    result moves, elementwise, when every quantized value near a rounding tie rounds the other way."""

    slack: torch.Tensor
    # What moves PyTorch's result by ``slack``, for the report.
    cause: str = "quantized values near a rounding tie rounding the other way"
    # How far apart two such roundings of PyTorch's own land, at most (0: one rounding was run).
    spread: float = 0.0

    def judge(self, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> tuple[bool, str]:
        """Whether ``got`` is ``want`` up to rounding (``atol``, ``rtol``) and quantization; and how.

        In RMS a correct result is no further from PyTorch's than the roundings PyTorch ran. Its
        furthest element depends on which values its own rounding happened to tip, which after a few
        layers lands elsewhere than any rounding PyTorch ran: it may stand as far past theirs as two
        of them stand apart (``spread``). A wrong scale or zero point moves the RMS, which has no such
        allowance."""
        diff = (got.double() - want.double()).abs().nan_to_num(nan=math.inf)
        beyond = (diff - (atol + rtol * want.double().abs())).clamp(min=0)  # what rounding does not explain
        error, moved = _rms(beyond), _rms(self.slack)
        worst, furthest = (float(t.max()) if t.numel() else 0.0 for t in (beyond, self.slack))
        share = float((beyond > 0).double().mean()) if beyond.numel() else 0.0
        apart = f", two of them {self.spread:.3g} apart at most" if self.spread else ""
        return error <= moved and worst <= furthest + self.spread, (
            f"plus quantization: {share:.0%} of elements beyond rounding, RMS {error:.3g} and at most "
            f"{worst:.3g}, where {self.cause} move PyTorch's own result by {moved:.3g} (RMS), at most "
            f"{furthest:.3g}{apart}"
        )


def step_judges(
    nodes: Sequence[torch.fx.Node],
    outputs: Sequence[torch.fx.Node],
    values: Mapping[torch.fx.Node, object],
    constants: frozenset[torch.fx.Node] = frozenset(),
) -> list[StepJudge | None]:
    """Per output, how it is judged (None: no activation quantize reaches it).

    ``nodes`` are the partition's, in graph order; ``values`` every node's
    value in PyTorch; a quantize of one of ``constants`` (a weight) is left alone.
    """

    def flip(node: torch.fx.Node, args: tuple, kwargs: dict) -> object:
        return _flip_near_ties(node, args, node.target(*args, **kwargs))

    activations = [n for n in nodes if is_quantize(n) and n.args[0] not in constants]
    flipped = _rerun(nodes, values, dict.fromkeys(activations, flip), outputs)
    judges: list[StepJudge | None] = []
    for node in outputs:
        want = values[node]
        if not isinstance(want, torch.Tensor) or node not in flipped:
            judges.append(None)
            continue
        delta = (flipped[node].double() - want.double()).abs().nan_to_num(nan=0.0, posinf=0.0)
        judges.append(StepJudge(delta))
    return judges


# Quantized values this close to a rounding tie (in steps) may round either way in a correct engine.
TIE_WINDOW = 0.25


def _rerun(
    nodes: Sequence[torch.fx.Node],
    values: Mapping[torch.fx.Node, object],
    changes: Mapping[torch.fx.Node, Callable[[torch.fx.Node, tuple, dict], object]],
    keep: Sequence[torch.fx.Node],
) -> dict[torch.fx.Node, object]:
    """The values of ``keep`` that ``nodes`` compute in PyTorch when each node of ``changes`` is
    computed by its function instead (given the node and its arguments); only those a change reaches."""
    return _reruns(nodes, values, [changes], keep)[0]


def _reruns(
    nodes: Sequence[torch.fx.Node],
    values: Mapping[torch.fx.Node, object],
    variants: Sequence[Mapping[torch.fx.Node, Callable[[torch.fx.Node, tuple, dict], object]]],
    keep: Sequence[torch.fx.Node],
) -> list[dict[torch.fx.Node, object]]:
    """``_rerun`` for each of ``variants`` (its ``changes``), side by side in one pass over ``nodes``:
    a value a step of several reruns reads is read once for all of them (a compressed weight's
    dequantized value is computed each time it is read).

    A changed value is dropped once the last of ``nodes`` reading it has run: the rerun holds what
    one layer holds, not every value of the partition (a decoder's caches pass through each layer)."""
    kept = set(keep)
    position = {node: i for i, node in enumerate(nodes)}
    last_read: dict[torch.fx.Node, int] = {}
    for node in nodes:
        for source in node.all_input_nodes:
            last_read[source] = position[node]
    reruns: list[dict[torch.fx.Node, object]] = [{} for _ in variants]
    for i, node in enumerate(nodes):
        if node.op != "call_function":
            continue
        read: dict[torch.fx.Node, object] = {}  # the unchanged values this step reads, once for every rerun
        for changes, changed in zip(variants, reruns, strict=True):
            if not (node in changes or any(n in changed for n in node.all_input_nodes)):
                continue
            args, kwargs = torch.fx.node.map_arg(
                (node.args, node.kwargs), functools.partial(_read_once, values, changed, read)
            )
            compute = changes.get(node, lambda n, a, k: n.target(*a, **k))
            with torch.no_grad():
                changed[node] = compute(node, args, kwargs)
            del args, kwargs
            for source in {*node.all_input_nodes, node}:
                if source in changed and source not in kept and last_read.get(source, -1) <= i:
                    del changed[source]
        del read
    return reruns


def _read_once(
    values: Mapping[torch.fx.Node, object],
    changed: Mapping[torch.fx.Node, object],
    read: dict[torch.fx.Node, object],
    source: torch.fx.Node,
) -> object:
    """``source``'s value in a rerun: its changed value, else PyTorch's, read once into ``read``."""
    if source in changed:
        return changed[source]
    if source not in read:
        read[source] = values[source]
    return read[source]


def _flip_near_ties(node: torch.fx.Node, args: tuple, result: torch.Tensor) -> torch.Tensor:
    """``result`` with each value whose unrounded form lies near a tie rounded the other way."""
    unrounded = _unrounded(node, args)
    if unrounded is None:
        return result
    near = (unrounded - unrounded.floor() - 0.5).abs() < TIE_WINDOW
    rounded = result.to(torch.float64)
    other = torch.where(rounded > unrounded, unrounded.floor(), unrounded.ceil())
    low, high = _quant_range(node, result.dtype)
    return torch.where(near, other, rounded).clamp(low, high).to(result.dtype)


def _unrounded(node: torch.fx.Node, args: tuple) -> torch.Tensor | None:
    """What a quantize rounds: ``input / scale + zero_point``, in float64."""
    x, scale, zero_point = args[0], args[1], args[2]
    if not isinstance(x, torch.Tensor):
        return None
    scale = torch.as_tensor(scale, dtype=torch.float64)
    zero_point = torch.as_tensor(zero_point, dtype=torch.float64)
    if op_name(node) == "quantized_decomposed.quantize_per_channel.default":
        axis = int(args[3]) % x.dim()
        shape = [-1 if d == axis else 1 for d in range(x.dim())]
        scale, zero_point = scale.reshape(shape), zero_point.reshape(shape)
    return x.double() / scale + zero_point


def _rms(t: torch.Tensor) -> float:
    return float(t.double().pow(2).mean().sqrt()) if t.numel() else 0.0


def _quant_range(node: torch.fx.Node, dtype: torch.dtype) -> tuple[int, int]:
    positions = facts(node).quantize_range
    low, high = (
        node.args[i] if len(node.args) > i else node.kwargs.get(key)
        for i, key in zip(positions, ("quant_min", "quant_max"), strict=True)
    )
    info = torch.iinfo(dtype)
    return (info.min if low is None else int(low)), (info.max if high is None else int(high))


# OpenVINO's CPU plugin multiplies compressed weights (integer constants and their dequantize) with
# activations it quantizes on the fly: symmetric int8, a scale per group of this many elements along
# the reduction (DYNAMIC_QUANTIZATION_GROUP_SIZE). The stock runtime imports a blob with no properties,
# so it computes with the default, unless the model's rt_info carried ``runtime_options`` into the blob
# (they survive the import), which ours never do. Measured against OpenVINO 2026.4.1: its result is this
# emulation's, exactly (tests/test_compressed.py also checks an exported blob imports with this group).
DYNAMIC_GROUP = 32
# Matmuls, with the position of the activation and of the weight among their arguments.
_MATMULS = {
    "aten.mm.default": (0, 1),
    "aten.bmm.default": (0, 1),
    "aten.addmm.default": (1, 2),
    "aten.linear.default": (0, 1),
    "aten.matmul.default": (0, 1),
}


def compressed_matmuls(nodes: Sequence[torch.fx.Node], constants: frozenset[torch.fx.Node]) -> dict[torch.fx.Node, int]:
    """The matmuls among ``nodes`` whose weight is computed from stored constants alone, an integer
    one among them (a compressed weight), with the position of their activation."""
    stored = set(constants)
    compressed: set[torch.fx.Node] = {
        n for n in constants if isinstance(_val(n), torch.Tensor) and not _val(n).is_floating_point()
    }
    found: dict[torch.fx.Node, int] = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if inputs and all(n in stored for n in inputs):
            stored.add(node)
            if any(n in compressed for n in inputs):
                compressed.add(node)
        positions = _MATMULS.get(op_name(node))
        if positions is None or len(node.args) <= max(positions):
            continue
        activation, weight = (node.args[i] for i in positions)
        if weight in compressed and isinstance(activation, torch.fx.Node) and activation not in stored:
            found[node] = positions[0]
    return found


def dynamic_judges(
    nodes: Sequence[torch.fx.Node],
    outputs: Sequence[torch.fx.Node],
    values: Mapping[torch.fx.Node, object],
    matmuls: Mapping[torch.fx.Node, int],
) -> list[StepJudge | None]:
    """Per output, how it is judged where OpenVINO quantizes activations of compressed-weight matmuls
    (None: no such matmul reaches it). PyTorch reruns the partition with those activations quantized
    as OpenVINO quantizes them, once rounding to nearest and once with the values near a rounding
    tie rounded the other way (OpenVINO's activations differ from PyTorch's by float rounding, enough
    to tip a tie); a correct result is no further from PyTorch's than the further of the two, its
    furthest element give or take how far apart the two land (``StepJudge.judge``)."""
    reruns = _reruns_quantizing(nodes, outputs, values, matmuls)
    judges: list[StepJudge | None] = []
    cause = (
        f"activations of compressed-weight matmuls quantized to int8 in groups of {DYNAMIC_GROUP} (as OpenVINO does)"
    )
    for node in outputs:
        want = values[node]
        moved = [rerun.get(node) for rerun in reruns]
        if not isinstance(want, torch.Tensor) or not all(isinstance(m, torch.Tensor) for m in moved):
            judges.append(None)
            continue
        deltas = [(m.double() - want.double()).abs().nan_to_num(nan=0.0, posinf=0.0) for m in moved]
        apart = (moved[0].double() - moved[1].double()).abs().nan_to_num(nan=0.0, posinf=0.0)
        judges.append(StepJudge(torch.maximum(*deltas), cause, float(apart.max()) if apart.numel() else 0.0))
    return judges


def _reruns_quantizing(
    nodes: Sequence[torch.fx.Node],
    outputs: Sequence[torch.fx.Node],
    values: Mapping[torch.fx.Node, object],
    matmuls: Mapping[torch.fx.Node, int],
) -> list[dict[torch.fx.Node, object]]:
    """The reruns with those activations quantized, rounding to nearest and with ties flipped."""

    def quantizing(flip: bool) -> Callable[[torch.fx.Node, tuple, dict], object]:
        def quantized(node: torch.fx.Node, args: tuple, kwargs: dict) -> object:
            position = matmuls[node]
            args = (*args[:position], _quantize_groups(args[position], flip), *args[position + 1 :])
            return node.target(*args, **kwargs)

        return quantized

    return _reruns(nodes, values, [dict.fromkeys(matmuls, quantizing(flip)) for flip in (False, True)], outputs)


def _quantize_groups(x: object, flip_ties: bool) -> object:
    """``x`` quantized to symmetric int8 and back, a scale per group of ``DYNAMIC_GROUP`` along its
    last dim; with ``flip_ties``, values within ``TIE_WINDOW`` of a tie round the other way."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.shape[-1] % DYNAMIC_GROUP:
        return x
    groups = x.double().reshape(*x.shape[:-1], x.shape[-1] // DYNAMIC_GROUP, DYNAMIC_GROUP)
    scale = groups.abs().amax(dim=-1, keepdim=True) / 127
    unrounded = groups / scale.clamp(min=1e-300)
    rounded = torch.round(unrounded)
    if flip_ties:
        near = (unrounded - unrounded.floor() - 0.5).abs() < TIE_WINDOW
        other = torch.where(rounded > unrounded, unrounded.floor(), unrounded.ceil())
        rounded = torch.where(near, other, rounded).clamp(-127, 127)
    quantized = torch.where(scale > 0, rounded * scale, groups)
    return quantized.reshape(x.shape).to(x.dtype)


def _val(node: torch.fx.Node) -> object:
    return node.meta.get("val")
