"""Analyses of trained models: weight images and sparsity (paper section 3.3) and the Table 1 benchmark."""
