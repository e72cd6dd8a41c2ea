"""Graphs the fuzzer found, kept as regression tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from openvino_backend.diagnostics import PassError
from openvino_backend.lowering.convert import convert
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.runtime import Tolerance, openvino_core
from openvino_backend.tools.verify import LoadedMethod, check_run, lower_exported
from tests.harness import execute_layer_test, non_delegated_ops


class ChannelsLastViewChain(torch.nn.Module):
    def forward(self, x):
        v = x.clone()
        return (v.unsqueeze(0).squeeze(0),)


def test_channels_last_input_through_copy_and_view_chain() -> None:
    # Found by the nightly fuzz run while layout changes were kept on the CPU:
    # ExecuTorch's portable unsqueeze_copy computes a channels-last input
    # wrongly (max error ~2). Adapted inside the ov.Model, the whole chain runs
    # in OpenVINO and matches eager.
    x = torch.randn(1, 3, 2, 1).to(memory_format=torch.channels_last)
    execute_layer_test(ChannelsLastViewChain(), (x,), expected_partitions=1)


class CumsumOfBools(torch.nn.Module):
    def forward(self, x):
        return torch.cumsum(x > 0, 0), (x > 0).sum(0, keepdim=True)


def test_output_typed_differently_by_openvino_is_kept_out() -> None:
    # OpenVINO computes cumsum of bools as boolean (PyTorch: int64): unbound at
    # run time (error 0x1) and wrong past 127 if converted. The conversion
    # check keeps the cumsum on the CPU; 300 elements would overflow i8.
    execute_layer_test(CumsumOfBools(), (torch.rand(300) + 0.1,), expected_partitions=1)


@pytest.mark.parametrize("dims", [1, 2])
def test_reflection_padding_matches_eager(dims: int) -> None:
    # Decomposed, reflection padding becomes arange/abs/index arithmetic that
    # OpenVINO 2026.4.1 computes wrongly (errors ~3); kept whole, it maps to
    # OpenVINO's reflect Pad. Found by ExecuTorch's backend suite (conv padding modes).
    conv = (torch.nn.Conv1d if dims == 1 else torch.nn.Conv2d)(6, 6, 3, padding=1, padding_mode="reflect")
    x = torch.randn(4, 6, 50) if dims == 1 else torch.randn(4, 6, 16, 16)
    execute_layer_test(conv, (x,), terms=54)


def test_avg_pool_ceil_window_overhanging_padding_stays_on_cpu() -> None:
    # PyTorch shrinks the divisor of a last ceil-mode window that overhangs the
    # padded input; OpenVINO does not (error ~0.6). Found by ExecuTorch's suite.
    pool = torch.nn.AvgPool1d(3, stride=2, padding=1, ceil_mode=True)
    program = execute_layer_test(pool, (torch.randn(1, 8, 100),), expected_partitions=None)
    assert "avg_pool2d.out" in non_delegated_ops(program)


class NarrowBySize(torch.nn.Module):
    def forward(self, x):
        v = x.unsqueeze(0).squeeze(0)
        return v.reshape(v.shape), torch.sin(v), v.narrow(0, 0, v.shape[0])


def test_dynamic_narrow_by_a_size_runs_in_openvino() -> None:
    # Found by the fuzzer's dynamic graphs: OpenVINO's frontend builds a Slice whose stop is a
    # size passed into the partition, of unknown rank at conversion; bound as the runtime binds
    # it (i64[1]) and given to the Slice as the 1-D bound it takes, it converts and runs.
    module = NarrowBySize()
    exported = torch.export.export(
        module, (torch.randn(2, 2, 3),), dynamic_shapes=({0: torch.export.Dim("n", min=2, max=6)},)
    )
    partitioner = OpenvinoPartitioner()
    program = lower_exported(exported, partitioner=partitioner)
    assert not any(kept.node.op == "aten.slice_copy.Tensor" for kept in partitioner.report.kept_out)
    for n in (2, 4, 6):
        report = check_run(module, program.buffer, [torch.randn(n, 2, 3)])
        assert report.ok, report


class ReturnsItsInput(torch.nn.Module):
    def forward(self, x, y):
        return x, y.sin()


def test_dynamic_channels_last_input_returned_unchanged_is_not_padded() -> None:
    # Found by the fuzzer: padding an output that is a program input gained
    # nothing and made a single-op partition over a dynamic channels-last
    # input, which cannot be layout-adapted (DimOrderError).
    module = ReturnsItsInput()
    n = torch.export.Dim("n", min=2, max=6)
    x = torch.randn(2, 2, 3, 2).to(memory_format=torch.channels_last)
    exported = torch.export.export(module, (x, torch.randn(2, 4)), dynamic_shapes=({0: n}, {0: n}))
    program = lower_exported(exported, partitioner=OpenvinoPartitioner())
    for size in (2, 6):
        inputs = [torch.randn(size, 2, 3, 2).to(memory_format=torch.channels_last), torch.randn(size, 4)]
        assert check_run(module, program.buffer, inputs).ok


class NegatedInt8Sum(torch.nn.Module):
    def forward(self, x):
        return ((-x).sum(dim=1, keepdim=True),)


def test_dynamic_output_openvino_types_differently_keeps_its_op_out_not_the_pad() -> None:
    # Found by the fuzzer once int8 inputs were drawn: OpenVINO sums int8 in i8 (PyTorch: int64).
    # The mismatch shows on the padded output; the sum must stay on the CPU, not the pad.
    n = torch.export.Dim("n", min=2, max=6)
    exported = torch.export.export(
        NegatedInt8Sum(), (torch.randint(-5, 6, (3, 4), dtype=torch.int8),), dynamic_shapes=({0: n},)
    )
    partitioner = OpenvinoPartitioner()
    program = lower_exported(exported, partitioner=partitioner)
    assert "aten.sum.dim_IntList" in {kept.node.op for kept in partitioner.report.kept_out}
    for size in (2, 3, 6):
        x = torch.randint(-5, 6, (size, 4), dtype=torch.int8)
        assert check_run(NegatedInt8Sum(), program.buffer, (x,)).ok


def test_an_input_nothing_reads_keeps_its_position() -> None:
    # Found running ExecuTorch's operator suite (circular padding, for some hash seeds): a
    # partition input nothing in the partition reads. OpenVINO's frontend drops it, and the
    # runtime, which binds inputs by position, would bind every later input to the wrong one.
    graph = torch.fx.Graph()
    unused, used = graph.placeholder("unused"), graph.placeholder("used")
    graph.output((graph.call_function(torch.ops.aten.sin.default, (used,)),))
    graph_module = torch.fx.GraphModule(torch.nn.Module(), graph)
    unused.meta["val"], used.meta["val"] = torch.zeros(2, 2, dtype=torch.int64), torch.zeros(3, 4)

    model = convert(graph_module)
    assert [p.get_friendly_name() for p in model.get_parameters()] == ["unused", "used"]
    assert model.get_parameters()[0].get_element_type().get_type_name() == "i64"
    x = torch.randn(3, 4)
    request = openvino_core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    request.infer([np.zeros((2, 2), dtype=np.int64), x.numpy()])
    torch.testing.assert_close(torch.from_numpy(request.get_output_tensor(0).data.copy()), x.sin())


class RelativePositionBuckets(torch.nn.Module):
    """T5's relative attention buckets: a tensor built from constants, then changed in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        position = torch.arange(8)
        relative = position[None, :] - position[:, None]
        buckets = (relative > 0).to(torch.long) * 4
        buckets += torch.where(relative.abs() < 2, relative.abs(), torch.full_like(relative, 2))
        return x + buckets.to(x.dtype)


def test_a_constant_the_program_changes_in_place_is_not_folded() -> None:
    # Folded, `buckets` became a lifted constant that `+=` mutates, and torch's decomposition
    # refused the program ("Constant ... is mutated in the forward method"): T5's encoder failed so.
    execute_layer_test(RelativePositionBuckets(), (torch.randn(2, 8, 8),))


def test_constants_written_through_a_view_are_not_folded() -> None:
    class WriteThroughView(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            table = torch.arange(16, dtype=torch.float32).reshape(4, 4)
            table[0].mul_(-1)  # writes `table` through a view of its first row
            return x + table

    execute_layer_test(WriteThroughView(), (torch.randn(4, 4),))


def test_a_failing_rewrite_is_a_typed_error_naming_the_node(monkeypatch) -> None:
    import openvino_backend.lowering.passes.matmul as passes

    def broken(*args, **kwargs):
        raise ValueError("a bug in a rewrite")

    monkeypatch.setattr(passes, "_batched_source", broken)

    class Batched(torch.nn.Module):
        def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return torch.matmul(a, b)  # the line the error must name

    with pytest.raises(PassError) as caught:
        inputs = (torch.randn(2, 3, 4), torch.randn(2, 4, 5))
        lower_exported(torch.export.export(Batched(), inputs), partitioner=OpenvinoPartitioner())
    error = caught.value
    assert "RecomposeMatmulPass failed: ValueError: a bug in a rewrite" in str(error)
    assert error.locations and "torch.matmul(a, b)" in error.locations[0].code


class RowsFromPosition(torch.nn.Module):
    """Rows of a table from a position read out of an input tensor: a KV-cached model's rotary table."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("table", torch.randn(32, 4, generator=torch.Generator().manual_seed(0)))

    def forward(self, x: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        start = position[0].item()
        torch._check_is_size(start)
        torch._check(start < 16)
        return x * self.table.narrow(0, start, x.shape[0])


def test_a_slice_bounded_by_sizes_from_the_cpu_runs_in_openvino_at_every_position() -> None:
    # Its bounds arrive as scalars the runtime binds as i64[1]; OpenVINO's Slice needs them 1-D.
    shapes = ({0: torch.export.Dim("rows", min=1, max=16)}, None)
    exported = torch.export.export(RowsFromPosition(), (torch.randn(3, 4), torch.tensor([2])), dynamic_shapes=shapes)
    partitioner = OpenvinoPartitioner()
    program = lower_exported(exported, partitioner=partitioner)
    assert "aten.slice_copy.Tensor" not in {kept.node.op for kept in partitioner.report.kept_out}
    method = LoadedMethod(program.buffer)
    for rows, start in ((3, 0), (5, 7), (1, 15), (16, 0)):
        x, position = torch.randn(rows, 4), torch.tensor([start])
        want = RowsFromPosition()(x, position)
        (got,) = method([x, position])
        assert Tolerance.for_output(torch.float32, scale=want.abs().max().item()).check(got, want), (rows, start)


@pytest.mark.parametrize(
    "pool, x",
    [
        (torch.nn.AvgPool2d(1280, ceil_mode=True), torch.randn(1, 4, 7, 7)),  # Hugging Face's EfficientNet
        (torch.nn.AvgPool2d(9, padding=1, ceil_mode=True, count_include_pad=False), torch.randn(1, 3, 5, 6)),
        (torch.nn.AvgPool2d((20, 2), stride=(20, 2), padding=(1, 0), ceil_mode=True), torch.randn(2, 3, 6, 8)),
    ],
    ids=["global", "padded-excluded", "one-dim"],
)
def test_avg_pool_window_larger_than_the_input_runs_in_openvino(pool, x) -> None:
    # One window covering more than the padded input averages all of it: OpenVINO refuses such a
    # kernel, so it reaches OpenVINO clamped to the padded input, with PyTorch's divisor.
    program = execute_layer_test(pool, (x,))
    assert not non_delegated_ops(program)


class ReshapeRoundTripBesideItsExpand(torch.nn.Module):
    def forward(self, x):
        r = x.reshape(-1).reshape(x.shape)
        y = torch.relu(torch.cat([r]))
        return r, r.expand(r.shape), y


def test_a_same_shape_expand_beside_its_source_as_outputs_converts() -> None:
    # Held-out identity fuzzing: dropping the same-shape expand made two Results name one tensor,
    # which OpenVINO's frontend refuses ("could not convert this partition") after the partitioner
    # had accepted the partition. The expand stays when it and its source both leave the partition.
    execute_layer_test(ReshapeRoundTripBesideItsExpand(), (torch.randn(2, 3, 4),), expected_partitions=None)


class DetachOfChannelsLastProduct(torch.nn.Module):
    def forward(self, x, y):
        p = x.contiguous(memory_format=torch.channels_last) * y
        return p, torch.relu(p), p.detach()


def test_detach_of_a_channels_last_tensor_runs() -> None:
    # Held-out identity fuzzing: the detach became an alias_copy whose result is contiguous while
    # its input is channels-last; ExecuTorch's CPU kernel refuses that pair (CpuKernelError at
    # export). As a clone it keeps eager's layout and runs.
    x, y = torch.randn(2, 3, 4, 5), torch.randn(2, 3, 4, 5)
    execute_layer_test(DetachOfChannelsLastProduct(), (x, y), expected_partitions=None)
