"""A pytest plugin that gives ExecuTorch's backend test suite one flow: ours.

The suite (``executorch/backends/test/suite``, shipped in the executorch
wheel) parametrizes every test over ``flow.all_flows()``. Loaded with ``-p``,
this plugin replaces that registry before the suite's conftest reads it, so
the suite runs unchanged against ``openvino_backend.OpenvinoPartitioner``,
with no skip list. It also keeps the suite from importing
``executorch.backends.openvino`` (the other ``OpenvinoBackend``).

    python -m pytest -c etsuite/pytest.ini -p etsuite.flow \\
        --pyargs executorch.backends.test.suite.operators
"""

from __future__ import annotations

import functools

import executorch.backends.test.harness.stages as stages
import executorch.backends.test.suite.flow as suite_flow
from executorch.backends.test.harness import Tester
from executorch.backends.test.harness.stages import StageType
from executorch.exir.backend.compile_spec_schema import CompileSpec

from openvino_backend import OpenvinoPartitioner

COMPILE_SPEC = [CompileSpec("device", b"CPU")]


def _partitioner() -> OpenvinoPartitioner:
    return OpenvinoPartitioner(COMPILE_SPEC)


class OpenvinoBackendTester(Tester):
    def __init__(self, module, example_inputs, dynamic_shapes=None) -> None:
        stage_classes = Tester.default_stage_classes() | {
            StageType.PARTITION: functools.partial(stages.Partition, partitioner=_partitioner()),
            StageType.TO_EDGE_TRANSFORM_AND_LOWER: functools.partial(
                stages.ToEdgeTransformAndLower, default_partitioner_cls=_partitioner
            ),
        }
        super().__init__(module, example_inputs, stage_classes=stage_classes, dynamic_shapes=dynamic_shapes)


FLOW = suite_flow.TestFlow("openvino_backend", backend="openvino_backend", tester_factory=OpenvinoBackendTester)
suite_flow.all_flows = lambda: {FLOW.name: FLOW}
