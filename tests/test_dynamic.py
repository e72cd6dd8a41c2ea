"""Dynamic shapes: the right shapes at every size in the range, or a typed error at export."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from openvino_backend import DimOrderError, EdgeTensorError, OpenvinoPartitioner
from openvino_backend.verify import delegate_ids, lower_exported, run_program
from tests.dynamic_models import SmallCNN

BATCH = Dim("batch", min=1, max=8)


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
    # With the edge rules and the conversion check off, nothing keeps the
    # dynamic output off the edge: preprocess must refuse it, naming the node
    # and the user's line.
    module = SmallCNN().eval()
    partitioner = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False)
    with pytest.raises(EdgeTensorError) as caught:
        lower_exported(_export(module, torch.randn(2, 3, 16, 16)), partitioner=partitioner)
    text = str(caught.value)
    assert "dynamic shape" in text and "does not resize" in text
    assert "dynamic_models.py" in text, text  # the user's line, not torch's module source


class FullReduction(torch.nn.Module):
    def forward(self, x):
        return (x * 3).sum(), x.cos()


def test_preprocess_refuses_a_0d_output_on_its_own() -> None:
    partitioner = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False)
    exported = torch.export.export(FullReduction(), (torch.randn(3, 4),))
    with pytest.raises(EdgeTensorError, match="0-d tensor"):
        lower_exported(exported, partitioner=partitioner)


def test_dynamic_channels_last_input_is_refused_with_its_reader() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    with pytest.raises(DimOrderError) as caught:
        lower_exported(_export(Model(), x), partitioner=OpenvinoPartitioner())
    text = str(caught.value)
    assert "dynamic shape" in text and "x.amax(dim=(0, 2, 3))" in text and "test_dynamic.py" in text
