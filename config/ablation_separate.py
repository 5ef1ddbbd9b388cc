"""Ablation: separate Designer and Executor policies (two models, two optimizers; the engine swaps
weights between the design and the execution phase), each cold-started by `python sft.py --roles
separate`, which writes init_from/designer and init_from/executor (made when missing, in the tiny
world).

    python train.py config/tiny.py config/ablation_separate.py
"""

policy = "separate"
init_from = "out/tiny-sft-separate"
out_dir = "out/ablation-separate"
