"""Hypothesis profiles: ``ci`` is bounded and reproducible; ``dev`` and ``nightly`` explore."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,  # a lowering takes ~0.3 s and varies with the machine's load
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
    "print_blob": True,
}

settings.register_profile("ci", max_examples=200, derandomize=True, **_COMMON)
settings.register_profile("dev", max_examples=300, **_COMMON)
settings.register_profile("nightly", max_examples=3000, **_COMMON)

PROFILES = ("ci", "dev", "nightly")
