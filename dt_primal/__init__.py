"""dt-primal: Decision Transformers with Causal Primal-Attention (Chen et al., NeurIPS 2023)."""
