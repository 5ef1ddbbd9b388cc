import itertools
import math

import pytest
import torch

from advantage import designer_advantages, executor_advantages

EPS32 = 2.0**-23  # fp32 machine epsilon; the unit roundoff u is half of it


def fp32_tol(values, z, n=None, m=None):
    """How far advantage.py's fp32 (x - mean) / (std + eps) of `values` may be from naive_norm's
    fp64 one, whatever order a CPU's kernels sum in. The values are fp32 numbers, exact on both
    sides. A sum of n terms of size <= m in any order is off by <= n·u·n·m, so the mean by <= n·u·m;
    the centred values by that plus one rounding; the std's relative error is <= (that)/std + n·u (a
    sum of squares, a division, a square root). So |Δz| <= (n + 2)·u·(m/std)·(1 + |z|) + (n/2 +
    3)·u·|z| <= n·eps·((m/std)·(1 + |z|) + |z|) for n >= 2. n, m: the rewards behind the group (the
    designer's means carry their own sums of N rewards, which n = M·N and m = max|R| cover). A
    constant group is exactly 0 on both sides (advantage.py sets it): tolerance 0."""
    n = len(values) if n is None else n
    m = max(abs(v) for v in values) if m is None else m
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1))
    return 0.0 if std == 0 else n * EPS32 * ((m / std) * (1 + abs(z)) + abs(z))


def naive_norm(values, eps=1e-6):
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return [0.0] * n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return [(v - mean) / (std + eps) for v in values]


def test_hand_computed():
    R = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])  # M=3 designs, N=2 executions
    # Halves and their sums are exact in fp32; what rounds is the std (sqrt(0.3), sqrt(0.5);
    # torch.std's running mean) and one division: a few ulps (eps = 1.2e-7), within assert_close's
    # fp32 default rtol 1.3e-6 (~11 eps). R̄ = [0.5, 0, 1], mean 0.5, unbiased std 0.5
    torch.testing.assert_close(designer_advantages(R, eps=0.0), torch.tensor([0.0, -1.0, 1.0]))
    # all six rewards: mean 0.5, unbiased std sqrt(1.5 / 5)
    s = 0.5 / math.sqrt(0.3)
    torch.testing.assert_close(
        executor_advantages(R, eps=0.0), torch.tensor([[s, -s], [-s, -s], [s, s]])
    )


def test_random_against_naive_loops():
    g = torch.Generator().manual_seed(0)
    # leading dims [2, 3], M=4, N=5
    R = torch.randint(0, 3, (2, 3, 4, 5), generator=g).float() * 0.7
    d, e = designer_advantages(R), executor_advantages(R)
    assert d.shape == (2, 3, 4) and e.shape == R.shape
    # fp32 against fp64, each within fp32_tol (its derivation there)
    for a in range(2):
        for b in range(3):
            rows = R[a, b].tolist()
            means = [sum(r) / len(r) for r in rows]
            mn = dict(n=len(rows) * len(rows[0]), m=R[a, b].abs().max().item())
            for i, v in enumerate(naive_norm(means)):
                assert d[a, b, i].item() == pytest.approx(v, rel=0, abs=fp32_tol(means, v, **mn))
            every = [x for r in rows for x in r]
            flat = naive_norm(every)
            for k, v in enumerate(flat):
                i, j = divmod(k, len(rows[0]))
                assert e[a, b, i, j].item() == pytest.approx(v, rel=0, abs=fp32_tol(every, v))


@pytest.mark.parametrize("shape", [(4, 3), (1, 3), (3, 1), (1, 1), (2, 1, 1)])
def test_degenerate_groups_give_zeros(shape):
    for fill in (0.0, 1.0, 0.4):
        R = torch.full(shape, fill)
        for out in (designer_advantages(R), executor_advantages(R)):
            assert torch.isfinite(out).all() and (out == 0).all()  # exact: set to 0, not computed
    # M = 1 with varied executions: the designer has nobody to compare with -> 0
    R = torch.tensor([[0.0, 1.0, 1.0]])
    assert (designer_advantages(R) == 0).all()
    assert torch.isfinite(executor_advantages(R)).all() and executor_advantages(R).abs().sum() > 0


def test_failed_executions_stay_in_group():
    # design 0 crashed in every execution (reward 0): it stays in the group and is pushed down
    R = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0]])
    d = designer_advantages(R)
    assert d[0] < d[1] < d[2]
    e = executor_advantages(R)
    assert (e[0] < 0).all() and e.shape == R.shape


def test_query_grouping_credits_good_designs():
    # the executions of a query compete as one group: a run that scores 1.0 under a good design
    # (whose other runs scored 1.0 too) gets the same credit as one under a bad design, and a
    # positive one, where a per-design group would give the good design's constant runs nothing
    R = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    q = executor_advantages(R)
    # exact: equal inputs through the same element-wise ops (each IEEE-rounded) against the same
    # mean and std give equal outputs on any CPU
    assert q[1, 0] == q[1, 1] == q[0, 0] > 0 > q[0, 1]


def test_bad_input():
    with pytest.raises(ValueError, match="M, N"):
        designer_advantages(torch.zeros(3))
    assert designer_advantages([[1, 0], [0, 0]]).dtype == torch.float32


def test_runs_that_never_happened_are_left_out_of_the_executor_group():
    # the example: three parsed designs whose runs all score 0.4, one unparsed design (never
    # run)
    R = torch.tensor([[0.4, 0.4], [0.4, 0.4], [0.4, 0.4], [0.0, 0.0]])
    E = torch.tensor([[True, True]] * 3 + [[False, False]])
    before = executor_advantages(R)  # the unparsed slots shift the mean: ~+0.54 each
    want = 0.1 / (math.sqrt((6 * 0.01 + 2 * 0.09) / 7) + 1e-6)  # (x - mean) / (std + eps), fp64
    # 8 fp32 terms
    assert before[0, 0].item() == pytest.approx(
        want, rel=0, abs=fp32_tol(R.view(-1).tolist(), want)
    )
    # exact: the executed runs form a constant group, which advantage.py sets to 0 (no arithmetic)
    # no run was better than another
    assert torch.equal(executor_advantages(R, executed=E), torch.zeros(4, 2))
    # the Designer keeps its failure: the unparsed design's advantage is negative
    assert designer_advantages(R)[3] < 0


def test_executed_mask_against_naive_loops():
    g = torch.Generator().manual_seed(1)
    R = torch.randint(0, 3, (6, 3, 4), generator=g).float() * 0.7  # B=6 queries, M=3, N=4
    E = torch.rand(6, 3, 4, generator=g) < 0.6
    E[0] = True  # all executed: as without the mask
    E[1] = False  # none executed: zeros
    E[2, 0, 0], E[2].view(-1)[1:] = True, False  # a single executed run: zero
    got = executor_advantages(R, executed=E)
    # each entry's fp32_tol against fp64 (derivation there)
    tol = torch.zeros(R.shape, dtype=torch.float64)
    cells = list(itertools.product(range(3), range(4)))  # a query's runs (i, j): one group
    for b in range(6):
        live = [c for c in cells if E[b][c]]
        vals = [R[b][c].item() for c in live]
        want = naive_norm(vals) if len(set(vals)) > 1 else [0.0] * len(vals)
        for c, w in zip(live, want):
            tol[b][c] = fp32_tol(vals, w) if len(set(vals)) > 1 else 0.0
            assert got[b][c].item() == pytest.approx(w, rel=0, abs=tol[b][c].item())
        for c in cells:
            if not E[b][c]:
                assert got[b][c].item() == 0.0  # exact: set to 0
    # all executed is the plain case: one normaliser, the same numbers bit for bit
    assert torch.equal(got[0], executor_advantages(R[0]))
    assert torch.equal(
        got[0], executor_advantages(R[0], executed=torch.ones(3, 4, dtype=torch.bool))
    )
    with pytest.raises(ValueError, match="shape"):
        executor_advantages(R, executed=E[:, :2])


def test_one_normaliser_for_both_advantages():
    # the designer's advantages are the executor's normaliser over the design means (one run a
    # design, every design in the group): one formula for both, bit for bit
    g = torch.Generator().manual_seed(0)
    R = torch.randint(0, 3, (2, 3, 4, 5), generator=g).float() * 0.7
    means = R.mean(dim=-1, keepdim=True)  # [..., M, 1]
    assert torch.equal(designer_advantages(R), executor_advantages(means).squeeze(-1))
