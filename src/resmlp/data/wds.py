"""WebDataset shards (placeholder until the reader lands)."""
