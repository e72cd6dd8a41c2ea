"""Preprocess: one partition to an OpenVINO blob (passes, convert, edge layouts, validation)."""
