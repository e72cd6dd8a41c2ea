"""Copies of partition inputs at the partition edge (the seed's tests and more)."""

from __future__ import annotations

import pytest
import torch

from tests.harness import NO_DIM_ORDER, execute_layer_test, non_delegated_ops

COPIES = {
    "clone": lambda x: x.clone(),
    "detach": lambda x: x.detach(),
    "full_slice": lambda x: x[:, :],
    "clone_clone": lambda x: x.clone().clone(),
}


class CopyThenSin(torch.nn.Module):
    def __init__(self, copy) -> None:
        super().__init__()
        self.copy = copy

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = self.copy(x)
        return y, torch.sin(y)


@pytest.mark.parametrize("dim_order", [True, False], ids=["dim_order", "no_dim_order"])
@pytest.mark.parametrize("copy", COPIES.values(), ids=COPIES.keys())
def test_copy_of_input_as_output(copy, dim_order: bool) -> None:
    config = None if dim_order else NO_DIM_ORDER
    program = execute_layer_test(CopyThenSin(copy), (torch.randn(4, 6),), compile_config=config)
    # The copy runs on the ExecuTorch CPU kernel, outside the delegate.
    outside = non_delegated_ops(program)
    assert any("clone" in op or "alias" in op for op in outside), outside


class CopyUsedInside(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.clone(memory_format=torch.channels_last)
        return y.mean(dim=(2, 3))


@pytest.mark.parametrize("dim_order", [True, False], ids=["dim_order", "no_dim_order"])
def test_copy_of_input_used_inside(dim_order: bool) -> None:
    config = None if dim_order else NO_DIM_ORDER
    program = execute_layer_test(CopyUsedInside(), (torch.randn(2, 3, 4, 5),), compile_config=config, terms=20)
    # The copy stays inside the partition: nothing but the delegate runs.
    assert non_delegated_ops(program) == []


class SwappedCopies(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor):
        return y.clone(), x.clone(), x + y


def test_two_inputs_copied_in_swapped_order() -> None:
    execute_layer_test(SwappedCopies(), (torch.randn(3, 4), torch.randn(3, 4)))


class IntCopy(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        y = x.clone()
        return y, y * 3 + 1


def test_int64_copy_of_input() -> None:
    execute_layer_test(IntCopy(), (torch.randint(-100, 100, (5, 3), dtype=torch.int64),))


class CopyBesideOtherUses(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        return x.clone(), x.sin(), x * 2


def test_copy_returned_while_input_feeds_other_ops() -> None:
    execute_layer_test(CopyBesideOtherUses(), (torch.randn(8, 8),))


class CopyOfOutput(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        y = x.sin()
        return y, y.clone()


@pytest.mark.parametrize("dim_order", [True, False], ids=["dim_order", "no_dim_order"])
def test_copy_of_an_output(dim_order: bool) -> None:
    # Without the rule, both outputs name one OpenVINO tensor and the frontend fails.
    execute_layer_test(CopyOfOutput(), (torch.randn(4, 4),), compile_config=None if dim_order else NO_DIM_ORDER)


class TwoCopiesOfInner(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        s = x.sin()
        return s.clone(), s.clone().clone(), (s * 2).detach()


def test_two_copies_of_one_inner_tensor() -> None:
    execute_layer_test(TwoCopiesOfInner(), (torch.randn(4, 4),))


class CopyUsedInsideAndOutside(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        y = x.clone()
        return y, (y * 2).sum(dim=1)


def test_copy_used_inside_and_outside() -> None:
    execute_layer_test(CopyUsedInsideAndOutside(), (torch.randn(4, 16),), terms=16)
