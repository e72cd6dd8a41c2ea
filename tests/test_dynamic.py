"""Dynamic shapes: the right shapes at every size in the range, or a typed error at export."""

from __future__ import annotations

from collections.abc import Callable

import openvino as ov
import pytest
import torch
from torch.export import Dim
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from openvino_backend.diagnostics import DimOrderError, EdgeTensorError
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.tools.verify import check_run, delegate_ids, lower_exported, run_program
from zoo import MLP, Decoder, Policy, SmallCNN

BATCH = Dim("batch", min=1, max=8)
SEQ = Dim("seq", min=2, max=32)

# name: (model, example input maker, dynamic dim, sizes to run at (low end, example, upper end), terms)
MODELS = {
    "mlp": (MLP, lambda n: torch.randn(n, 16), 0, BATCH, (1, 3, 8), 4),
    "cnn-batch-norm": (SmallCNN, lambda n: torch.randn(n, 3, 16, 16), 0, BATCH, (1, 2, 8), 64),
    "transformer-encoder": (Policy, lambda n: torch.randn(n, 8, 24), 0, BATCH, (1, 2, 8), 16),
    "decoder-sequence": (Decoder, lambda n: torch.randint(0, 100, (1, n)), 1, SEQ, (2, 8, 32), 16),
}
SLOW_MODELS = ("transformer-encoder", "decoder-sequence")


# The transformers run in the README's command; the inner loop keeps the MLP and the CNN.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in SLOW_MODELS else n for n in MODELS])
def test_dynamic_model_is_delegated_and_right_at_every_size(name: str) -> None:
    build, make, dim, bound, (low, example, high), terms = MODELS[name]
    module = build().eval()
    exported = torch.export.export(module, (make(example),), dynamic_shapes=({dim: bound},))
    partitioner = OpenvinoPartitioner()
    program = lower_exported(exported, partitioner=partitioner)
    # Everything but the CPU slice that restores each output's size runs in OpenVINO.
    assert partitioner.report.partitions == 1
    assert partitioner.report.delegated_share >= 0.95, partitioner.report.kept_out
    for size in (low, example, high):
        report = check_run(module, program.buffer, [make(size)], terms=terms)
        assert report.error is None, report.error
        for out in report.outputs:
            assert out.values_ok, f"size {size}, output {out.index} {out.shape}: max abs error {out.max_abs:.3g}"


def test_dynamic_outputs_stay_on_the_cpu_when_padding_is_off() -> None:
    module = SmallCNN().eval()
    partitioner = OpenvinoPartitioner(pad_dynamic_outputs=False)
    program = lower_exported(_export(module, torch.randn(2, 3, 16, 16)), partitioner=partitioner)
    assert partitioner.report.delegated_share < 0.5
    assert any("does not resize" in kept.reason for kept in partitioner.report.kept_out)
    _assert_runs_at(program, module, [(1, 3, 16, 16), (8, 3, 16, 16)])


class Model(torch.nn.Module):
    def forward(self, x):
        return (x * 2).sin(), x.amax(dim=(0, 2, 3))


def _export(module: torch.nn.Module, x: torch.Tensor) -> torch.export.ExportedProgram:
    return torch.export.export(module.eval(), (x,), dynamic_shapes=({0: BATCH},))


def _assert_runs_at(program, module: torch.nn.Module, sizes: list[tuple[int, ...]]) -> None:
    generator = torch.Generator().manual_seed(0)
    for size in sizes:
        x = torch.randn(size, generator=generator)
        with torch.no_grad():
            expected = module(x)
        expected = expected if isinstance(expected, tuple) else (expected,)
        actual = run_program(program.buffer, [x])
        for got, want in zip(actual, expected, strict=True):
            assert got.shape == want.shape, f"at input size {size}: got shape {tuple(got.shape)}, eager {want.shape}"
            torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)


def test_dynamic_batch_runs_at_every_size() -> None:
    partitioner = OpenvinoPartitioner()
    program = lower_exported(_export(Model(), torch.randn(2, 3, 4, 5)), partitioner=partitioner)
    assert delegate_ids(program) == ["OpenvinoBackend"]
    _assert_runs_at(program, Model(), [(1, 3, 4, 5), (3, 3, 4, 5), (8, 3, 4, 5)])


def test_cnn_with_batch_norm_returns_the_right_shape_at_every_batch() -> None:
    # Batch norm's output is a tuple read through getitem: the edge rules must
    # look through it. This model once returned (8, 10) at batch 1 and 2.
    module = SmallCNN().eval()
    program = lower_exported(_export(module, torch.randn(2, 3, 16, 16)), partitioner=OpenvinoPartitioner())
    _assert_runs_at(program, module, [(1, 3, 16, 16), (2, 3, 16, 16), (8, 3, 16, 16)])


def test_preprocess_refuses_a_dynamic_output_on_its_own() -> None:
    # With the edge rules, the conversion check and the padding off, nothing
    # keeps the dynamic output off the edge: preprocess must refuse it, naming
    # the node and the user's line.
    module = SmallCNN().eval()
    partitioner = OpenvinoPartitioner(
        boundary_rules=(), check_by_conversion=False, check_numerics=False, pad_dynamic_outputs=False
    )
    with pytest.raises(EdgeTensorError) as caught:
        lower_exported(_export(module, torch.randn(2, 3, 16, 16)), partitioner=partitioner)
    text = str(caught.value)
    assert "dynamic shape" in text and "does not resize" in text
    assert "zoo.py" in text, text  # the user's line, not torch's module source


class FullReduction(torch.nn.Module):
    def forward(self, x):
        return (x * 3).sum(), x.cos()


def test_preprocess_refuses_a_0d_output_on_its_own() -> None:
    partitioner = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False, check_numerics=False)
    exported = torch.export.export(FullReduction(), (torch.randn(3, 4),))
    with pytest.raises(EdgeTensorError, match="0-d tensor"):
        lower_exported(exported, partitioner=partitioner)


def test_dynamic_channels_last_input_is_refused_with_its_reader() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    with pytest.raises(DimOrderError) as caught:
        lower_exported(_export(Model(), x), partitioner=OpenvinoPartitioner())
    text = str(caught.value)
    assert "dynamic shape" in text and "x.amax(dim=(0, 2, 3))" in text and "test_dynamic.py" in text


class Expressions(torch.nn.Module):
    """Outputs whose dynamic sizes are expressions of the inputs' sizes."""

    def forward(self, x, y):
        stacked = torch.cat([x.sin(), y.cos()], dim=0)  # s0 + s1 rows
        return stacked, x.reshape(-1) * 2, torch.nn.functional.avg_pool2d(x[None], 2)  # 4 * s0 * s2, s0 // 2 ...


def test_outputs_sized_by_expressions_of_several_dims() -> None:
    module = Expressions()
    rows, other, cols = Dim("rows", min=2, max=9), Dim("other", min=1, max=5), Dim("cols", min=4, max=12)
    exported = torch.export.export(
        module, (torch.randn(4, 4, 6), torch.randn(3, 4, 6)), dynamic_shapes=({0: rows, 2: cols}, {0: other, 2: cols})
    )
    partitioner = OpenvinoPartitioner()
    program = lower_exported(exported, partitioner=partitioner)
    assert partitioner.report.delegated_share == 1.0, partitioner.report.kept_out
    for r, o, c in ((2, 1, 4), (4, 3, 6), (9, 5, 12), (3, 5, 7)):
        report = check_run(module, program.buffer, [torch.randn(r, 4, c), torch.randn(o, 4, c)])
        assert report.ok, report


class LogicalOps(torch.nn.Module):
    def forward(self, x, y):
        a, b = x > 0, y > 0
        return torch.logical_and(a, b), torch.logical_or(a, b), torch.logical_xor(a, b), x.abs()


LOGICAL = {
    "aten.logical_and.default": torch.logical_and,
    "aten.logical_or.default": torch.logical_or,
    "aten.logical_xor.default": torch.logical_xor,
}


class OneLogicalOp(torch.nn.Module):
    def __init__(self, op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.op = op

    def forward(self, x, y):
        return self.op(x > 0, y > 0)


def frontend_converts(op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> bool:
    """Whether the installed OpenVINO converts ``op`` on its own, asked of OpenVINO directly
    (``ov.convert_model``, its PyTorch frontend), not through this package."""
    exported = torch.export.export(OneLogicalOp(op), (torch.randn(2, 3), torch.randn(2, 3)))
    try:
        ov.convert_model(exported)
    except Exception as error:  # OpenVINO raises bare RuntimeErrors
        assert "No conversion rule found" in str(error), error  # any other failure is not the question
        return False
    return True


def test_logical_ops_run_in_openvino() -> None:
    # Not in OpenVINO's op-support table, but its FX frontend translates them: logical_and on every
    # OpenVINO line, logical_or and logical_xor from 2026.x on (2025.4's frontend has no rule for
    # them). Which ones the installed OpenVINO converts is asked of OpenVINO itself: each of those is
    # delegated; each other one is kept out, with OpenVINO's own words for the missing conversion
    # (the conversion check learns it from converting the partition), and the program still runs.
    partitioner = OpenvinoPartitioner()
    module = LogicalOps()
    inputs = [torch.randn(4, 5), torch.randn(4, 5)]
    program = lower_exported(torch.export.export(module, tuple(inputs)), partitioner=partitioner)
    assert frontend_converts(torch.logical_and)  # so every line delegates an op beyond the table
    missing = {name for name, op in LOGICAL.items() if not frontend_converts(op)}
    kept = {kept.node.op: kept for kept in partitioner.report.kept_out}
    assert set(kept) == missing, partitioner.report.kept_out
    for name in missing:
        assert "No conversion rule found for operations" in kept[name].reason, kept[name]
        assert name in kept[name].reason.rsplit(":", 1)[-1], kept[name]  # the op OpenVINO names
    report = partitioner.report
    assert report.delegated_nodes == report.total_nodes - len(missing), report
    assert check_run(module, program.buffer, inputs).ok


class CutInTheMiddle(torch.nn.Module):
    """A chain of ops over a dynamic batch, cut in its middle by an op left to the CPU."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(8):
            x = (x * 1.5).sin()
        x = torch.atan(x)  # kept on the CPU (op_types_to_skip)
        return (x + 1).cos()


def test_a_dynamic_chain_cut_in_its_middle_settles_in_a_round_of_proposals(monkeypatch) -> None:
    # Every value before the cut has a dynamic batch, so none may leave a partition: all of it goes to
    # the CPU. Refused op by op, that took a round of proposals per op (hundreds for a decoder).
    rounds = []
    propose = CapabilityBasedPartitioner.propose_partitions

    def counted(self):
        rounds.append(len(self.graph_module.graph.nodes))
        return propose(self)

    monkeypatch.setattr(CapabilityBasedPartitioner, "propose_partitions", counted)
    module = CutInTheMiddle().eval()
    partitioner = OpenvinoPartitioner(op_types_to_skip={"aten.atan.default"})
    program = lower_exported(_export(module, torch.randn(2, 6)), partitioner=partitioner)
    kept = {k.node.name: k.reason for k in partitioner.report.kept_out}
    assert sum("sin" in name for name in kept) == 8, kept  # the whole chain before the cut
    assert len(rounds) <= 3, f"{len(rounds)} rounds of proposals"
    for n in (1, 5, 8):
        x = torch.randn(n, 6)
        (got,) = run_program(program.buffer, [x])
        torch.testing.assert_close(got, module(x), atol=1e-2, rtol=1e-2)
