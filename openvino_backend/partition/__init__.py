"""Partitioning: what OpenVINO runs, chosen and checked (rules, conversion, numerics, CPU kernels)."""
