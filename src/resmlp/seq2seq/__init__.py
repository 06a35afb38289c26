"""Sequence-to-sequence ResMLP for machine translation (paper sections 2 and 3.6) and a Transformer baseline."""
