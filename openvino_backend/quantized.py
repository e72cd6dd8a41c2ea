"""How far a correct result may sit from PyTorch's when a partition quantizes.

An INT8 engine computes the value it quantizes in its own order and
precision, and rounds ties its own way (OpenVINO rounds half away from zero,
PyTorch half to even), so a quantized value one step from PyTorch's is what
any correct engine produces, XNNPACK included. Comparing such values at float
tolerances refuses every INT8 model on some CPUs and none on others.

The unit of agreement is therefore the quantization step. This module
measures, for each output of a partition, how far that output moves when
every quantized activation it reads moves by one step (PyTorch, rerunning the
partition's nodes with every activation ``quantize`` shifted by +1 and by -1,
clamped to its range): for a dequantize at the edge that is exactly one step,
for a value computed from dequantized values it is the computation's own
sensitivity. Weights are not shifted: they are stored values, not computed.

A shifted rounding moves some elements, not all: a result off by a step
almost everywhere (a zero point or a scale applied wrongly) is not rounding,
and ``within_steps`` refuses it however small the step.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from openvino_backend.diagnostics import op_name

# Ops whose result is a quantized integer tensor, with the positions of quant_min and quant_max.
_QUANTIZE = {
    "quantized_decomposed.quantize_per_tensor.default": (3, 4),
    "quantized_decomposed.quantize_per_tensor.tensor": (3, 4),
    "quantized_decomposed.quantize_per_channel.default": (4, 5),
}
# A result off by a step in more than this share of its elements is not rounding.
MAX_SHIFTED_SHARE = 0.5


def is_quantize(node: torch.fx.Node) -> bool:
    """A PT2E quantize: its result is the integer tensor a dequantize reads."""
    return node.op == "call_function" and op_name(node) in _QUANTIZE


def quantizes(nodes: Sequence[torch.fx.Node]) -> bool:
    return any(is_quantize(node) for node in nodes)


def step_slack(
    nodes: Sequence[torch.fx.Node],
    outputs: Sequence[torch.fx.Node],
    values: Mapping[torch.fx.Node, object],
    constants: frozenset[torch.fx.Node] = frozenset(),
) -> list[torch.Tensor | None]:
    """Per output, elementwise: how far it moves when every quantized activation moves a step.

    ``nodes`` are the partition's, in graph order; ``values`` every node's
    value in PyTorch; a quantize of one of ``constants`` (a weight) is not
    shifted. None for an output no shifted quantize reaches.
    """
    shifted = [_rerun(nodes, values, constants, shift) for shift in (1, -1)]
    slack: list[torch.Tensor | None] = []
    for node in outputs:
        want = values[node]
        moved = [run[node] for run in shifted if node in run]
        if not moved or not isinstance(want, torch.Tensor):
            slack.append(None)
            continue
        deltas = [(m.double() - want.double()).abs() for m in moved]
        slack.append(torch.stack(deltas).amax(0).nan_to_num(nan=0.0, posinf=0.0))
    return slack


def within_steps(
    got: torch.Tensor, want: torch.Tensor, atol: float, rtol: float, slack: torch.Tensor
) -> tuple[bool, float]:
    """Whether ``got`` is ``want`` up to rounding (``atol``, ``rtol``) and a step's ``slack``;
    and the share of elements that needed the step."""
    diff = (got.double() - want.double()).abs()
    rounding = atol + rtol * want.double().abs()
    stepped = diff > rounding
    share = float(stepped.double().mean()) if stepped.numel() else 0.0
    ok = bool((diff <= rounding + slack).all()) and share <= MAX_SHIFTED_SHARE
    return ok, share


def _rerun(
    nodes: Sequence[torch.fx.Node],
    values: Mapping[torch.fx.Node, object],
    constants: frozenset[torch.fx.Node],
    shift: int,
) -> dict[torch.fx.Node, object]:
    """The values ``nodes`` compute in PyTorch with each activation quantize shifted by ``shift``;
    only the nodes a shift reaches."""
    changed: dict[torch.fx.Node, object] = {}
    for node in nodes:
        if node.op != "call_function":
            continue
        name = op_name(node)
        reads_shifted = any(n in changed for n in node.all_input_nodes)
        shifts_here = name in _QUANTIZE and node.args[0] not in constants
        if not (reads_shifted or shifts_here):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: changed.get(n, values[n]))
        with torch.no_grad():
            result = node.target(*args, **kwargs)
        if shifts_here:
            low, high = _quant_range(node, result.dtype)
            result = (result.to(torch.int64) + shift).clamp(low, high).to(result.dtype)
        changed[node] = result
    return changed


def _quant_range(node: torch.fx.Node, dtype: torch.dtype) -> tuple[int, int]:
    positions = _QUANTIZE[op_name(node)]
    low, high = (
        node.args[i] if len(node.args) > i else node.kwargs.get(key)
        for i, key in zip(positions, ("quant_min", "quant_max"), strict=True)
    )
    info = torch.iinfo(dtype)
    return (info.min if low is None else int(low)), (info.max if high is None else int(high))
