"""Qwen3-8B, the paper's main setting, on 8xH200:

    torchrun --nproc_per_node=8 train.py config/qwen3_8b.py

[paper] marks the values the paper gives, [authors] those of the authors' released config where the
paper is silent; everything else is ours. init_from is an SFT cold start of Qwen3-8B (`python sft.py
--model Qwen/Qwen3-8B --data DIR --out out/sft-qwen3-8b`), the data files in machinery/data.py's
task format (`python machinery/data.py convert ...`): docs/gpu.md makes both.

It needs 2 GPUs at least (the memory plan below; settings.validate refuses fewer), and is set for 8.
`python train.py config/qwen3_8b.py --plan --ranks=1,2,8` prints the plan, before any file exists.
"""

out_dir = "out/qwen3-8b-rl"
init_from = "out/sft-qwen3-8b"
# [paper] Polaris + APPS + CodeContests, their train splits (`python machinery/data.py prepare
# polaris apps_train codecontests_train`; the benchmarks' test splits are evaluation's only);
# [authors] math_ratio 0.5: half math, half code (their code half: code_contests alone)
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
steps = 300  # ours
minibatches = 1  # ours: on-policy (the paper does not say; clip 0.2 both ways, no KL: [authors])
micro_batch = 4  # ours
logprobs = (
    "chunked"  # ours: the lm head a chunk at a time (chunked.py); shared-prompt rows (a custom 4D
)
# mask) are tested on CPU only, and the compiled/kept-logit variants wait for
# `python tools/bench.py train` on an H200
max_tokens = 8192  # [paper] per completion
designer_max_tokens = 8192  # [paper]
# Sampling: untruncated (top_p 1, no top-k, no repetition penalty), a deliberate difference from the
# authors' rollouts (top_p 0.9, top_k 20, a repetition penalty): the trainer's log-probs are then
# the sampler's own.

backend = "vllm"
# ours: the engine's share of the GPU from the memory plan below
engine_kwargs = {"max_model_len": 16384, "gpu_memory_utilization": 0.45}
# [authors] no thinking: every prompt rendered with it off, in SFT, RL, evaluation and distillation
chat_template_kwargs = {"enable_thinking": False}
device = "cuda"
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
save_every = 20
