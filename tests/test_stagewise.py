import numpy as np
import pytest

from stagewise import active_roles

D, E = frozenset({"designer"}), frozenset({"executor"})


def test_stagewise_schedule():
    # the Executor first (the authors' default)
    got = [active_roles(t, stage_len=3) for t in range(13)]
    assert got == [E] * 3 + [D] * 3 + [E] * 3 + [D] * 3 + [E]
    assert [active_roles(t, stage_len=2, first="designer") for t in range(5)] == [D, D, E, E, D]
    assert active_roles(29) == E and active_roles(30) == D and active_roles(60) == E
    assert active_roles(np.int64(4), stage_len=1) == E
    assert all(active_roles(t, stage_len=1) == (E if t % 2 == 0 else D) for t in range(10))


def test_other_modes():
    for t in (0, 1, 31, 1000):
        assert active_roles(t, mode="coupled") == D | E
        assert active_roles(t, mode="designer") == D
        assert active_roles(t, mode="executor") == E
        assert active_roles(t, mode="designer", first="designer") == D
    assert isinstance(active_roles(0), frozenset)


@pytest.mark.parametrize(
    "kwargs, words",
    [
        ({"mode": "alternate"}, "stagewise, coupled, designer, executor"),
        ({"first": "critic"}, "designer, executor"),
        ({"stage_len": 0}, "stage_len"),
        ({"stage_len": 2.5}, "stage_len"),
        ({"step": -1}, "step"),
    ],
)
def test_errors_name_allowed_values(kwargs, words):
    kwargs = {"step": 0, **kwargs}
    with pytest.raises(ValueError, match=words):
        active_roles(**kwargs)
