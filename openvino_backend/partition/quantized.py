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

    def judge(self, got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float) -> tuple[bool, str]:
        """Whether ``got`` is ``want`` up to rounding (``atol``, ``rtol``) and quantization; and how."""
        diff = (got.double() - want.double()).abs().nan_to_num(nan=math.inf)
        beyond = (diff - (atol + rtol * want.double().abs())).clamp(min=0)  # what rounding does not explain
        error, moved = _rms(beyond), _rms(self.slack)
        worst, furthest = (float(t.max()) if t.numel() else 0.0 for t in (beyond, self.slack))
        share = float((beyond > 0).double().mean()) if beyond.numel() else 0.0
        return error <= moved and worst <= furthest, (
            f"plus quantization: {share:.0%} of elements beyond rounding, RMS {error:.3g} and at most "
            f"{worst:.3g}, where quantized values near a rounding tie rounding the other way move "
            f"PyTorch's own result by {moved:.3g} (RMS), at most {furthest:.3g}"
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
    flipped = _rerun(nodes, values, constants, _flip_near_ties)
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
    constants: frozenset[torch.fx.Node],
    change: Callable[[torch.fx.Node, tuple, torch.Tensor], torch.Tensor],
) -> dict[torch.fx.Node, object]:
    """The values ``nodes`` compute in PyTorch with each activation quantize's result changed by
    ``change``; only the nodes a change reaches."""
    changed: dict[torch.fx.Node, object] = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        reads_changed = any(n in changed for n in node.all_input_nodes)
        changes_here = is_quantize(node) and node.args[0] not in constants
        if not (reads_changed or changes_here):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: changed.get(n, values[n]))
        with torch.no_grad():
            result = node.target(*args, **kwargs)
        changed[node] = change(node, args, result) if changes_here else result
    return changed


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
