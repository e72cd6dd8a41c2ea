"""Tensors in a non-default dim order at the partition edge: kept out, or refused.

Each trigger from the review of the original fix must either run and match
eager (the partitioner keeps the layout-changing nodes on the CPU), or fail
at export with a ``DimOrderError`` when that rule is switched off.
"""

from __future__ import annotations

import pytest
import torch

from openvino_backend import (
    DimOrderError,
    OpenvinoPartitioner,
    keep_boundary_copies_out,
    keep_unbindable_tensors_out,
)
from openvino_backend.verify import lower
from tests.harness import NO_DIM_ORDER, execute_layer_test

CL = torch.channels_last


class CopyUsedInsideAndOutside(torch.nn.Module):
    def forward(self, x):
        y = x.clone(memory_format=CL)
        return y, y.mean(dim=(2, 3))


class CloneChain(torch.nn.Module):
    def forward(self, x):
        a = x.clone(memory_format=CL)
        b = a.clone()
        return a, b.sum(1)


class ChannelsLastOutput(torch.nn.Module):
    def forward(self, x):
        return (x * 2).to(memory_format=CL)


class ChannelsLastInput(torch.nn.Module):
    def forward(self, x):
        return x.mean(dim=(2, 3)), x.sum(dim=1)


class CopyThenElementwise(torch.nn.Module):
    def forward(self, x):
        y = x.clone(memory_format=CL)
        return y, y.sin()


def _contiguous():
    return torch.randn(2, 3, 4, 5)


def _channels_last():
    return torch.randn(2, 3, 4, 5).to(memory_format=CL)


TRIGGERS = {
    "copy_used_inside_and_outside": (CopyUsedInsideAndOutside, _contiguous, None),
    "clone_chain": (CloneChain, _contiguous, None),
    "channels_last_output": (ChannelsLastOutput, _contiguous, None),
    "channels_last_input": (ChannelsLastInput, _channels_last, None),
}
NO_DIM_ORDER_TRIGGER = {"no_dim_order_copy_leaves": (CopyThenElementwise, _contiguous, NO_DIM_ORDER)}


@pytest.mark.parametrize("trigger", TRIGGERS.values(), ids=TRIGGERS.keys())
def test_trigger_runs_and_matches_eager(trigger) -> None:
    module, make_input, config = trigger
    # Whatever OpenVINO keeps, the program must compute eager's values, in eager's memory format.
    execute_layer_test(module(), (make_input(),), expected_partitions=None, compile_config=config, terms=20)


def test_channels_last_copy_without_dim_order_fails_at_export() -> None:
    # With dim order off, ExecuTorch itself cannot run a channels-last clone on
    # the CPU, and OpenVINO may not return it (it is a copy of an input): the
    # export fails, which is the promise (never a silently wrong value).
    with pytest.raises(Exception, match="memory_format that is unsupported in ExecuTorch"):
        lower(CopyThenElementwise(), (_contiguous(),), compile_config=NO_DIM_ORDER)


ALL_TRIGGERS = {**TRIGGERS, **NO_DIM_ORDER_TRIGGER}


@pytest.mark.parametrize("trigger", ALL_TRIGGERS.values(), ids=ALL_TRIGGERS.keys())
def test_trigger_is_refused_at_export_without_the_dim_order_rule(trigger) -> None:
    module, make_input, config = trigger
    partitioner = OpenvinoPartitioner(boundary_rules=(keep_boundary_copies_out, keep_unbindable_tensors_out))
    with pytest.raises(DimOrderError) as caught:
        lower(module(), (make_input(),), partitioner=partitioner, compile_config=config)
    text = str(caught.value)
    assert "dim order (0, 2, 3, 1)" in text
    assert "why:" in text and "fix:" in text
    # The error points at the user's code.
    assert caught.value.locations and all(loc.file == __file__ for loc in caught.value.locations)


def test_channels_last_output_error_names_the_line() -> None:
    partitioner = OpenvinoPartitioner(boundary_rules=())
    with pytest.raises(DimOrderError) as caught:
        lower(ChannelsLastOutput(), (_contiguous(),), partitioner=partitioner)
    assert [f.message for f in caught.value.findings] == ["output 0 leaves in dim order (0, 2, 3, 1)"]
    assert "return (x * 2).to(memory_format=CL)" in str(caught.value)


def test_layout_that_equals_contiguous_is_not_refused() -> None:
    # Channels-last with H = W = 1 is the same bytes as contiguous: nothing to keep out.
    class Pooled(torch.nn.Module):
        def forward(self, x):
            return x.sin()

    x = torch.randn(2, 3, 1, 1).to(memory_format=CL)
    execute_layer_test(Pooled(), (x,), expected_partitions=1)
