"""Quantized values are judged in quantization steps, at the precision of the target CPU.

OpenVINO rounds a quantize's ties away from zero where PyTorch rounds them
to even: one step apart, both correct. The numerical check must accept that
on every CPU (f32 and bf16 targets alike) and still refuse a quantized
result that is wrong (a zero point applied off by one, a scale applied
wrongly), however small the step.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec

import openvino_backend.partition.numerical as numerical
from openvino_backend.diagnostics import CompileSpecError, CpuKernelError
from openvino_backend.graph import op_name
from openvino_backend.ops import is_quantize
from openvino_backend.partition.edge_rules import keep_quantize_pairs_together
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.partition.quantized import StepJudge
from openvino_backend.partition.view import PartitionView
from openvino_backend.tools.verify import lower_exported, run_program
from tests.harness import TARGET_PRECISIONS, non_delegated_ops, partitioner_for

SCALE, ZERO_POINT = 0.5, 3


class RoundTrip(torch.nn.Module):
    """Quantize, dequantize, compute on: the dequantized value feeds arithmetic, as in PT2E graphs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _round_trip(x) * 2 + x


class Dequantized(torch.nn.Module):
    """The dequantized value itself leaves: a quantized value at the edge."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _round_trip(x).reshape(-1)


def _round_trip(x: torch.Tensor) -> torch.Tensor:
    q = torch.ops.quantized_decomposed.quantize_per_tensor(x, SCALE, ZERO_POINT, -128, 127, torch.int8)
    return torch.ops.quantized_decomposed.dequantize_per_tensor(q, SCALE, ZERO_POINT, -128, 127, torch.int8)


MODELS = {"computed": (RoundTrip, 2 * SCALE), "value": (Dequantized, SCALE)}  # and one step at the output


def ties() -> torch.Tensor:
    """Values on the quantization grid and half-way between its points (every rounding tie)."""
    return (torch.arange(-40, 40, dtype=torch.float32) * SCALE / 2).reshape(8, 10)


@pytest.mark.isa
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("precision", TARGET_PRECISIONS)
def test_a_step_at_a_rounding_tie_is_agreement(precision, kind) -> None:
    model, step = MODELS[kind][0](), MODELS[kind][1]
    x = ties()
    partitioner = partitioner_for(precision, sample_inputs=(x,))
    program = lower_exported(torch.export.export(model, (x,)), partitioner=partitioner)
    assert non_delegated_ops(program) == [], partitioner.report.kept_out
    assert partitioner.report.precision == precision
    (actual,) = run_program(program.buffer, [x])
    expected = model(x)
    # The case is real: OpenVINO rounds some ties the other way ...
    off = (actual - expected).abs()
    assert off.max() > 0
    # ... and never further than a step.
    assert off.max() <= step + 1e-2


@pytest.mark.isa
@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("precision", TARGET_PRECISIONS)
def test_a_zero_point_applied_off_by_one_is_refused(precision, kind, monkeypatch) -> None:
    """OpenVINO's outputs shifted by one step everywhere, as a wrong zero point would shift them."""
    model, step = MODELS[kind][0](), MODELS[kind][1]
    run = numerical.run_like_runtime

    def off_by_a_step(compiled, feeds, expected):
        outputs, overwritten = run(compiled, feeds, expected)
        return [out + step for out in outputs], overwritten

    monkeypatch.setattr(numerical, "run_like_runtime", off_by_a_step)
    x = torch.randn(8, 10, generator=torch.Generator().manual_seed(0))
    partitioner = partitioner_for(precision, sample_inputs=(x,), fold_constants=False)
    with pytest.raises(CpuKernelError):  # refused, the quantize / dequantize pair has no CPU kernel
        lower_exported(torch.export.export(model, (x,)), partitioner=partitioner)
    assert partitioner.numerical_check is not None
    assert partitioner.numerical_check.narrowed, "the shifted result was taken for rounding"
    _, detail = partitioner.numerical_check.narrowed[0]
    assert "100% of elements beyond rounding" in detail, detail


def test_a_result_is_judged_against_pytorch_s_own_spread_when_ties_round_the_other_way() -> None:
    want = torch.zeros(100)
    slack = torch.zeros(100)
    slack[::2] = 0.5  # ties rounding the other way move half the elements by a step
    judge = StepJudge(slack)
    a_few = want.clone()
    a_few[:10] = 0.5  # ten ties rounded the other way
    assert judge.judge(a_few, want, 1e-6, 1e-6)[0]
    assert not judge.judge(want + 0.5, want, 1e-6, 1e-6)[0]  # a step everywhere: not rounding
    two_steps = want.clone()
    two_steps[0] = 1.0  # one element further than any tie moves one
    assert not judge.judge(two_steps, want, 1e-6, 1e-6)[0]
    assert judge.judge(want + 0.5, want, 0.5, 0)[0]  # what float rounding explains is not counted


def test_the_furthest_element_may_stand_past_pytorch_s_roundings_by_as_much_as_two_of_them_differ() -> None:
    # Activations quantized on the fly through many layers: which element moves furthest depends on
    # which values each rounding tipped, so a correct engine's furthest element lands past both of
    # PyTorch's roundings by up to how far apart those two land; its RMS has no such allowance.
    want = torch.zeros(1000)
    slack = torch.full((1000,), 0.1)
    slack[0] = 1.0  # the furthest either of PyTorch's roundings moved an element
    engine = torch.full((1000,), 0.05)
    engine[500] = 1.3  # another rounding: its furthest element elsewhere, and further
    assert not StepJudge(slack).judge(engine, want, 0, 0)[0]  # one rounding ran: no spread to allow
    assert StepJudge(slack, spread=0.5).judge(engine, want, 0, 0)[0]
    ok, how = StepJudge(slack, spread=0.2).judge(engine, want, 0, 0)
    assert not ok and "two of them 0.2 apart at most" in how
    assert not StepJudge(slack, spread=0.5).judge(torch.full((1000,), 0.2), want, 0, 0)[0]  # RMS: refused


def test_an_unknown_precision_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(CompileSpecError, match=r"(?s)unknown inference_precision 'fp32'.*f32, bf16, f16"):
        OpenvinoPartitioner([CompileSpec("inference_precision", b"fp32")])


def test_a_quantize_dequantize_pair_never_straddles_the_partition_edge() -> None:
    program = torch.export.export(RoundTrip(), (ties(),))
    (quantize,) = [n for n in program.graph.nodes if is_quantize(n)]
    (dequantize,) = quantize.users
    rest = {n for n in program.graph.nodes if n.op == "call_function"} - {quantize, dequantize}

    def refused(nodes: set) -> list:
        return [node for node, _ in keep_quantize_pairs_together(PartitionView(frozenset(nodes), program))]

    assert refused({quantize}) == [quantize]
    assert refused({dequantize, *rest}) == [dequantize]
    assert refused({quantize, dequantize}) == []
    assert refused({quantize, dequantize, *rest}) == []


def test_a_refused_dequantize_takes_its_quantize_out_with_a_reason_naming_the_pair(monkeypatch) -> None:
    """The numerical check blames a dequantize: its quantize follows it out, and export says why
    (the runtime has no CPU kernel for either)."""
    check = numerical.NumericalCheck.__call__

    def blame_the_dequantize(self, part):
        for node in part.ordered():
            if op_name(node).startswith("quantized_decomposed.dequantize"):
                yield node, "blamed by this test"
                return
        yield from check(self, part)

    monkeypatch.setattr(numerical.NumericalCheck, "__call__", blame_the_dequantize)
    x = torch.randn(8, 10)
    with pytest.raises(CpuKernelError) as caught:
        lower_exported(torch.export.export(RoundTrip(), (x,)), partitioner=OpenvinoPartitioner(fold_constants=False))
    assert "blamed by this test" in str(caught.value)
    assert "quantize whose dequantize runs outside the partition" in str(caught.value)


def test_a_rerun_holds_only_the_values_it_is_asked_for() -> None:
    """The judges rerun a whole partition (a decoder, its caches in every layer) in PyTorch: each
    changed value is dropped once its last reader has run, so the rerun holds a layer's values, and
    it returns only the outputs being judged."""
    from openvino_backend.partition.quantized import _rerun

    class Chain(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            a = x * 2
            b = a + 1
            c = torch.relu(b)
            return c * 3, b - 1

    graph = torch.fx.symbolic_trace(Chain()).graph
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    x = next(n for n in graph.nodes if n.op == "placeholder")
    first, *_, out_b = nodes
    values = {x: torch.ones(4)}
    for node in nodes:
        args = torch.fx.node.map_arg(node.args, values.__getitem__)
        values[node] = node.target(*args)

    def doubled(node: torch.fx.Node, args: tuple, kwargs: dict) -> object:
        return node.target(*args, **kwargs) * 2

    changed = _rerun(nodes, values, {first: doubled}, [out_b])
    assert list(changed) == [out_b]  # every other changed value was dropped once read
    assert torch.equal(changed[out_b], torch.full((4,), 4.0))  # (1 * 2 * 2 + 1) - 1


def test_reruns_side_by_side_read_each_value_once_and_match_reruns_one_by_one() -> None:
    """The two reruns of the dynamic judges (ties rounded to nearest and flipped) read a compressed
    weight's dequantized value, computed again each time it is read: side by side, each value they
    read is read once, and each rerun is what it is alone."""
    from openvino_backend.partition.quantized import _rerun, _reruns

    class Linear(torch.nn.Module):
        def forward(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            weight = torch.mul(w, 0.5)  # stands for a weight's dequantize
            return torch.relu(torch.matmul(x, torch.transpose(weight, 0, 1))) + 1

    graph = torch.fx.symbolic_trace(Linear()).graph
    x, w = (n for n in graph.nodes if n.op == "placeholder")
    nodes = [n for n in graph.nodes if n.op == "call_function"]
    _, _, matmul, *_, out = nodes
    values: dict[torch.fx.Node, object] = {x: torch.randn(3, 8), w: torch.randn(5, 8)}
    for node in nodes:
        args = torch.fx.node.map_arg(node.args, values.__getitem__)
        values[node] = node.target(*args)

    class Counted(dict):
        def __init__(self, values: dict) -> None:
            super().__init__(values)
            self.reads: Counter = Counter()

        def __getitem__(self, node: torch.fx.Node) -> object:
            self.reads[node] += 1
            return super().__getitem__(node)

    def scaled_by(factor: float):
        return lambda node, args, kwargs: node.target(*args, **kwargs) * factor

    variants = [{matmul: scaled_by(2.0)}, {matmul: scaled_by(-1.0)}]
    counted = Counted(values)
    side_by_side = _reruns(nodes, counted, variants, [out])
    assert max(counted.reads.values()) == 1, counted.reads
    for variant, rerun in zip(variants, side_by_side, strict=True):
        alone = _rerun(nodes, values, variant, [out])
        assert list(rerun) == [out] and torch.equal(rerun[out], alone[out])
    assert not torch.equal(side_by_side[0][out], side_by_side[1][out])
