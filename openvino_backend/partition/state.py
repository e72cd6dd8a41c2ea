"""What the partitioner learns in one of ExecuTorch's hooks and needs in a later one.

ExecuTorch calls ``ops_to_not_decompose``, then ``transform_for_pre_decomposition``,
then ``partition``, on the same partitioner, once per method of the program;
everything that crosses from one call to the next lives here, not on the
partitioner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.export import ExportedProgram


@dataclass
class ExportState:
    # Ops kept whole for OpenVINO (``ops_to_not_decompose``): the CPU-kernel check refuses any left out.
    kept_whole: frozenset[str] = frozenset()
    # Each transformed program's real state dict, in the order ExecuTorch transforms (and then
    # partitions) them: ``partition`` is handed a copy whose state dict holds fake tensors, and the
    # checks that convert and run partitions need the real weights.
    real_states: list[dict[str, torch.Tensor]] = field(default_factory=list)

    def remember_weights(self, program: ExportedProgram) -> None:
        self.real_states.append(dict(program.state_dict))

    def restore_weights(self, program: ExportedProgram) -> None:
        """Put real tensors back in the state dict of the fake copy ExecuTorch partitions.

        Nothing here writes to them; ExecuTorch restores the real program after
        partitioning anyway. Fake values left (a program not seen by
        ``transform_for_pre_decomposition``) make the numerical check stand aside.
        """
        real = self._take_state(program)
        placeholders = program.graph.find_nodes(op="placeholder")
        for node, spec in zip(placeholders, program.graph_signature.input_specs, strict=True):
            value = program.state_dict.get(spec.target) if spec.target is not None else None
            if not isinstance(value, FakeTensor):
                continue
            # Constants ExecuTorch lifts during to_edge (a scalar operand) keep their value on the fake.
            restored = real.get(spec.target, getattr(node.meta.get("val"), "constant", None))
            if restored is not None:
                program.state_dict[spec.target] = restored

    def _take_state(self, program: ExportedProgram) -> dict[str, torch.Tensor]:
        """The first state (in transform order) whose tensors fit ``program``'s fake ones; removed.

        ExecuTorch transforms every method, then partitions them in the same order; methods can share
        parameter names (two models of one architecture), so names alone do not tell their weights apart.
        """
        fakes = {k: v for k, v in program.state_dict.items() if isinstance(v, FakeTensor)}
        for index, state in enumerate(self.real_states):
            # (Constants ExecuTorch lifts during to_edge are in no state dict: restore_weights
            # reads them from their fakes.)
            if all(state[k].shape == v.shape and state[k].dtype == v.dtype for k, v in fakes.items() if k in state):
                return self.real_states.pop(index)
        return {}
