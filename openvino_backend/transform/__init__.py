"""Before partitioning: constant subgraphs folded, dynamic outputs padded to their bound, ops
written in the forms that keep their meaning through ExecuTorch's edge dialect."""

from __future__ import annotations

import copy

from torch.export import ExportedProgram


def copied(program: ExportedProgram) -> ExportedProgram:
    """A copy of ``program`` a transform may rewrite (the caller's program stays as it was)."""
    return program._update(
        copy.deepcopy(program.graph_module),
        copy.deepcopy(program.graph_signature),
        state_dict=dict(program.state_dict),
        constants=dict(program.constants),
    )
