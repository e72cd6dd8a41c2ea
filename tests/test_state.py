"""Buffers a program updates live in OpenVINO as state: correct across calls, taken over only where exact."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from executorch.exir import ExecutorchBackendConfig, to_edge_transform_and_lower
from executorch.exir.passes.init_mutable_pass import InitializedMutableBufferPass

from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.program import to_executorch
from openvino_backend.runtime import Tolerance
from openvino_backend.tools.verify import LoadedMethod


class Accumulator(torch.nn.Module):
    """Adds each call's input to a running total it keeps in a buffer, and returns it scaled."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.arange(8.0).reshape(2, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.total.add_(x.sin())
        return self.total * 2


class ReadOutside(Accumulator):
    """The running total is also read by an op the partitioner is told to leave on the CPU."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        before = self.total.cos()
        self.total.add_(x.sin())
        return self.total * 2, before


def _lower(module: torch.nn.Module, partitioner: OpenvinoPartitioner):
    exported = torch.export.export(module, (torch.randn(2, 4),))
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    # A buffer left with ExecuTorch starts from its value at export only with this pass; in OpenVINO
    # state it always does.
    config = ExecutorchBackendConfig(passes=[InitializedMutableBufferPass(["total"])])
    return edge, to_executorch(edge, config)


def _run_calls(module: torch.nn.Module, program, calls: int = 4) -> None:
    method = LoadedMethod(program.buffer)
    generator = torch.Generator().manual_seed(0)
    for call in range(calls):
        x = torch.randn(2, 4, generator=generator)
        got = method([x])
        with torch.no_grad():
            want = module(x)
        want = want if isinstance(want, tuple) else (want,)
        for g, w in zip(got, want, strict=True):
            assert Tolerance.for_output(w.dtype, scale=w.abs().max().item(), ops=4 + call).check(g, w), (call, g, w)


@pytest.mark.parametrize("take_over", [True, False], ids=["state", "through-the-edge"])
def test_a_mutated_buffer_keeps_its_value_from_call_to_call(take_over: bool) -> None:
    partitioner = OpenvinoPartitioner(take_over_mutable_buffers=take_over)
    edge, program = _lower(Accumulator(), partitioner)
    lowered = edge.exported_program()
    if take_over:
        assert partitioner.report.state_buffers == ("total",)
        # The delegate owns the buffer: the program neither passes it in nor writes it back.
        assert lowered.graph_signature.buffers_to_mutate == {}
        assert [n.name for n in lowered.graph.find_nodes(op="placeholder")] == ["x"]
    else:
        assert partitioner.report.state_buffers == ()
        assert list(lowered.graph_signature.buffers_to_mutate.values()) == ["total"]
    _run_calls(Accumulator(), program)


def test_a_buffer_read_outside_its_partition_stays_with_executorch() -> None:
    # Handed to OpenVINO, the CPU's cos would read a buffer nobody writes back any more.
    partitioner = OpenvinoPartitioner(op_types_to_skip={"aten.cos.default"})
    _, program = _lower(ReadOutside(), partitioner)
    assert partitioner.report.state_buffers == ()
    _run_calls(ReadOutside(), program)


def test_each_loaded_method_starts_from_the_buffer_value_at_export() -> None:
    partitioner = OpenvinoPartitioner()
    _, program = _lower(Accumulator(), partitioner)
    x = torch.ones(2, 4)
    first = LoadedMethod(program.buffer)
    first([x])
    again = LoadedMethod(program.buffer)([x])[0]  # a fresh method: a fresh variable
    want = Accumulator()(x)
    assert Tolerance.for_output(torch.float32, scale=want.abs().max().item()).check(again, want)


def test_a_stateful_partition_leaves_nothing_of_the_checks_behind() -> None:
    # Preprocess converts a partition with state itself: the checks' conversion it handed over (an
    # OpenVINO model and its compiled form, an LLM's weights and all) is dropped, not kept for the
    # life of the process.
    from openvino_backend.lowering import handover

    before = set(handover._HANDED_OVER)
    _lower(Accumulator().eval(), OpenvinoPartitioner())
    assert set(handover._HANDED_OVER) <= before


def test_a_stateful_partition_s_conversion_is_let_go_when_partitioning_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    # Preprocess converts it again, its buffers as variables: the checks' conversion (an LLM's
    # weights, converted and compiled) must not live on beside that second one.
    import openvino_backend.partition.conversion as conversion

    converted: list[weakref.ref] = []
    convert = conversion.convert_partition

    def remembered(*args: object, **kwargs: object) -> object:
        result = convert(*args, **kwargs)
        converted.append(weakref.ref(result))
        return result

    monkeypatch.setattr(conversion, "convert_partition", remembered)
    partitioner = OpenvinoPartitioner()
    partition, alive = partitioner.partition, []

    def partition_then_look(program: object) -> object:
        result = partition(program)
        gc.collect()
        alive.extend(ref() for ref in converted if ref() is not None)
        return result

    monkeypatch.setattr(partitioner, "partition", partition_then_look)
    _lower(Accumulator().eval(), partitioner)
    assert converted, "the checks converted nothing"
    assert not alive, "the checks' conversion of a partition with state outlived partitioning"


def test_a_variable_starts_from_its_buffer_s_own_memory() -> None:
    # An LLM's caches are hundreds of MB: their initial value is the buffer the program keeps, not a copy.
    import openvino as ov
    import openvino.opset13 as opset

    from openvino_backend.lowering.state import StateBuffer, make_stateful

    cache = torch.zeros(1, 2, 64, 8)
    parameter = opset.parameter([1, 2, 64, 8], ov.Type.f32)
    model = ov.Model([opset.result(opset.add(parameter, opset.constant(1.0, ov.Type.f32)))], [parameter])
    make_stateful(model, [StateBuffer("cache", "cache", "new_cache", cache)])
    (read,) = (op for op in model.get_ordered_ops() if op.get_type_name() == "ReadValue")
    initial = read.input_value(0).get_node()
    assert initial.get_type_name() == "Constant"
    assert initial.get_data().ctypes.data == cache.data_ptr()


class Calls(torch.nn.Module):
    """Counts its calls in a 0-d buffer and scales its input by the count."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.tensor(0.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1.0)
        return x * self.calls


class Positions(torch.nn.Module):
    """transformers' static cache: a 0-d position set from an input at every call (read for its shape
    only), the positions counted from it, then advanced past them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("seen", torch.tensor(0, dtype=torch.int64))
        self.register_buffer("table", torch.randn(16, 4))

    def forward(self, x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        self.seen.copy_(start[0])
        positions = torch.arange(x.shape[0]) + self.seen
        self.seen.add_(x.shape[0])
        return x + self.table.index_select(0, positions)


def test_a_0d_buffer_is_held_as_state_and_everything_reading_it_runs_in_openvino() -> None:
    # The runtime cannot bind a 0-d tensor, so crossing the edge it would keep every op reading it on
    # the CPU; held as state it never crosses.
    partitioner = OpenvinoPartitioner()
    edge, program = _lower(Calls(), partitioner)
    assert partitioner.report.state_buffers == ("calls",)
    assert partitioner.report.kept_out == ()
    assert [n.name for n in edge.exported_program().graph.find_nodes(op="placeholder")] == ["x"]
    _run_calls(Calls(), program)


def test_a_buffer_read_only_for_its_shape_is_dropped_and_the_blob_still_loads() -> None:
    partitioner = OpenvinoPartitioner()
    x = torch.randn(3, 4)
    shapes = ({0: torch.export.Dim("n", min=1, max=8)}, None)
    exported = torch.export.export(Positions(), (x, torch.tensor([2])), dynamic_shapes=shapes)
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner])
    assert partitioner.report.kept_out == ()
    assert set(partitioner.report.state_buffers) == {"seen"}
    assert [n.name for n in edge.exported_program().graph.find_nodes(op="placeholder")] == ["x", "start"]
    method = LoadedMethod(to_executorch(edge).buffer)  # from a file: the blob imports again
    module = Positions()
    module.load_state_dict(exported.module().state_dict())
    for n, start in [(3, 0), (1, 3), (5, 7), (2, 0)]:
        x = torch.randn(n, 4)
        (got,) = method([x, torch.tensor([start])])
        want = module(x, torch.tensor([start]))
        assert Tolerance.for_output(torch.float32, scale=want.abs().max().item(), ops=2).check(got, want), (n, start)
