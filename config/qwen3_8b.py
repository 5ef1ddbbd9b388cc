"""Qwen3-8B, the paper's main setting, on 8xH200:

    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py

[paper] marks the values the paper gives. [authors] marks those taken from the authors' released
config where the paper is silent, with its file and key: PettingLLMs, the K=30 run
pettingllms/config/autoevol/math_L1_iterated_br.yaml (AE, as of 2026-04-23), whose optimizer block
is pettingllms/config/ppo_trainer/eval.yaml (PPO, as of 2026-04-13), the version AE reads
(docs/NOTES.md, issue #69, names the commits read and how the schedule changed across versions),
and where that key takes effect in their trainer: pettingllms/trainer/ (the PPO trainer, TR:
multi_agents_ppo_trainer.py; the rollout, EX: multi_agents_execution_engine_autoevol.py and
async_generate.py) and the verl copy in that repository (verl/verl/workers/: fsdp_workers.py and
actor/dp_actor.py), as of the AE commit. A key their run never reads is named as such.
Ours marks our choices, each with its reason, and where it differs from theirs, their key and value.
docs/gpu.md's table "ours / theirs / why" lists every difference that changes a run.
init_from is an SFT cold start of Qwen3-8B (`python sft.py --model Qwen/Qwen3-8B --data DIR --out
out/sft-qwen3-8b`), the data files in machinery/data.py's task format (`python machinery/data.py
prepare ...`): docs/gpu.md makes both.

It needs 2 GPUs at least (the memory plan below; settings.validate refuses fewer), and is set for 8.
`python train.py config/qwen3_8b.py --plan --ranks=1,2,8` prints the plan, before any file exists.
"""

out_dir = "out/qwen3-8b-rl"  # ours
init_from = "out/sft-qwen3-8b"  # ours: the path docs/gpu.md's SFT writes
# One model plays both roles: policy "shared" [paper] (the paper's default). Theirs differs: AE
# `specialization: full` with `designer_policy` and `executor_policy`, two policies from one cold
# start (`base_models`, both the same path); `--policy=separate` runs that (Config's two models,
# each its own AdamW state)
policy = "shared"
# [paper] Polaris + APPS + CodeContests, their train splits (`python machinery/data.py prepare
# polaris apps_train codecontests_train`; the benchmarks' test splits are evaluation's only), half
# math, half code. Theirs differs: AE `env.name: math_env` makes EX's env batch MathEnvBatch, whose
# load_math_problem_batch (multi_agent_env/math/math_utils.py) reads `env.dataset: dapo_math`: their
# run trains on DAPO-Math alone, math only. AE's `math_ratio: 0.5`, `dataset_math: polaris`,
# `dataset_code: code_contests` and `apps_ratio: 0.0` are read by multi_agent_env/mixed/mixed_env.py
# alone (`env.name: mixed_env`), not by this run. CodeContests tasks are graded on public + private
# + generated tests (ours, as AlphaCode: fewer false passes); their loader, private tests alone
# (machinery/data.py's CC_TESTS)
data_mix = {
    "data/polaris.jsonl": 1.0,
    "data/apps_train.jsonl": 0.5,
    "data/codecontests_train.jsonl": 0.5,
}

# [paper]; [authors] AE `design_sample_num: 4`, `execute_sample_num: 4`: EX's
# _load_config_parameters and init_agents_and_envs (`sample_num = design_sample_num *
# execute_sample_num` in train mode)
M = 4
N = 4
# [paper] stage length; [authors] AE `phase_alternate_steps: 30`, `first_phase_trains: executor`
# (the paper is silent on the first role): TR.fit, `phase = (global_steps // 30) % 2` from step 0,
# the other policy frozen (its update skipped) for the phase
K = 30
mode = "stagewise"  # [paper]
first_role = "executor"
lam = 0.4  # [paper]
# ours: the paper's λ·format (reward.py), where theirs is their own term (+0.4 a `<delivery>`
# block, +0.4 a boxed answer or a parseable solution: multi_agent_env/autoevol/gen_agent.py,
# MASGenerator.step and MASExecutor.step), added to both roles' reward; `--format_reward=authors`
# puts theirs in place of λ·format
format_reward = "paper"

batch_size = 8  # [paper] queries per step (1 per GPU on 8xH200); [authors] AE `train_batch_size: 8`
# (EX's gen_batch_size in train mode)
designer_lr = 5e-6  # [paper]; [authors] AE `designer_lr: 5e-6`
executor_lr = 5e-6  # [paper]; [authors] AE `executor_lr: 5e-6`
steps = 400  # [authors] AE `total_training_steps: 400` (TR.fit's loop; the paper gives none)
# [authors] a constant 5e-6: with `designer_lr` and `executor_lr` set, TR._update_parameters puts
# `override_lr` into each role's sub-batch meta info, and fsdp_workers.update_actor writes it into
# every param group before the update (the scheduler's value put back after): PPO `optim`'s
# `warmup_style: cosine` (10 warmup steps, down to `min_lr_ratio: 0.3`) steps but never takes effect
lr_schedule = "constant"
# Config's defaults, not set here: weight_decay 0.01 [authors] PPO `weight_decay: 0.01`
# (fsdp_workers._build_model_optimizer's AdamW), grad_clip 1.0 [authors] PPO `grad_clip: 1.0`
# (dp_actor._optimizer_step), clip_eps 0.2 [authors] PPO `clip_ratio_low`/`_high: 0.2`, no KL term
# [authors] PPO `use_kl_loss: False` (both dp_actor.update_policy), a token-mean loss (PPO
# `loss_agg_mode: "token-mean"`: theirs per micro-batch, below), full fine-tuning [authors] AE
# `lora_rank: 0`
# ours: on-policy, one optimizer step a rollout (the paper does not say; theirs PPO
# `ppo_mini_batch_size: 16`, `ppo_epochs: 1`: dp_actor.update_policy, an optimizer step per 16 of
# their trainer's own samples)
minibatches = 1
# ours: 4 sequences a forward, the loss a token-mean over the whole batch's trained tokens (grpo.py:
# the micro-batches add up to the one-batch loss). Theirs: PPO `use_dynamic_bsz: True`,
# `ppo_max_token_len_per_gpu: 16384` (dp_actor.update_policy: micro-batches packed to 16,384 tokens,
# each a token-mean weighted by its sequences / `ppo_mini_batch_size`: sequence-weighted
# token-means). AE's `ppo_micro_batch_size_per_gpu: 4` sits under `ppo_trainer_config.actor`, a key
# verl never reads (it reads `actor_rollout_ref.actor`)
micro_batch = 4
# ours: the lm head a chunk at a time (machinery/logprob_rows.py); shared-prompt rows (a custom 4D
# mask) are tested on CPU only, and the compiled/kept-logit variants wait for
# `python tools/bench.py train` on an H200
logprobs = "chunked"
# [paper] per completion; [authors] AE `max_response_length: 8192` (async_generate.py's sampling
# `max_tokens`, both roles)
max_tokens = 8192
designer_max_tokens = 8192  # [paper]
# the prompt: [authors] AE `max_prompt_length: 7000`, longer prompts dropped; ours: no separate
# cap, a prompt and its completion within the engine's max_model_len (16384 = 8192 + 8192 below),
# so no task is dropped for its length
# Sampling (async_generate.py reads `train_llm_config` in training, `val_llm_config` in
# validation): T 1 [authors] AE `train_llm_config.temperature: 1.0`, untruncated (top_p 1, no top-k,
# no repetition penalty): ours, where theirs is AE `top_p: 0.9`, `top_k: 20`, `min_p: 0.0`,
# `repetition_penalty: 1.10` (the Designer's and the Executor's `train_llm_config` alike). Ours
# because the clipped ratio pi_theta / pi_old needs the sampler's own distribution: truncation and
# a repetition penalty sample from one the trainer's log-probs are not of (engine.Sampling has
# neither field)

backend = "vllm"
# ours: one engine a rank (`tensor_model_parallel_size` 1: each rank rolls out its share of the
# queries, its weights synced from its own shards), where theirs is one engine over the node's GPUs
# (AE `tensor_model_parallel_size: ${resource.n_gpus_per_node}`, 8): the 8B model's bf16 weights
# (15.3 GiB) fit one GPU, so no all-reduce a token and no cross-GPU weight sync. The engine's share
# of the GPU from the memory plan below (theirs PPO `gpu_memory_utilization: 0.8`); max_model_len:
# the prompt's room
engine_kwargs = {"max_model_len": 16384, "gpu_memory_utilization": 0.45}
# ours: each agent call submitted to the engine when its script makes it, so that no call waits for
# another script's longest reply (sandbox.run_workflows; the tiny preset keeps the reference,
# "ticks"); as the authors do, each call a request of its own to verl's async vLLM server
rollout_schedule = "continuous"
# [authors] AE `enable_thinking: false` (train and val alike): every prompt rendered with it off,
# in SFT, RL, evaluation and distillation
chat_template_kwargs = {"enable_thinking": False}
device = "cuda"
# ours: fp32 master weights (train.load_model: Adam's 5e-6 steps are below bf16's resolution of most
# weights), bf16 compute on the GPU and in the engine; [authors] PPO `model_dtype: bf16`
# The benchmark curve during RL (world/heldout.py's Benchmark): [authors] AE `val_freq: 100`
# (TR.fit: at step 0, `val_before_train`'s default, and every 100), greedy (AE `val_llm_config`:
# `temperature: 0`, `top_p: 1`, `top_k: -1`; `validate_sample_num: 1`, EX in validate mode: one
# draw a problem, heldout.VAL_SAMPLING), on AE `benchmark: AIME24` (MathEnvBatch in validate mode:
# all 30 problems)
val_tasks = "aime24"
val_every = 100
# The memory plan of a rank (plans.memory_plan, checked before any model loads, from
# init_from's 8.19e9 parameters: Qwen3-8B, untied lm_head; `python train.py config/qwen3_8b.py
# --plan` prints it per rank count), one H200:
#   update: 4 B weights + 4 B gradients + 8 B the active role's Adam (the idle role's in host
#     memory: offload_idle_state below) = 16 B x 8.19e9 / 8 ranks = 15.3 GiB; without the offload
#     both roles' states after the first switch: 24 B = 22.9 GiB
#   engine: 0.45 x 139 GiB = 62.6 GiB: the bf16 weights (2 B x 8.19e9 = 15.3 GiB), ~4 GiB of
#     activations and CUDA graphs, and a KV cache for the rollout's 16 sequences of a rank (B/8
#     queries x M x N) at max_model_len: 16 x 16384 tokens x 144 KiB (36 layers x 8 KV heads x
#     128 x 2 x bf16) = 36 GiB; asleep during the update, its share is the activations' room
#   15.3 + 62.6 + 4 reserve = 81.8 GiB of 139 (89.4 without the offload). On 2 GPUs 127.6 (158.1
#     without the offload: 4 GPUs then); on 1 the trainer alone is 122 GiB: refused.
# ours: the idle role's AdamW state in pinned host memory for its stage (machinery/offload.py):
# 8 B x 8.19e9 / ranks of host memory a rank, 61 GiB a node
offload_idle_state = True
ac_policy = (
    "full"  # ours: "selective" keeps every matmul output, which micro-batches of 4-8 sequences
)
# of up to 16k tokens cannot hold (the figures: docs/NOTES.md, bench.py gpu); [authors] PPO
# `enable_gradient_checkpointing: True`
compile_layers = True  # ours: compiled decoder layers (bench.py gpu)
# ours: a crash loses at most 20 steps, where theirs is AE `save_freq: 5`: a checkpoint here is the
# bf16 model folder (16.4 GB) and the fp32 masters with both Adam states (8.19e9 x 20 B = 164 GB),
# so 80 of them would write 14 TB; the 2 newest are kept, and every val_every-th (rundir.stale)
save_every = 20
