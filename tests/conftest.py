"""Three tiers of tests, so that an answer comes in the time a change deserves:

- unmarked: ``pytest -n auto -m "not slow"``, the inner loop (a few minutes);
- ``slow``: what the README's ``pytest -n auto`` adds (large models, fresh interpreters, the INT8
  and quantizer suites);
- ``sweep``: long sweeps over many cases of one kind (every decoder family, every quantizer mode),
  collected only with ``--sweeps``; CI runs them after the README's command.

Across the tiers, ``isa`` marks the tests whose outcome depends on the CPU's instruction set (VNNI,
BF16, AVX2 INT8 kernels): CI runs them again on an emulated AVX2-only CPU (``.ci/avx2-python``).
``-n auto`` runs a test file per worker (``--dist loadfile`` in setup.cfg), so a file's shared
exports (module-scoped fixtures) are made once."""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sweeps", action="store_true", help="also run the long sweeps (tests marked sweep)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--sweeps"):
        return
    sweeps = [item for item in items if item.get_closest_marker("sweep")]
    if sweeps:
        config.hook.pytest_deselected(items=sweeps)
        items[:] = [item for item in items if not item.get_closest_marker("sweep")]
