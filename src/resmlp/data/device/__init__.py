"""Batches decoded and augmented where the model runs (data.pipeline: device; in-memory arrays too)."""
