"""The stages one by one, on small FX graphs, without lowering: the fast inner loop's tests."""

from __future__ import annotations

import copy
import importlib
from pathlib import Path

import pytest
import torch
from executorch.exir import to_edge

from openvino_backend.ops import CONVERTIBLE_BEYOND_TABLE, FACTS, KEEP_WHOLE, PAD_OP, facts, ops_to_keep_whole, overload
from openvino_backend.partition.cpu_kernels import cpu_problem
from openvino_backend.partition.edge_rules import keep_boundary_copies_out, keep_unbindable_tensors_out
from openvino_backend.partition.propose import propose
from openvino_backend.partition.report import report
from openvino_backend.partition.state import ExportState
from openvino_backend.partition.view import PartitionView
from openvino_backend.tools.loader import DynamicDim, LoadError, parse_shape
from openvino_backend.transform.dynamic import pad_to_bound
from openvino_backend.transform.fold import MAX_FOLDED_BYTES, _propagated, fold_constant_subgraphs, mutated_in_place


def _calls(program: torch.export.ExportedProgram) -> dict[str, torch.fx.Node]:
    return {node.name: node for node in program.graph.nodes if node.op == "call_function"}


class CopyAndSin(torch.nn.Module):
    def forward(self, x: torch.Tensor):
        y = x.clone()
        return y, torch.sin(y)


def test_a_copy_of_a_partition_input_leaving_is_refused_and_one_used_inside_is_kept() -> None:
    program = torch.export.export(CopyAndSin(), (torch.randn(3),))
    calls = _calls(program)
    clone, sin = calls["clone"], calls["sin"]
    refused = [node for node, _ in keep_boundary_copies_out(PartitionView(frozenset({clone, sin}), program))]
    assert refused == [clone]

    class CopyInside(torch.nn.Module):
        def forward(self, x: torch.Tensor):
            return torch.sin(x.clone())

    inside = torch.export.export(CopyInside(), (torch.randn(3),))
    nodes = frozenset(_calls(inside).values())
    assert list(keep_boundary_copies_out(PartitionView(nodes, inside))) == []


def test_a_zero_d_output_is_refused_at_the_edge() -> None:
    class Mean(torch.nn.Module):
        def forward(self, x: torch.Tensor):
            return x.sin().mean()

    program = torch.export.export(Mean(), (torch.randn(3),))
    nodes = frozenset(_calls(program).values())
    (refused,) = keep_unbindable_tensors_out(PartitionView(nodes, program))
    assert refused[0].name == "mean" and "0-d" in refused[1]


def test_folding_computes_index_arithmetic_and_leaves_mutated_and_large_tensors() -> None:
    class Shifts(torch.nn.Module):
        def forward(self, x: torch.Tensor):
            small = torch.arange(8).abs() * 2  # folded
            big = torch.arange(MAX_FOLDED_BYTES).float()  # over the limit: stays a computation
            mutated = torch.arange(8) + 1
            mutated += 1  # changed in place: never folded
            return x + small + mutated, big.sum()

    program = torch.export.export(Shifts(), (torch.randn(8),))
    assert {n.name for n in mutated_in_place(program.graph)} == {"add"}
    folded = fold_constant_subgraphs(program)
    ops = {str(node.target) for node in folded.graph.nodes if node.op == "call_function"}
    assert "aten.abs.default" not in ops and "aten.mul.Tensor" not in ops
    assert "aten.add_.Tensor" in ops  # the mutated tensor is still computed
    aranges = [n for n in folded.graph.nodes if n.op == "call_function" and "arange" in str(n.target)]
    assert [n.meta["val"].numel() for n in aranges] == [MAX_FOLDED_BYTES]  # the large one alone


def test_folding_computes_nothing_from_the_weights() -> None:
    """What is never folded is never computed: on an LLM, evaluating every constant subgraph
    dequantized every weight, several times over, held all at once (a 1.1B-parameter export
    peaked at 23 GB)."""

    class Weighted(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(64, 64)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.linear(x) + torch.arange(64).abs()

    program = to_edge(torch.export.export(Weighted(), (torch.randn(2, 64),))).exported_program()
    values = _propagated(program)
    computed = {node.name for node in values if node.op == "call_function"}
    assert any("arange" in name for name in computed) and any("abs" in name for name in computed)
    weights = set(program.graph_signature.inputs_to_parameters)
    from_weights = {user.name for node in program.graph.nodes if node.name in weights for user in node.users}
    assert from_weights and not from_weights & computed
    assert not weights & {node.name for node in values}
    folded = fold_constant_subgraphs(program)
    assert not any("abs" in n.name for n in folded.graph.nodes if n.op == "call_function")


def test_pad_to_bound_pads_every_dim_at_its_end() -> None:
    x = torch.arange(6.0).reshape(2, 3)
    padded = pad_to_bound(x, [4, 5])
    assert padded.shape == (4, 5) and torch.equal(padded[:2, :3], x) and padded.sum() == x.sum()


def test_cpu_kernels_know_a_kept_whole_op_has_no_kernel() -> None:
    program = torch.export.export(CopyAndSin(), (torch.randn(3),))
    sin = _calls(program)["sin"]
    assert cpu_problem(sin, kept_whole=set()) is None
    assert cpu_problem(sin, kept_whole={"aten.sin.default"})[1] == "kept whole"


def test_command_line_shapes_and_dynamic_dims_are_parsed_or_refused_by_name() -> None:
    assert parse_shape("1,3,224,224") == (1, 3, 224, 224) == parse_shape("1x3x224x224")
    assert DynamicDim.parse("0.1=2:16") == DynamicDim(0, 1, 2, 16)
    with pytest.raises(LoadError, match="MIN is larger than MAX"):
        DynamicDim.parse("0.0=8:2")
    with pytest.raises(LoadError, match="expected comma-separated integers"):
        parse_shape("1,three")


def test_a_built_in_example_has_the_same_weights_whatever_the_random_state() -> None:
    from openvino_backend.tools.examples import EXAMPLES

    build = EXAMPLES["robot-policy"].build
    torch.manual_seed(1)
    first = build().state_dict()
    torch.manual_seed(2)
    state = torch.random.get_rng_state()
    second = build().state_dict()
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's random state untouched
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_every_op_fact_names_a_real_op_and_an_op_in_two_families_gets_both() -> None:
    for name in FACTS:
        if name != PAD_OP:
            assert isinstance(overload(name), torch._ops.OpOverload), name  # a typo raises here
    clone = facts("aten.clone.default")
    assert clone.copy == "always" and clone.changes_layout
    # One list per fact, derived: the reflection pads are convertible beyond OpenVINO's table and kept whole.
    assert "aten.reflection_pad2d.default" in CONVERTIBLE_BEYOND_TABLE & KEEP_WHOLE
    assert torch.ops.aten.reflection_pad2d.default in ops_to_keep_whole()
    assert facts("aten.sin.default") == facts("no.such.op")  # nothing known: empty facts


def test_propose_records_which_rule_refused_each_node() -> None:
    program = torch.export.export(CopyAndSin(), (torch.randn(3),))
    proposal = propose(program, [(keep_boundary_copies_out,)], op_types_to_skip={"aten.sin.default"})
    by_name = {node.name: rejection for node, rejection in proposal.rejected.items()}
    assert by_name["clone"].rule == "keep_boundary_copies_out"
    assert "stale memory" in by_name["clone"].reason
    assert by_name["sin"].rule == "skipped_by_user"
    assert proposal.partitions == [] and not proposal.delegated

    reporter, summary = report(program, proposal, "f32")
    table = reporter.get_table_report()
    assert "keep_boundary_copies_out:" in table and "skipped_by_user:" in table
    assert {(kept.node.name, kept.rule) for kept in summary.kept_out} == {
        ("clone", "keep_boundary_copies_out"),
        ("sin", "skipped_by_user"),
    }


def test_export_state_gives_each_program_back_its_own_weights() -> None:
    first, second = torch.nn.Linear(2, 3), torch.nn.Linear(4, 3)
    programs = [torch.export.export(m, (torch.randn(1, m.in_features),)) for m in (first, second)]
    state = ExportState()
    for program in programs:
        state.remember_weights(program)
    fake_mode = torch._subclasses.fake_tensor.FakeTensorMode()
    fakes = []
    for program in reversed(programs):  # partitioned in the other order: matched by shapes, not by turn
        fake = copy.copy(program)
        fake._state_dict = {k: fake_mode.from_tensor(v) for k, v in program.state_dict.items()}
        state.restore_weights(fake)
        fakes.append((program, fake))
    for program, fake in fakes:
        assert all(fake.state_dict[k] is v for k, v in program.state_dict.items())
    assert state.real_states == []


@pytest.mark.parametrize("package", ["bench", "fuzz"])
def test_every_module_of_the_tools_around_the_package_imports(package: str) -> None:
    # They are run by hand, not by the suite: a rename in the package would otherwise break them unseen.
    root = Path(__file__).resolve().parent.parent / package
    for path in sorted(root.glob("*.py")):
        importlib.import_module(f"{package}.{path.stem}" if path.stem != "__init__" else package)
