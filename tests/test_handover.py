"""Preprocess takes over the partitioner's conversion of each partition, and still checks it."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from executorch.exir import to_edge_transform_and_lower

import openvino_backend.lowering.handover as handover
import openvino_backend.lowering.preprocess as preprocess
import openvino_backend.partition.conversion as conversion
import openvino_backend.partition.numerical as numerical
from openvino_backend.diagnostics import PassthroughOutputError
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.partition.state import ExportState
from openvino_backend.program import to_executorch
from openvino_backend.runtime import default_precision, precision_name
from openvino_backend.tools.verify import delegate_ids, runtime
from tests.harness import execute_layer_test
from tests.test_validate import CopyThenSin, _line_of


class TwoPartitions(torch.nn.Module):
    """With ``cos`` skipped it runs on the CPU and splits the graph in two."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(x @ x.T)
        return h.sin(), (h.cos() * 2).exp()


def _count_calls(monkeypatch: pytest.MonkeyPatch, module: object, names: tuple[str, ...]) -> Counter:
    calls: Counter = Counter()
    for name in names:
        original = getattr(module, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(module, name, counted)
    return calls


@pytest.mark.parametrize("checks", [True, False], ids=["checks", "no-checks"])
def test_preprocess_converts_and_compiles_only_what_the_checks_did_not(
    monkeypatch: pytest.MonkeyPatch, checks: bool
) -> None:
    calls = _count_calls(monkeypatch, preprocess, ("convert", "compile_model", "validate_model", "validate_compiled"))
    partitioner = OpenvinoPartitioner(
        check_by_conversion=checks, check_numerics=checks, op_types_to_skip={"aten.cos.default"}
    )
    program = execute_layer_test(
        TwoPartitions(), (torch.randn(4, 4),), expected_partitions=None, partitioner=partitioner
    )
    partitions = len(delegate_ids(program))
    assert partitions == 2
    # Converted once per partition, by the checks or by preprocess; compiled by the checks for the
    # runtime where it computes in f32 (elsewhere they judge in f32 and preprocess compiles for the
    # runtime's precision); checked by preprocess always.
    assert calls["convert"] == (0 if checks else partitions)
    in_f32 = precision_name(default_precision("CPU")) == "f32"
    assert calls["compile_model"] == (0 if checks and in_f32 else partitions)
    assert calls["validate_model"] == calls["validate_compiled"] == partitions


def test_a_handed_over_conversion_is_still_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # A numerical check that converts and compiles but finds nothing, and no other rule: the
    # pass-through reaches preprocess in the conversion it takes over, and must be refused there.
    def convert_only(self, part):
        conversion.converted(part)
        return iter(())

    monkeypatch.setattr(numerical.NumericalCheck, "__call__", convert_only)
    handed: list[object] = []
    original = handover.take_over

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        handed.append(result)
        return result

    monkeypatch.setattr(preprocess, "take_over", spy)
    partitioner = OpenvinoPartitioner(boundary_rules=(), check_by_conversion=False)
    with pytest.raises(PassthroughOutputError) as caught:
        execute_layer_test(CopyThenSin(), (torch.randn(3, 4),), partitioner=partitioner)
    assert handed and all(result is not None for result in handed), "preprocess converted on its own"
    # Named from the graph the checks converted: the node and the user's line.
    assert "clone" in str(caught.value) and f"test_validate.py:{_line_of('x.clone()')}" in str(caught.value)


class Affine(torch.nn.Module):
    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.linear = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(x))


@pytest.mark.parametrize("states", ["own", "swapped"])
def test_methods_with_the_same_graph_keep_their_own_weights(monkeypatch: pytest.MonkeyPatch, states: str) -> None:
    # ExecuTorch partitions every method before it preprocesses any; these two have the same node
    # names, inputs and outputs, and only their weights differ. "swapped": the partitioner's checks
    # see the other method's weights, and preprocess must not take their conversion.
    if states == "swapped":
        monkeypatch.setattr(ExportState, "_take_state", lambda self, program: self.real_states.pop())
    handed: list[object] = []
    original = handover.take_over

    def spy(*args, **kwargs):
        handed.append(original(*args, **kwargs))
        return handed[-1]

    monkeypatch.setattr(preprocess, "take_over", spy)
    modules = {"first": Affine(0).eval(), "second": Affine(1).eval()}
    x = torch.randn(2, 8)
    exported = {name: torch.export.export(module, (x,)) for name, module in modules.items()}
    buffer = to_executorch(to_edge_transform_and_lower(exported, partitioner=[OpenvinoPartitioner()])).buffer
    program = runtime().load_program(buffer)  # must outlive its methods
    for name, module in modules.items():
        (got,) = program.load_method(name).execute([x])
        with torch.no_grad():
            want = module(x)
        torch.testing.assert_close(got, want, atol=0.03, rtol=0.02, msg=f"method {name}")
    taken = [result is not None for result in handed]
    assert taken == ([True, True] if states == "own" else [False, False]), taken


def test_preprocess_gets_the_partition_s_graph_copied_and_its_weights_shared() -> None:
    """ExecuTorch copies each partition's program before preprocess and holds every copy until all are
    lowered: the graph must be a copy (preprocess's passes change it), the weights the same tensors
    (a deep copy was a second copy of every weight of an LLM)."""
    exported = torch.export.export(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU()), (torch.ones(2, 64),))
    copied = preprocess.OpenvinoBackend.copy_exported_program_for_preprocess(exported, [])
    assert copied.state_dict.keys() == exported.state_dict.keys()
    for name, weight in exported.state_dict.items():
        assert copied.state_dict[name] is weight, name
    assert copied.graph_module is not exported.graph_module and copied.graph is not exported.graph
    nodes = len(exported.graph.nodes)
    relu = next(n for n in copied.graph.nodes if n.target == torch.ops.aten.relu.default)
    relu.replace_all_uses_with(relu.args[0])
    copied.graph.erase_node(relu)
    assert len(exported.graph.nodes) == nodes and len(copied.graph.nodes) == nodes - 1
