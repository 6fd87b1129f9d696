"""The model: a Decision Transformer whose blocks use softmax or Causal Primal-Attention, and the BC baseline.

architecture.py  its config (``ModelConfig``): plain data, without torch
transformer.py   the Decision Transformer and its loss (eq. 10)
attention.py     softmax attention and Causal Primal-Attention (eq. 9), the KSVD objective (eq. 11)
dropout.py       dropout masks that are cheap to draw on a CPU
bc.py            behaviour cloning: the DT paper's MLP from the last K states, and its loss
build.py         the model a config names, and its loss
members.py       the member dimension every weight carries: an ensemble of seeds and datasets as one model
"""
