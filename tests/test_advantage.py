import math

import pytest
import torch

from advantage import designer_advantages, executor_advantages


def naive_norm(values, eps=1e-6, normalize_std=True):
    n = len(values)
    mean = sum(values) / n
    if not normalize_std:
        return [v - mean for v in values]
    if n < 2:
        return [0.0] * n
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return [(v - mean) / (std + eps) for v in values]


def test_hand_computed():
    R = torch.tensor([[1.0, 0.0], [0.0, 0.0], [1.0, 1.0]])  # M=3 designs, N=2 executions
    # R̄ = [0.5, 0, 1], mean 0.5, unbiased std 0.5
    torch.testing.assert_close(designer_advantages(R, eps=0.0), torch.tensor([0.0, -1.0, 1.0]))
    # all six rewards: mean 0.5, unbiased std sqrt(1.5 / 5)
    s = 0.5 / math.sqrt(0.3)
    torch.testing.assert_close(executor_advantages(R, eps=0.0), torch.tensor([[s, -s], [-s, -s], [s, s]]))
    # per design: [1, 0] -> ±1/sqrt(2); constant rows -> 0
    r = 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(executor_advantages(R, eps=0.0, group="design"),
                               torch.tensor([[r, -r], [0.0, 0.0], [0.0, 0.0]]))
    # Dr. GRPO: centering only
    torch.testing.assert_close(designer_advantages(R, normalize_std=False), torch.tensor([0.0, -0.5, 0.5]))
    torch.testing.assert_close(executor_advantages(R, normalize_std=False, group="design"),
                               torch.tensor([[0.5, -0.5], [0.0, 0.0], [0.0, 0.0]]))


@pytest.mark.parametrize("normalize_std", [True, False])
def test_random_against_naive_loops(normalize_std):
    g = torch.Generator().manual_seed(0)
    R = torch.randint(0, 3, (2, 3, 4, 5), generator=g).float() * 0.7  # leading dims [2, 3], M=4, N=5
    d = designer_advantages(R, normalize_std=normalize_std)
    eq = executor_advantages(R, normalize_std=normalize_std, group="query")
    ed = executor_advantages(R, normalize_std=normalize_std, group="design")
    assert d.shape == (2, 3, 4) and eq.shape == ed.shape == R.shape
    for a in range(2):
        for b in range(3):
            rows = R[a, b].tolist()
            means = [sum(r) / len(r) for r in rows]
            for i, v in enumerate(naive_norm(means, normalize_std=normalize_std)):
                assert d[a, b, i].item() == pytest.approx(v, abs=1e-5)
            flat = naive_norm([x for r in rows for x in r], normalize_std=normalize_std)
            for i, r in enumerate(rows):
                per_design = naive_norm(r, normalize_std=normalize_std)
                for j in range(len(r)):
                    assert eq[a, b, i, j].item() == pytest.approx(flat[i * len(r) + j], abs=1e-5)
                    assert ed[a, b, i, j].item() == pytest.approx(per_design[j], abs=1e-5)


@pytest.mark.parametrize("shape", [(4, 3), (1, 3), (3, 1), (1, 1), (2, 1, 1)])
@pytest.mark.parametrize("normalize_std", [True, False])
def test_degenerate_groups_give_zeros(shape, normalize_std):
    for fill in (0.0, 1.0, 0.4):
        R = torch.full(shape, fill)
        for out in (designer_advantages(R, normalize_std=normalize_std),
                    executor_advantages(R, normalize_std=normalize_std),
                    executor_advantages(R, normalize_std=normalize_std, group="design")):
            assert torch.isfinite(out).all() and (out == 0).all()
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
    # the same executor outcome (1.0) gets more credit under query grouping when its design is bad
    R = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    q, d = executor_advantages(R), executor_advantages(R, group="design")
    assert q[1, 0] == q[0, 0] and d[1, 0] == 0 and d[0, 0] > 0


def test_bad_input():
    with pytest.raises(ValueError, match="'query' or 'design'"):
        executor_advantages(torch.zeros(2, 2), group="rows")
    with pytest.raises(ValueError, match="M, N"):
        designer_advantages(torch.zeros(3))
    assert designer_advantages([[1, 0], [0, 0]]).dtype == torch.float32


def test_runs_that_never_happened_are_left_out_of_the_executor_group():
    # the example: three parsed designs whose runs all score 0.4, one unparsed design (never run)
    R = torch.tensor([[0.4, 0.4], [0.4, 0.4], [0.4, 0.4], [0.0, 0.0]])
    E = torch.tensor([[True, True]] * 3 + [[False, False]])
    before = executor_advantages(R)                       # the unparsed slots shift the mean: ~+0.54 each
    assert before[0, 0].item() == pytest.approx(0.1 / math.sqrt((6 * 0.01 + 2 * 0.09) / 7), rel=1e-4)
    assert torch.equal(executor_advantages(R, executed=E), torch.zeros(4, 2))   # no run was better than another
    # the Designer keeps its failure: the unparsed design's advantage is negative
    assert designer_advantages(R)[3] < 0
    # group="design": a design with no executed run gives zeros, the others are as without the mask
    R2 = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    E2 = torch.tensor([[True, True], [False, False]])
    torch.testing.assert_close(executor_advantages(R2, group="design", executed=E2),
                               executor_advantages(R2, group="design") * E2)


@pytest.mark.parametrize("normalize_std", [True, False])
@pytest.mark.parametrize("group", ["query", "design"])
def test_executed_mask_against_naive_loops(normalize_std, group):
    g = torch.Generator().manual_seed(1)
    R = torch.randint(0, 3, (6, 3, 4), generator=g).float() * 0.7       # B=6 queries, M=3, N=4
    E = torch.rand(6, 3, 4, generator=g) < 0.6
    E[0] = True                                                         # all executed: as without the mask
    E[1] = False                                                        # none executed: zeros
    E[2, 0, 0], E[2].view(-1)[1:] = True, False                         # a single executed run: zero
    got = executor_advantages(R, normalize_std=normalize_std, group=group, executed=E)
    for b in range(6):
        groups = [[(i, j) for i in range(3) for j in range(4)]] if group == "query" else \
            [[(i, j) for j in range(4)] for i in range(3)]
        for cells in groups:
            live = [c for c in cells if E[b][c]]
            vals = [R[b][c].item() for c in live]
            want = naive_norm(vals, normalize_std=normalize_std) if len(set(vals)) > 1 else [0.0] * len(vals)
            for c, w in zip(live, want):
                assert got[b][c].item() == pytest.approx(w, abs=1e-5)
            for c in cells:
                if not E[b][c]:
                    assert got[b][c].item() == 0.0
    torch.testing.assert_close(got[0], executor_advantages(R[0], normalize_std=normalize_std, group=group))
    with pytest.raises(ValueError, match="shape"):
        executor_advantages(R, executed=E[:, :2])
