"""Hugging Face datasets (placeholder until the reader lands)."""
