"""Dynamic shapes: what the runtime cannot resize stays out; what cannot be adapted is refused."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

from openvino_backend import DimOrderError, OpenvinoPartitioner
from openvino_backend.verify import delegate_ids, lower_exported, run_program


class Model(torch.nn.Module):
    def forward(self, x):
        return (x * 2).sin(), x.amax(dim=(0, 2, 3))


def _export(x: torch.Tensor) -> torch.export.ExportedProgram:
    return torch.export.export(Model(), (x,), dynamic_shapes=({0: Dim("batch", min=1, max=8)},))


def test_dynamic_batch_runs_at_every_size() -> None:
    partitioner = OpenvinoPartitioner()
    program = lower_exported(_export(torch.randn(2, 3, 4, 5)), partitioner=partitioner)
    # The static-shape reduction is delegated; the dynamic-shape outputs stay on
    # the CPU, since the OpenVINO runtime never resizes a delegate's outputs.
    assert delegate_ids(program) == ["OpenvinoBackend"]
    assert any("dynamic shape" in why for _, why in partitioner.report.kept_out)
    for batch in (1, 3, 8):
        x = torch.randn(batch, 3, 4, 5)
        values, amax = run_program(program.buffer, [x])
        torch.testing.assert_close(values, (x * 2).sin())
        torch.testing.assert_close(amax, x.amax(dim=(0, 2, 3)))


def test_dynamic_channels_last_input_is_refused_with_its_reader() -> None:
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    with pytest.raises(DimOrderError) as caught:
        lower_exported(_export(x), partitioner=OpenvinoPartitioner())
    text = str(caught.value)
    assert "dynamic shape" in text and "x.amax(dim=(0, 2, 3))" in text and "test_dynamic.py" in text
