"""Qwen3-8B, the paper's main setting: 8xH200, `torchrun --nproc_per_node=8 train.py config/qwen3_8b.py`.

[paper] marks the values the paper gives; everything else is ours (the paper does not give it). init_from is an
SFT cold start of Qwen3-8B (python sft.py --model Qwen3-8B --data DIR --out out/sft-qwen3-8b), data files in
data.py's format (python data.py convert ...).
"""

out_dir = "out/qwen3-8b-rl"
init_from = "out/sft-qwen3-8b"
data_mix = {"data/polaris.jsonl": 1.0, "data/apps.jsonl": 1.0}   # ours: equal math/code weights

M = 4                       # [paper]
N = 4                       # [paper]
K = 30                      # [paper] stage length
mode = "stagewise"          # [paper]
first_role = "designer"     # ours
policy = "shared"           # [paper] default: one model plays both roles
lam = 0.4                   # [paper]

batch_size = 8              # [paper] queries per step (1 per GPU on 8xH200)
lr = 5e-6                   # [paper]
steps = 300                 # ours
warmup_steps = 0            # ours
clip_eps = 0.2              # ours
clip_eps_high = 0.28        # ours (DAPO's clip-higher)
kl_coef = 0.0               # ours
ppo_epochs = 1              # ours: on-policy
minibatches = 1             # ours
micro_batch = 4             # ours
share_prompts = False       # ours: shared-prompt rows (a custom 4D mask) are tested on CPU only (FSDP2, checkpointing,
                            # compiled layers); bf16 with the GPU's sdpa kernels waits for a run on an H200
temperature = 1.0           # ours
max_tokens = 8192           # [paper] per completion
designer_max_tokens = 8192  # [paper]
max_calls = 16              # ours
script_timeout = 600.0      # ours

backend = "vllm"
engine_kwargs = {"max_model_len": 16384, "gpu_memory_utilization": 0.45, "enable_thinking": False}  # ours: no thinking
device = "cuda"
bf16 = True
activation_checkpointing = True
ac_policy = "full"          # ours: "selective" keeps every matmul output (~3.4 MB a token at 8B, 2.7 at 4B), which
                            # micro-batches of up to 4-8 sequences of up to 16k tokens cannot hold; see bench.py gpu
compile_layers = True       # ours: compiled decoder layers, 26% -> 35% MFU with full checkpointing (issue #21, H200)
logprob_compile = False     # ours: the faster log-prob options wait for `python bench.py gpu_logprob` on an H200
logprob_keep_logits = False
sleep_engine = True         # vLLM frees its KV cache while the trainer runs
save_every = 20
