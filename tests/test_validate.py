"""The export-time safety net: no Result fed by a Parameter, ever."""

from __future__ import annotations

import inspect
import logging

import numpy as np
import openvino as ov
import openvino.opset13 as opset
import pytest
import torch

import openvino_backend.lowering.preprocess as preprocess
from openvino_backend.diagnostics import OutputTypeError, PassthroughOutputError
from openvino_backend.lowering.validate import validate_compiled, validate_model
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.runtime import inference_precision
from openvino_backend.tools.verify import check_run, lower
from tests.harness import NO_DIM_ORDER, execute_layer_test


def _model(outputs) -> ov.Model:
    x = opset.parameter([2, 3], np.float32, name="x")
    y = opset.parameter([2, 3], np.float32, name="y")
    nodes = {"x": x, "y": y, "sin": opset.sin(x), "add": opset.add(x, y)}
    return ov.Model([nodes[o].output(0) for o in outputs], [x, y])


@pytest.mark.parametrize(
    ("outputs", "offending"),
    [
        (["x"], (0,)),
        (["x", "x"], (0, 1)),
        (["sin", "y", "add", "x"], (1, 3)),
        (["sin", "add"], ()),
    ],
    ids=["param_to_result", "two_results_one_param", "among_good_outputs", "none"],
)
def test_validate_model_reports_every_offending_result(outputs, offending) -> None:
    model = _model(outputs)
    if not offending:
        validate_model(model)
        return
    with pytest.raises(PassthroughOutputError) as caught:
        validate_model(model)
    assert caught.value.output_indices == offending
    assert len(caught.value.findings) == len(offending)


def test_validate_compiled_checks_the_runtime_graph() -> None:
    compiled = ov.Core().compile_model(_model(["sin", "x"]), "CPU")
    with pytest.raises(PassthroughOutputError) as caught:
        validate_compiled(compiled)
    assert caught.value.output_indices == (1,)
    assert "while compiling" in str(caught.value)
    validate_compiled(ov.Core().compile_model(_model(["sin", "add"]), "CPU"))


class CopyThenSin(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        y = x.clone()  # the copy the validator must find
        return y, torch.sin(y)


def _line_of(marker: str) -> int:
    lines, start = inspect.getsourcelines(CopyThenSin)
    return start + next(i for i, line in enumerate(lines) if marker in line)


@pytest.mark.parametrize("dim_order", [True, False], ids=["dim_order", "no_dim_order"])
def test_safety_net_catches_a_copy_the_partitioner_let_through(dim_order: bool) -> None:
    unguarded = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False, check_numerics=False)
    config = None if dim_order else NO_DIM_ORDER
    with pytest.raises(PassthroughOutputError) as caught:
        lower(CopyThenSin(), (torch.randn(3, 4),), partitioner=unguarded, compile_config=config)
    error = caught.value
    assert error.partition == 0
    assert error.output_indices == (0,)
    assert error.ops == ("aten.clone.default",)  # dim-order clones are reverted to aten.clone first
    assert [loc.line for loc in error.locations] == [_line_of("the copy the validator must find")]
    assert all(loc.file == __file__ for loc in error.locations)
    text = str(error)
    assert "would return input `x` unchanged as output 0" in text
    assert f"test_validate.py:{_line_of('the copy the validator must find')}" in text
    assert "y = x.clone()" in text
    assert "why:" in text and "stale memory" in text and ov.get_version().split("-")[0] in text
    assert "fix:" in text and "op_types_to_skip={'aten.clone.default'}" in text

    # With the partitioner's rules on, the same model exports and runs correctly.
    execute_layer_test(CopyThenSin(), (torch.randn(3, 4),), compile_config=config)


def test_without_either_guard_the_program_returns_stale_memory(monkeypatch) -> None:
    """The bug is real here, and the comparison sees it: the guards are what make tests pass."""
    monkeypatch.setattr(preprocess, "validate_model", lambda *a, **k: None)
    monkeypatch.setattr(preprocess, "validate_compiled", lambda *a, **k: None)
    x = torch.randn(3, 4)
    program = lower(
        CopyThenSin(),
        (x,),
        partitioner=OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False, check_numerics=False),
    )
    report = check_run(CopyThenSin(), program.buffer, (x,))
    assert not report.ok
    assert not report.outputs[0].values_ok


def test_reduced_precision_is_announced_once_per_export(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="openvino_backend")
    lower(CopyThenSin(), (torch.randn(3, 4),))
    warnings = [r for r in caplog.records if "INFERENCE_PRECISION_HINT" in r.getMessage()]
    if inference_precision("CPU") == torch.float32:
        assert warnings == []
    else:
        assert len(warnings) == 1
        assert str(inference_precision("CPU")) in warnings[0].getMessage()


def test_integer_partitions_are_not_warned_about(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="openvino_backend")
    lower(IntOnly(), (torch.arange(6),))
    assert not [r for r in caplog.records if "INFERENCE_PRECISION_HINT" in r.getMessage()]


class IntOnly(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return x * 3 + 1


class CumsumOfBools(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return torch.cumsum(x > 0, 0)  # typed as boolean by OpenVINO, int64 by PyTorch


def test_safety_net_refuses_an_output_openvino_types_differently() -> None:
    partitioner = OpenvinoPartitioner(check_by_conversion=False, check_numerics=False)
    with pytest.raises(OutputTypeError) as caught:
        lower(CumsumOfBools(), (torch.rand(300),), partitioner=partitioner)
    error = caught.value
    assert error.output_indices == (0,)
    assert error.ops == ("aten.cumsum.default",)
    text = str(error)
    assert "PyTorch int64" in text and "torch.cumsum(x > 0, 0)" in text
    assert "op_types_to_skip={'aten.cumsum.default'}" in text
