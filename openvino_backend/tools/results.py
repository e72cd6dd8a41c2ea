"""What a command learned about each model, and the exit code it makes."""

from __future__ import annotations

from dataclasses import dataclass, field

from openvino_backend.partition.partitioner import PartitionReport
from openvino_backend.tools.verify import OutputCheck

EXIT_OK, EXIT_MISMATCH, EXIT_REFUSED, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3, 4


class UsageError(Exception):
    pass


@dataclass
class ModelResult:
    """Everything ``verify`` learned about one model."""

    name: str
    report: PartitionReport | None = None
    refused: str | None = None
    refused_kind: str | None = None
    outputs: list[OutputCheck] = field(default_factory=list)
    run_error: str | None = None
    modified_inputs: list[int] = field(default_factory=list)
    draws: int = 0
    sizes: int = 1  # input sizes each draw ran at (dynamic dims)

    @property
    def exit_code(self) -> int:
        if self.refused is not None:
            return EXIT_REFUSED
        ok = self.run_error is None and not self.modified_inputs and all(o.ok for o in self.outputs)
        return EXIT_OK if ok else EXIT_MISMATCH
