"""From datasets to batches: samplers, DataLoaders, prefetching, and a run's assembled data."""
