"""Sub-commands of the `resmlp` CLI; each module registers its parsers and delegates to the library."""
