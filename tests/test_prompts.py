"""One prompt rendering: SFT, RL, evaluation and distillation render a chat prompt with the same
template switches, the preset's chat_template_kwargs (settings.Config), so that a cold start trains
on the prompts RL samples from and evaluation scores. With a template that reads Qwen3's
enable_thinking, the Qwen3 preset's four renderings are one token sequence, and it is not the
template's default."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import evaluate
import settings
from machinery import engine
from tools import distill
from world import tiny

PRESET = "config/qwen3_8b.py"
# the switch Qwen3's template reads: thinking off pre-fills an empty think block
THINK = (
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n{% endif %}"
)
MESSAGES = [
    {"role": "system", "content": "You solve."},
    {"role": "user", "content": "Compute 2+3."},
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny model whose chat template reads enable_thinking, as Qwen3's does."""
    path = tmp_path_factory.mktemp("think")
    tiny.save_tiny(path, seed=0, hidden_size=32, num_layers=1)
    tok = tiny.build_tokenizer()
    tok.chat_template = tok.chat_template + THINK
    tok.save_pretrained(path)
    return path


def test_sft_rl_evaluation_and_distillation_render_one_prompt(folder):
    kw = settings.chat_template_kwargs(PRESET)
    assert kw == settings.parse_config([PRESET]).chat_template_kwargs == {"enable_thinking": False}
    tok = AutoTokenizer.from_pretrained(folder)
    # SFT (sft.py --config PRESET): the sample's prompt part
    sample = {"messages": MESSAGES, "completion": "5"}
    encoded, _ = engine.encode_samples(tok, [sample], template_kwargs=kw)
    ids, p = encoded[0]
    sft = ids[:p]
    # RL: train.py's engine, made with the Config's chat_template_kwargs
    cfg = settings.parse_config([PRESET])
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    rl = engine.HFEngine(model, tok, chat_template_kwargs=cfg.chat_template_kwargs)
    # evaluation (evaluate.py --config PRESET)
    ev = evaluate.load_engine(str(folder), "hf", template_kwargs=kw)
    # distillation (tools/distill.py --config PRESET): what the server renders from the request
    body = distill.request_body("teacher", MESSAGES, 16, kw)
    served = engine.prompt_ids(tok, body["messages"], **body["chat_template_kwargs"])
    assert sft == rl.encode_prompt(MESSAGES) == ev.encode_prompt(MESSAGES) == served
    assert tok.decode(sft).endswith("<think>\n\n</think>\n\n")
    # and the template's default (thinking on) is another prompt: the check can fail
    assert engine.prompt_ids(tok, MESSAGES) != sft
