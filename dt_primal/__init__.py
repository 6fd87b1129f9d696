"""dt-primal: Decision Transformers with Causal Primal-Attention (Chen et al., NeurIPS 2023)."""
import os

# OpenMP threads that spin while they wait slow torch down badly whenever another process shares
# the cores (the training step ran 1.5x faster with PASSIVE here, docs/benchmarks.md "Profile").
# Set before torch is first imported; a value in the environment still wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
