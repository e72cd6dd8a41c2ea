"""Three tiers of tests, so that an answer comes in the time a change deserves:

- unmarked: ``pytest -m "not slow"``, the inner loop (a few minutes);
- ``slow``: what the README's ``pytest`` adds (large models, fresh interpreters, the INT8 and
  quantizer suites);
- ``sweep``: long sweeps over many cases of one kind (every decoder family, every quantizer mode),
  collected only with ``--sweeps``; CI runs them after the README's command.
"""

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
