"""Qwen3-4B on 8xH200: the paper's settings with the smaller model.

    torchrun --nproc_per_node=8 train.py config/qwen3_4b.py

Everything is config/qwen3_8b.py except the model and output paths (so the two cannot drift apart).
"""

exec(open(__file__.replace("qwen3_4b.py", "qwen3_8b.py")).read())

out_dir = "out/qwen3-4b-rl"
init_from = "out/sft-qwen3-4b"  # Qwen3-4B (tied embeddings) after the SFT cold start
micro_batch = 8  # ours
