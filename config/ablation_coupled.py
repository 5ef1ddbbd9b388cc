"""Ablation (paper Table: co-evolution schedule): train both roles at every step instead of
stagewise.

    python train.py config/tiny.py config/ablation_coupled.py
    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py config/ablation_coupled.py \\
        --out_dir=out/8b-coupled

Later files override earlier ones; combine with any preset. For the single-role ablations use
--mode=designer or --mode=executor; for separate policies --policy=separate.
"""

mode = "coupled"
out_dir = "out/ablation-coupled"
