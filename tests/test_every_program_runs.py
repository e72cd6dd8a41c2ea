"""Every exported program runs: what OpenVINO does not take, ExecuTorch's kernels can; or export says why."""

from __future__ import annotations

import pytest
import torch

from openvino_backend.diagnostics import CpuKernelError, FusionOrderError
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.tools.verify import lower
from tests.harness import execute_layer_test, non_delegated_ops


class Detach(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach()


class SinOfEmpty(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) * 2


class ShuffleAfterAdd(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pixel_shuffle(x + torch.arange(5), 2)


class OneHotOfArgmax(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.one_hot(torch.argmax(x, -1), 5).float()


class CeilPool3d(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.avg_pool3d(x, 2, stride=2, ceil_mode=True)


def _channels_last() -> torch.Tensor:
    return torch.randn(1, 3, 4, 4).contiguous(memory_format=torch.channels_last)


def test_a_layout_changing_copy_of_an_input_runs_in_openvino() -> None:
    # ExecuTorch's edge program returns a contiguous alias_copy of the channels-last input; its
    # portable kernel refuses two dim orders (error 0x12). In OpenVINO it is a real transpose.
    program = execute_layer_test(Detach(), (_channels_last(),), expected_partitions=1)
    assert non_delegated_ops(program) == []


def test_a_layout_changing_copy_left_on_the_cpu_is_refused_at_export() -> None:
    partitioner = OpenvinoPartitioner(op_types_to_skip={"aten.alias_copy.default"})
    with pytest.raises(CpuKernelError) as caught:
        lower(Detach(), (_channels_last(),), partitioner=partitioner)
    text = str(caught.value)
    assert "different dim orders" in text and "return x.detach()" in text and ".contiguous()" in text


def test_empty_tensors_stay_off_the_openvino_edge() -> None:
    partitioner = OpenvinoPartitioner()
    execute_layer_test(SinOfEmpty(), (torch.randn(0, 3),), expected_partitions=0, partitioner=partitioner)
    assert any("empty tensor (0, 3)" in kept.reason for kept in partitioner.report.kept_out)


def test_an_op_kept_whole_but_not_delegated_is_decomposed_for_the_cpu() -> None:
    # OpenVINO's table has no pixel_shuffle: it must not be kept whole for it.
    program = execute_layer_test(ShuffleAfterAdd(), (torch.randn(1, 4, 3, 5),), expected_partitions=None)
    assert "pixel_shuffle" not in " ".join(non_delegated_ops(program))


class Upsample(torch.nn.Module):
    # Nearest by default: upsample_nearest2d is in OpenVINO's op-support table on every line tested;
    # upsample_bilinear2d only from 2026.x on (2025.4's table omits it).
    def __init__(self, mode: str = "nearest") -> None:
        super().__init__()
        self.mode = mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.interpolate(x, scale_factor=2, mode=self.mode) * 2


def in_openvino_table(op: torch._ops.OpOverload) -> bool:
    """Whether the installed OpenVINO's own op-support table lists ``op``, read from OpenVINO."""
    from openvino.frontend.pytorch.torchdynamo.op_support import OperatorSupport

    return f"torch.ops.{str(op).replace('::', '.')}" in OperatorSupport([])._support_dict


def test_ops_are_kept_whole_per_op_only_where_openvino_takes_every_node() -> None:
    exported = torch.export.export(Upsample(), (torch.randn(1, 2, 3, 4),))
    kept, node_filter = OpenvinoPartitioner().ops_to_not_decompose(exported)
    # No per-node filter: with one, ExecuTorch runs the whole decomposition a second time.
    assert node_filter is None
    assert torch.ops.aten.upsample_nearest2d.vec in kept
    assert torch.ops.aten.pixel_shuffle.default not in kept  # not in OpenVINO's table
    skipping = OpenvinoPartitioner(op_types_to_skip={"aten.upsample_nearest2d.vec"})
    assert torch.ops.aten.upsample_nearest2d.vec not in skipping.ops_to_not_decompose(exported)[0]
    (node,) = exported.graph.find_nodes(op="call_function", target=torch.ops.aten.upsample_nearest2d.vec)
    by_name = OpenvinoPartitioner(op_names_to_skip={node.name})
    assert torch.ops.aten.upsample_nearest2d.vec not in by_name.ops_to_not_decompose(exported)[0]
    # An op OpenVINO's table lists from some release on is kept whole exactly where it is listed.
    bilinear = torch.export.export(Upsample("bilinear"), (torch.randn(1, 2, 3, 4),))
    op = torch.ops.aten.upsample_bilinear2d.vec
    assert (op in OpenvinoPartitioner().ops_to_not_decompose(bilinear)[0]) == in_openvino_table(op)


@pytest.mark.parametrize("skip", ["aten.upsample_nearest2d.vec", None], ids=["skipped", "delegated"])
def test_an_op_kept_whole_or_skipped_runs(skip: str | None) -> None:
    # Skipped, it is decomposed and runs on the CPU's kernels; otherwise OpenVINO takes it whole.
    partitioner = OpenvinoPartitioner(op_types_to_skip={skip} if skip else ())
    program = execute_layer_test(
        Upsample(), (torch.randn(1, 2, 3, 4),), expected_partitions=None, partitioner=partitioner
    )
    cpu = " ".join(non_delegated_ops(program))
    assert ("upsample" in cpu) == (skip is not None), cpu


def test_an_op_kept_whole_then_refused_is_a_typed_error() -> None:
    # The edge node's name is not the exported node's: the op is kept whole, then refused.
    partitioner = OpenvinoPartitioner(op_names_to_skip={"aten_upsample_nearest2d_vec"})
    with pytest.raises(CpuKernelError) as caught:
        lower(Upsample(), (torch.randn(1, 2, 3, 4),), partitioner=partitioner)
    assert "was kept whole for OpenVINO" in str(caught.value)
    # Why OpenVINO does not take it, and the rule that said so, in words.
    assert "skipped by the partitioner's op_types_to_skip / op_names_to_skip [skipped_by_user]" in str(caught.value)


def test_a_cpu_op_without_a_kernel_is_refused_at_export() -> None:
    with pytest.raises(CpuKernelError) as caught:
        lower(CeilPool3d(), (torch.randn(1, 2, 5, 5, 5),))
    text = str(caught.value)
    assert "no CPU kernel for aten::avg_pool3d.out" in text and "ceil-mode window" in text
    assert "avg_pool3d(x, 2, stride=2, ceil_mode=True)" in text


def test_checks_the_fusing_would_misplace_are_refused_with_a_typed_error() -> None:
    with pytest.raises(FusionOrderError) as caught:
        lower(OneHotOfArgmax(), (torch.randn(2, 3, 4),))
    text = str(caught.value)
    assert "one_hot" in text and "torch.arange(num_classes)" in text
