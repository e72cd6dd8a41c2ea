"""The timing hook bench reads: stages recorded inside ``recording()``, nothing outside it."""

from __future__ import annotations

import torch

from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.timing import recording, timed
from openvino_backend.tools.verify import lower_exported


class SinTimesTwo(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2


def test_lowering_records_each_stage_it_runs() -> None:
    exported = torch.export.export(SinTimesTwo(), (torch.randn(4, 4),))
    with recording() as seconds:
        lower_exported(exported, partitioner=OpenvinoPartitioner())
    for stage in ("pre_decomposition", "partition", "conversion_check", "numerical_check", "preprocess"):
        assert seconds[stage] > 0, stage
    # The checks run inside the partitioner's own time.
    assert seconds["partition"] >= seconds["conversion_check"]


def test_nothing_is_recorded_outside_a_recording_and_generators_are_timed_while_producing() -> None:
    @timed("rule")
    def rule():
        yield 1
        yield 2

    assert list(rule()) == [1, 2]  # no recording: runs as it is
    with recording() as seconds:
        assert list(rule()) == [1, 2]
    assert set(seconds) == {"rule"}
