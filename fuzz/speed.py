"""Make a long fuzzing run spend its time on our code, not on repeated torch set-up.

``torch.export``'s decomposition step re-collects every CompositeImplicit op
of every namespace on each call (~0.26 s of a ~0.7 s graph here). The answer
only changes when ops are registered, so this caches it keyed on the number of
registered ops: the same ops are preserved or decomposed as without it.
"""

from __future__ import annotations

import torch
import torch._export.utils as export_utils
import torch.export.decomp_utils as decomp_utils
import torch.export.exported_program as exported_program

_original = export_utils._collect_all_valid_cia_ops
_cache: dict[int, frozenset] = {}


def _collect_cached() -> set:
    key = len(torch._C._dispatch_get_all_op_names())
    if key not in _cache:
        _cache[key] = frozenset(_original())
    return set(_cache[key])  # callers may mutate the set they get


def cache_cia_op_collection() -> None:
    for module in (export_utils, decomp_utils, exported_program):
        module._collect_all_valid_cia_ops = _collect_cached
