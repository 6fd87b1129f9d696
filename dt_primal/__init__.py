"""dt-primal: Decision Transformers with Causal Primal-Attention (Chen et al., NeurIPS 2023).

Importing it changes nothing in the process: the command-line programs make their process-wide
settings themselves (``dt_primal.process.configure_process``)."""
