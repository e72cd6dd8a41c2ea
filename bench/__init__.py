"""Benchmarks: what the safe backend costs in lowering and inference time."""
