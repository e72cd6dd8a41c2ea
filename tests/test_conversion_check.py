"""Pass-throughs found by converting proposed partitions, whatever their op."""

from __future__ import annotations

import pytest
import torch

from openvino_backend.partition.edge_rules import keep_unbindable_tensors_out
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from tests.harness import execute_layer_test
from tests.ops.test_copy import COPIES, CopyThenSin


@pytest.mark.parametrize("copy", COPIES.values(), ids=COPIES.keys())
def test_copy_not_on_any_list_is_kept_out_by_conversion(copy) -> None:
    # No copy list at all: every copy op here is "not on the list".
    partitioner = OpenvinoPartitioner(boundary_rules=(keep_unbindable_tensors_out,))
    execute_layer_test(CopyThenSin(copy), (torch.randn(4, 6),), partitioner=partitioner)
    reasons = [(kept.node.op, kept.reason) for kept in partitioner.report.kept_out]
    assert reasons, "the conversion check kept nothing out"
    assert all("found by converting the partition" in why and op in why for op, why in reasons)
    # Reported through ExecuTorch's reporter too, by node.
    table = partitioner.reporter.get_table_report()
    assert all(kept.node.name[:20] in table for kept in partitioner.report.kept_out)


class CopyOfOutput(torch.nn.Module):
    def forward(self, x):
        y = x.sin()
        return y, y.clone()


def test_conversion_check_also_handles_copies_of_outputs() -> None:
    partitioner = OpenvinoPartitioner(boundary_rules=(keep_unbindable_tensors_out,))
    # Two outputs naming one OpenVINO tensor fail conversion; the check cannot
    # learn from that, so preprocess's explanation is what the user gets...
    with pytest.raises(Exception, match="could not convert"):
        execute_layer_test(CopyOfOutput(), (torch.randn(4, 4),), partitioner=partitioner)
    # ...while the copy rule (the default) handles it.
    execute_layer_test(CopyOfOutput(), (torch.randn(4, 4),))


class ExplicitSubScalar(torch.nn.Module):
    def forward(self, x):
        return torch.ops.aten.sub.Scalar(x * 2, 3) + 1


def test_an_op_the_frontend_has_no_rule_for_is_kept_out_by_its_name(monkeypatch) -> None:
    # OpenVINO reports ops it has no conversion rule for by op name, not by node: the check maps
    # the name back to the partition's nodes, so a table that claims too much cannot break export.
    from openvino_backend.partition import support

    claimed = support.openvino_supported_ops() | {"aten.sub.Scalar"}
    monkeypatch.setattr(support, "openvino_supported_ops", lambda: claimed)
    partitioner = OpenvinoPartitioner()
    execute_layer_test(ExplicitSubScalar(), (torch.randn(4, 6),), expected_partitions=2, partitioner=partitioner)
    kept = [(k.node.name, k.reason) for k in partitioner.report.kept_out]
    assert [name for name, _ in kept] == ["aten_sub_scalar"]
    assert "OpenVINO cannot convert this aten.sub.Scalar" in kept[0][1]
