"""Qwen3-8B, the paper's main setting, on 8xH200:

    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py

[paper] marks the values the paper gives, [authors] those of the authors' released config
(PettingLLMs config/autoevol/math_L1_iterated_br.yaml and eval.yaml) where the paper is silent;
ours marks our choices, each with its reason and where it differs from the authors' config.
init_from is an SFT cold start of Qwen3-8B (`python sft.py --model Qwen/Qwen3-8B --data DIR --out
out/sft-qwen3-8b`), the data files in machinery/data.py's task format (`python machinery/data.py
prepare ...`): docs/gpu.md makes both.

It needs 2 GPUs at least (the memory plan below; settings.validate refuses fewer), and is set for 8.
`python train.py config/qwen3_8b.py --plan --ranks=1,2,8` prints the plan, before any file exists.
"""

out_dir = "out/qwen3-8b-rl"  # ours
init_from = "out/sft-qwen3-8b"  # ours: the path docs/gpu.md's SFT writes
# [paper] Polaris + APPS + CodeContests, their train splits (`python machinery/data.py prepare
# polaris apps_train codecontests_train`; the benchmarks' test splits are evaluation's only);
# [authors] math_ratio 0.5: half math, half code. Their config's math set is polaris (a dapo_math
# set is in it too, unused here: the paper names Polaris); their code half is code_contests alone
# (apps_ratio 0): ours adds APPS train at half of it, as the paper names APPS. CodeContests tasks
# are graded on public + private + generated tests (ours, as AlphaCode: fewer false passes);
# [authors] private tests alone (machinery/data.py's CC_TESTS)
data_mix = {
    "data/polaris.jsonl": 1.0,
    "data/apps_train.jsonl": 0.5,
    "data/codecontests_train.jsonl": 0.5,
}

M = 4  # [paper]
N = 4  # [paper]
K = 30  # [paper] stage length
mode = "stagewise"  # [paper]
first_role = "executor"  # [authors] (the paper is silent)
policy = "shared"  # [paper] default: one model plays both roles
lam = 0.4  # [paper]

batch_size = 8  # [paper] queries per step (1 per GPU on 8xH200)
designer_lr = 5e-6  # [paper]
executor_lr = 5e-6  # [paper]
steps = 300  # ours: the run's length, a budget
# ours: a constant lr (the paper gives no schedule; none found in the authors' config either);
# "warmup_cosine" (10 warmup steps, then cosine to 0.3x) is the reading issue #55 reports of it
lr_schedule = "constant"
# Config's defaults, not set here: [authors] weight_decay 0.01, grad_clip 1.0, clip_eps 0.2
minibatches = 1  # ours: on-policy (the paper does not say; clip 0.2 both ways, no KL: [authors])
micro_batch = 4  # ours: 4 sequences of up to 16k tokens a forward (ac_policy full)
logprobs = (
    "chunked"  # ours: the lm head a chunk at a time (chunked.py); shared-prompt rows (a custom 4D
)
# mask) are tested on CPU only, and the compiled/kept-logit variants wait for
# `python tools/bench.py train` on an H200
max_tokens = 8192  # [paper] per completion ([authors] max response length 8192 too)
designer_max_tokens = 8192  # [paper]
# the prompt: [authors] max_prompt_length 7000, longer prompts dropped; ours: no separate cap, a
# prompt and its completion within the engine's max_model_len (16384 = 8192 + 8192 below), so no
# task is dropped for its length
# Sampling: untruncated (top_p 1, no top-k, no repetition penalty), a deliberate difference from the
# authors' rollouts (top_p 0.9, top_k 20, a repetition penalty): the trainer's log-probs are then
# the sampler's own.

backend = "vllm"
# ours: the engine's share of the GPU from the memory plan below; max_model_len: the prompt's room
engine_kwargs = {"max_model_len": 16384, "gpu_memory_utilization": 0.45}
# [authors] no thinking: every prompt rendered with it off, in SFT, RL, evaluation and distillation
chat_template_kwargs = {"enable_thinking": False}
device = "cuda"
# ours: fp32 master weights (train.load_model: Adam's 5e-6 steps are below bf16's resolution of most
# weights), bf16 compute on the GPU and in the engine; [authors] model_dtype bf16
# The benchmark curve during RL (world/heldout.py's Benchmark): [authors] validate every 100 steps,
# greedy (their val_freq 100, temperature 0): `--val_every=100` turns it on, on AIME24 (all 30) at
# T 0 ([authors] greedy: heldout.VAL_SAMPLING). Ours: off here, because tools/first_gpu_run.py's
# stand-in reuses this preset without data/aime24.jsonl
val_tasks = "aime24"  # ours: 30 problems, the cheapest of the paper's math benchmarks
val_every = 0
# The memory plan of a rank (settings.memory_plan, checked before any model loads, from
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
# of up to 16k tokens cannot hold (the figures: docs/NOTES.md, bench.py gpu)
compile_layers = True  # ours: compiled decoder layers (bench.py gpu)
save_every = 20  # ours: a crash loses at most 20 steps
