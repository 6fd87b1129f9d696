"""train.py with one change to dt-primal's Decision Transformer: its return, state and action
embeddings and its action head keep PyTorch's default initialisation (uniform, scaled by fan-in), as
the original DT code and d3rlpy initialise them, instead of dt-primal's N(0, 0.02) for every linear
layer. The blocks, the timestep table and everything else are unchanged. This is the experiment
behind docs/results.md's "Cross-check against d3rlpy": whether that initialisation explains the gap
between dt-primal's DT and d3rlpy's at the DT paper's settings.

  python bench/dt_init_check.py --dataset dt-primal/hopper/medium-replay-v0 --seeds 0 1 2 \\
      --out results/dt-init-check-cpu/dt-primal_hopper_medium-replay-v0/dt --preset dt-paper --precision bf16 \\
      --steps 2500 --warmup-steps 250 --eval-every 500 --eval-episodes-during 5 --eval-episodes 100 --checkpoint-every 500

Every option is train.py's; --resume works as there, but only with this script (a checkpoint does
not record the initialisation).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dt_primal import model  # noqa: E402

_init = model.DecisionTransformer.__init__


def default_init_embeddings(self, cfg, state_dim: int, act_dim: int) -> None:
    _init(self, cfg, state_dim, act_dim)
    for layer in (self.embed_return, self.embed_state, self.embed_action, self.predict_action):
        layer.reset_parameters()  # PyTorch's default Linear initialisation


if __name__ == "__main__":
    model.DecisionTransformer.__init__ = default_init_embeddings
    os.chdir(ROOT)
    from datasets.loaders import load_dataset
    from dt_primal.cli import run_main
    from dt_primal.run import train_command
    run_main(lambda: train_command(sys.argv[1:], load_dataset))
