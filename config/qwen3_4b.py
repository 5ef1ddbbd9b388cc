"""Qwen3-4B on 8xH200: the paper's settings with the smaller model.

    torchrun --nproc_per_node=8 train.py config/qwen3_4b.py

Everything is config/qwen3_8b.py except the model, its memory plan and the output paths (so the two
cannot drift apart), with its labels: [paper]; [authors] with the file and key of the authors'
config (PettingLLMs pettingllms/config/autoevol/math_L1_iterated_br.yaml, AE, and
pettingllms/config/ppo_trainer/eval.yaml, PPO; the versions read: config/qwen3_8b.py); ours with
the reason, and where ours differs from theirs, their key: one shared policy (AE `specialization:
full`: two), one engine a rank (AE `tensor_model_parallel_size`: the node's GPUs), untruncated
sampling (AE `top_p: 0.9`, `top_k: 20`, `repetition_penalty: 1.10`), a checkpoint every 20 steps
(AE `save_freq: 5`), fp32 masters (PPO `model_dtype: bf16`), the prompt's length (AE
`max_prompt_length: 7000`), the data mix (AE `env.dataset: dapo_math`, read through `env.name:
math_env`), CodeContests' tests, the paper's format term (their gen_agent's: `--format_reward=
authors`), micro-batches of sequences (theirs PPO `use_dynamic_bsz`, 16,384 tokens). Taken as
theirs: AE `total_training_steps: 400`, `val_freq: 100`, and a constant 5e-6 (their `override_lr`
sets each update's lr; PPO's cosine schedule never takes effect). It fits one GPU too.
"""

exec(open(__file__.replace("qwen3_4b.py", "qwen3_8b.py")).read())

out_dir = "out/qwen3-4b-rl"  # ours
init_from = "out/sft-qwen3-4b"  # ours: Qwen3-4B (tied embeddings) after the SFT cold start
# ours: Qwen3-4B's smaller activations, twice the 8B's sequences a forward (theirs PPO
# `use_dynamic_bsz: True`, `ppo_max_token_len_per_gpu: 16384` for every model size)
micro_batch = 8
# The memory plan (config/qwen3_8b.py's arithmetic, init_from's 4.02e9 parameters, the idle
# role's Adam state offloaded as there): the trainer 16 B x 4.02e9 / ranks = 7.5 GiB on 8 ranks,
# 59.9 GiB on 1; the engine 0.5 x 139 = 69.5 GiB (bf16 weights 7.5 GiB, the KV cache of the 16
# sequences of a rank on 8: 36 GiB); 59.9 + 69.5 + 4 = 133.4 GiB of 139 on one GPU, the most it
# fits (tools/first_gpu_run.py --check steps a 4B-shaped model there with both Adam states).
# Without the offload the second state makes it 24 B: 163.4 GiB on one GPU, 2 GPUs needed
# config/qwen3_8b.py's, exec'd above, with the engine's share of this plan
engine_kwargs = dict(engine_kwargs, gpu_memory_utilization=0.5)  # noqa: F821
