"""Compressed weights are judged as OpenVINO computes them: its CPU plugin multiplies them with
activations quantized to int8 on the fly, which a correct result may differ by; a wrong one is refused."""

from __future__ import annotations

import openvino as ov
import pytest
import torch
from executorch.exir import EdgeCompileConfig

import openvino_backend.partition.numerical as numerical
from openvino_backend import OpenvinoPartitioner
from openvino_backend.partition.quantized import DYNAMIC_GROUP, _quantize_groups
from openvino_backend.tools.verify import LoadedMethod, lower_exported
from tests.harness import TARGET_PRECISIONS, delegate_blobs, partitioner_for

nncf = pytest.importorskip("nncf", reason="weight compression runs on NNCF (the quantize extra)")
# NNCF unpacks 4-bit weights with a shift that is no core ATen op (OpenVINO folds it into a u4 constant).
UNPACKING = EdgeCompileConfig(_core_aten_ops_exception_list=[torch.ops.aten.bitwise_right_shift.Tensor_Scalar])


class Mlp(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(0)
        self.up = torch.nn.Linear(128, 256)
        self.down = torch.nn.Linear(256, 64)
        for layer in (self.up, self.down):
            torch.nn.init.normal_(layer.weight, std=0.1, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.nn.functional.silu(self.up(x)))


def _compressed(mode: str) -> tuple[torch.nn.Module, tuple[torch.Tensor]]:
    x = (torch.randn(4, 128, generator=torch.Generator().manual_seed(1)),)
    graph = torch.export.export(Mlp().eval(), x).module()
    options = {"group_size": 64} if mode == "INT4_SYM" else {}
    return nncf.compress_weights(graph, mode=getattr(nncf.CompressWeightsMode, mode), **options), x


@pytest.mark.isa
@pytest.mark.parametrize("mode", ["INT8_ASYM", "INT4_SYM"])
@pytest.mark.parametrize("precision", TARGET_PRECISIONS)
def test_compressed_weights_are_delegated_whole_at_every_precision(precision: str, mode: str) -> None:
    model, x = _compressed(mode)
    partitioner = partitioner_for(precision, sample_inputs=x)
    program = lower_exported(torch.export.export(model, x), partitioner=partitioner, compile_config=UNPACKING)
    assert partitioner.numerical_check is not None and not partitioner.numerical_check.narrowed
    assert not [kept for kept in partitioner.report.kept_out if kept.node.op.endswith("mm.default")]
    (got,) = LoadedMethod(program.buffer)([x[0]])
    want = model(x[0])
    assert torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0) > 0.999


@pytest.mark.isa
def test_the_runtime_quantizes_activations_in_the_groups_the_check_emulates() -> None:
    # The stock runtime imports a blob with no properties: it computes with OpenVINO's default group size
    # and whatever runtime options the model's rt_info carried into the blob (those survive the import).
    # Were either other than DYNAMIC_GROUP, the numerical check would judge a computation the runtime
    # does not run.
    model, x = _compressed("INT4_SYM")
    program = lower_exported(torch.export.export(model, x), partitioner=OpenvinoPartitioner(), compile_config=UNPACKING)
    blobs = delegate_blobs(program.buffer)
    assert blobs, "nothing was delegated"
    for blob in blobs:
        compiled = ov.Core().import_model(blob, "CPU")
        assert int(compiled.get_property("DYNAMIC_QUANTIZATION_GROUP_SIZE")) == DYNAMIC_GROUP


@pytest.mark.isa
@pytest.mark.parametrize("precision", TARGET_PRECISIONS)
def test_a_compressed_matmul_computed_wrongly_is_refused(precision: str, monkeypatch) -> None:
    # OpenVINO's outputs scaled and shifted, as a wrong scale or zero point would: more than any
    # rounding of its int8 activations could move them.
    model, x = _compressed("INT8_ASYM")
    run = numerical.run_like_runtime

    def wrong(compiled, feeds, expected):
        outputs, overwritten = run(compiled, feeds, expected)
        return [out * 1.5 + 0.5 for out in outputs], overwritten

    monkeypatch.setattr(numerical, "run_like_runtime", wrong)
    partitioner = partitioner_for(precision, sample_inputs=x)
    lower_exported(torch.export.export(model, x), partitioner=partitioner)
    assert partitioner.numerical_check is not None
    assert partitioner.numerical_check.narrowed, "a wrong result was taken for dynamic quantization"


def test_activations_are_quantized_per_group_as_openvino_does() -> None:
    x = torch.randn(3, 4 * DYNAMIC_GROUP, dtype=torch.float64)
    q = _quantize_groups(x, flip_ties=False)
    groups = x.reshape(3, 4, DYNAMIC_GROUP)
    step = groups.abs().amax(-1, keepdim=True) / 127
    off = (q.reshape(3, 4, DYNAMIC_GROUP) - groups).abs()
    assert (off <= step / 2 + 1e-12).all() and off.max() > 0  # within half a step of its own group
    assert torch.equal(_quantize_groups(x[:, :33], flip_ties=False), x[:, :33])  # no whole group: as it is
