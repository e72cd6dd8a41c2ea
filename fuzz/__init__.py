"""Hypothesis-driven search for graphs the OpenVINO backend gets wrong."""
