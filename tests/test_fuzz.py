"""The fuzzer's own pieces: its graphs, its reproductions, its properties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from fuzz.graphs import compute_graphs, graphs
from fuzz.properties import check_compute, check_lowering, check_validator
from fuzz.spec import GraphSpec, Input, Step

COPY_OF_INPUT = GraphSpec(
    inputs=(Input((3, 4), "float32"),),
    steps=(Step("clone", (0,)), Step("sin", (1,))),
    outputs=(1, 2),
)


def test_reproduction_is_runnable_python_for_the_same_graph() -> None:
    namespace: dict[str, object] = {}
    source = COPY_OF_INPUT.repro().split("program = lower")[0]  # up to the lowering
    exec(compile(source, "<repro>", "exec"), namespace)
    module, inputs = COPY_OF_INPUT.build()
    torch.testing.assert_close(namespace["FuzzGraph"]()(*namespace["inputs"]), module(*inputs))


def test_validator_property_sees_a_stale_partition() -> None:
    # Without the edge rules, this partition returns its input unconverted:
    # the probe must find it stale, and the validator must have flagged it.
    assert check_validator(COPY_OF_INPUT).kind == "flagged"


def test_lowering_property_passes_the_seed_graph() -> None:
    outcome = check_lowering(COPY_OF_INPUT)
    assert outcome.kind == "matched", outcome.detail


# The pattern OpenVINO 2026.4.1 computes wrongly inside a partition, among other compute ops.
ABS_RANGE = GraphSpec(
    inputs=(Input((2, 8), "float32"),),
    steps=(Step("add_abs_range", (0,), 1), Step("layer_norm", (1,))),
    outputs=(2,),
)


def test_compute_property_passes_a_graph_openvino_would_get_wrong() -> None:
    outcome = check_compute(ABS_RANGE)
    assert outcome.kind == "matched", outcome.detail


@pytest.mark.parametrize("strategy", [graphs, compute_graphs])
def test_generated_graphs_run_in_eager(strategy) -> None:
    @settings(max_examples=200, derandomize=True, deadline=None)
    @given(strategy())
    def prop(spec: GraphSpec) -> None:
        module, inputs = spec.build()
        outputs = module(*inputs)
        assert len(outputs) == len(spec.outputs)
        assert [tuple(o.shape) for o in outputs] == [spec.values()[i].shape for i in spec.outputs]
        assert [str(o.dtype).removeprefix("torch.") for o in outputs] == [spec.values()[i].dtype for i in spec.outputs]

    prop()


def test_validator_property_counts_an_output_openvino_types_differently() -> None:
    # OpenVINO sums int8 in i8 (PyTorch: int64): such a partition cannot be bound as PyTorch's
    # dtype, and preprocess refuses it; the probe counts it by name instead of failing.
    spec = GraphSpec(
        inputs=(Input((1,), "int8"),), steps=(Step("sum_keepdim", (0,), 0),), outputs=(1,), dim_order=False
    )
    outcome = check_validator(spec)
    assert (outcome.kind, outcome.error_class) == ("refused", "OutputType")
