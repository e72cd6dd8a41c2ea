"""Tensors in a non-default dim order at the partition edge run correctly in OpenVINO.

Each trigger from the review of the original fix must export, keep its
layout-changing ops delegated, and match eager in values and memory format.
The adaptation lives in the ov.Model (``edge_layout.py``); ``DimOrderError``
remains for what cannot be adapted.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset13 as opset
import pytest
import torch

from openvino_backend.diagnostics import DimOrderError
from openvino_backend.lowering.edge_layout import adapt_edge_layouts, inverse
from openvino_backend.partition.edge_rules import keep_boundary_copies_out, keep_non_default_dim_order_out
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.tools.verify import lower, memory_format, run_program
from tests.harness import NO_DIM_ORDER, execute_layer_test, non_delegated_ops

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
        return x.mean(dim=(2, 3)), x.sum(dim=1), x * 3


class CopyThenElementwise(torch.nn.Module):
    def forward(self, x):
        y = x.clone(memory_format=CL)
        return y, y.sin()


def _contiguous():
    return torch.randn(2, 3, 4, 5)


def _channels_last():
    return torch.randn(2, 3, 4, 5).to(memory_format=CL)


TRIGGERS = {
    "copy_used_inside_and_outside": (CopyUsedInsideAndOutside, _contiguous, 20),
    "clone_chain": (CloneChain, _contiguous, 3),
    "channels_last_output": (ChannelsLastOutput, _contiguous, 1),
    "channels_last_input": (ChannelsLastInput, _channels_last, 20),
}


@pytest.mark.parametrize("trigger", TRIGGERS.values(), ids=TRIGGERS.keys())
def test_trigger_runs_in_openvino_and_matches_eager(trigger) -> None:
    module, make_input, terms = trigger
    x = make_input()
    program = execute_layer_test(module(), (x,), expected_partitions=1, terms=terms)
    # Only copies of the program's input run on the CPU (they must: see boundary.py);
    # every layout change of a computed value runs in OpenVINO.
    assert set(non_delegated_ops(program)) <= {"_clone_dim_order.out"}


@pytest.mark.parametrize("trigger", TRIGGERS.values(), ids=TRIGGERS.keys())
def test_outputs_keep_eagers_memory_format(trigger) -> None:
    module, make_input, _ = trigger
    torch.manual_seed(0)
    model, x = module().eval(), make_input()
    program = lower(model, (x,))
    with torch.no_grad():
        expected = model(x)
    expected = expected if isinstance(expected, tuple) else (expected,)
    actual = run_program(program.buffer, [x.clone()])
    assert [memory_format(a) for a in actual] == [memory_format(e) for e in expected]


def test_opting_in_to_cpu_layout_changes_still_matches_eager() -> None:
    partitioner = OpenvinoPartitioner(boundary_rules=(keep_boundary_copies_out, keep_non_default_dim_order_out))
    execute_layer_test(CopyUsedInsideAndOutside(), (_contiguous(),), expected_partitions=0, partitioner=partitioner)


def test_channels_last_copy_without_dim_order_runs_in_openvino() -> None:
    # With dim order off, ExecuTorch's CPU kernels cannot run a channels-last clone. The clone
    # changes the layout of a partition input, so inside the adapted ov.Model it is a real
    # transpose, not a pass-through: it is delegated, and the compiled-graph check confirms it.
    program = execute_layer_test(
        CopyThenElementwise(), (_contiguous(),), expected_partitions=1, compile_config=NO_DIM_ORDER
    )
    assert non_delegated_ops(program) == []


def test_layout_that_equals_contiguous_needs_no_adaptation() -> None:
    class Sin(torch.nn.Module):
        def forward(self, x):
            return x.sin()

    x = torch.randn(2, 3, 1, 1).to(memory_format=CL)  # the same bytes as contiguous
    execute_layer_test(Sin(), (x,), expected_partitions=1)


@pytest.mark.parametrize(
    ("logical", "order"),
    [((2, 3, 4), (2, 0, 1)), ((2, 3, 4), (1, 2, 0)), ((2, 3, 4), (0, 2, 1)), ((1, 3, 4, 5, 6), (0, 2, 3, 4, 1))],
    ids=["3d_201", "3d_120", "3d_021", "channels_last_3d"],
)
def test_any_permutation_is_adapted_under_the_runtime_binding(logical, order) -> None:
    """Plain OpenVINO, bound like the runtime binds: logical sizes over permuted memory.

    ExecuTorch 1.5.1 itself only carries 4-D channels-last to a partition edge
    (its runtime refuses other layouts as inputs, and its memory-format ops
    cannot express channels_last_3d), so other permutations are tested here.
    """
    x = opset.parameter(list(logical), np.float32, name="x")
    model = ov.Model([opset.multiply(opset.sin(x), opset.constant(np.float32(2))).output(0)], [x])
    adapt_edge_layouts(model, [order], [order])
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})

    value = np.random.default_rng(0).standard_normal(logical).astype(np.float32)
    physical_in = np.ascontiguousarray(value.transpose(order))  # memory in dim order `order`
    out = np.zeros([logical[d] for d in order], np.float32)
    request = compiled.create_infer_request()
    request.set_input_tensor(0, ov.Tensor(physical_in.reshape(logical), shared_memory=True))
    request.set_output_tensor(0, ov.Tensor(out.reshape(logical), shared_memory=True))
    request.infer()
    # Read the output memory back in dim order `order`: it must be 2 * sin(value).
    np.testing.assert_allclose(out.transpose(inverse(order)), 2 * np.sin(value), rtol=1e-5, atol=1e-6)


def test_dynamic_shape_in_non_default_order_is_refused() -> None:
    x = opset.parameter(ov.PartialShape([-1, 3, 4, 5]), np.float32, name="x")
    model = ov.Model([opset.sin(x).output(0)], [x])
    with pytest.raises(DimOrderError, match="dynamic shape"):
        adapt_edge_layouts(model, [(0, 2, 3, 1)], [None], partition=0)
