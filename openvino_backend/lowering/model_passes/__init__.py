"""Rewrites of the converted ``ov.Model`` (OpenVINO's graph, after the frontend), one subject per module
(``kv_cache_writes`` is the analysis ``kv_cache`` rewrites by); ``lowering/passes`` rewrites the FX graph."""
