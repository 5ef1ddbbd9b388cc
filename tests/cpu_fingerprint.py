"""The bits a CPU computes under machinery/cpu_bits.py's pins: sha256 (first 16 hex digits) of the
operations the tiny cold start's first steps use, on fixed inputs. A test compares them with those
recorded in tests/fixtures/cpu_bits.json.

    python tests/cpu_fingerprint.py        # restarts itself with the pins, then prints a line an op
"""

import hashlib
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from machinery import cpu_bits  # noqa: E402 (the project's root on the path first)


def fingerprint():
    """{what: sha256 of its bits[:16]}: the operations of the tiny cold start's first steps, on
    fixed inputs, in this process (run it under the pins: `python -m machinery.cpu_bits`)."""
    import torch  # here, not at the top: the pins come first

    from machinery.muon import Muon

    torch.set_num_threads(cpu_bits.threads(torch.get_num_threads()))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8 * 70, 128, generator=g)
    w = torch.randn(384, 128, generator=g) / 128**0.5
    out = {
        "linear 560x128 @ 128x384": torch.nn.functional.linear(x, w),
        "x^T g 128x560 @ 560x384": x.T @ torch.randn(8 * 70, 384, generator=g),
        "bmm 64x70x32 @ 64x32x70": torch.randn(64, 70, 32, generator=g)
        @ torch.randn(64, 32, 70, generator=g),
        "softmax": torch.softmax(torch.randn(64, 70, 70, generator=g), dim=-1),
        "log_softmax": torch.log_softmax(torch.randn(560, 128, generator=g) * 4, dim=-1),
        "rmsnorm": x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6),
        "silu": torch.nn.functional.silu(x),
        "exp": torch.exp(x),
    }
    p = torch.nn.Parameter(w.clone())
    p.grad = torch.randn(p.shape, generator=g)
    Muon([p], lr=2e-3).step()
    out["muon step"] = p.detach().clone()
    p.grad = torch.randn(p.shape, generator=g)
    torch.optim.AdamW([p], lr=5e-5).step()
    out["adamw step"] = p.detach().clone()
    out["3 sft steps of the tiny model"] = sft_steps(torch)
    return {
        k: hashlib.sha256(v.contiguous().numpy().tobytes()).hexdigest()[:16] for k, v in out.items()
    }


def sft_steps(torch):
    """The tiny model's weights (world/tiny.py's, the cold start's own) after three AdamW steps on a
    fixed batch of random tokens."""
    from world import tiny

    model, _ = tiny.build_model(seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    ids = torch.randint(3, 128, (8, 70), generator=torch.Generator().manual_seed(1))
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


if __name__ == "__main__":
    cpu_bits.restart_pinned(__file__)
    for what, digest in fingerprint().items():
        print(f"{digest}  {what}")
