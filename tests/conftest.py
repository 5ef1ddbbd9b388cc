"""The test suite's runs of train.py, sft.py and world/final_table.py compute on this CPU's own
kernels (machinery/cpu_bits.py: METAAGENT_CPU_BITS=native): their numbers need only agree with
themselves, and the pins cost 3-4x in matrix products. tests/test_cpu_bits.py runs with the pins.

The README's test command runs two workers (`-n 2 --dist loadfile --no-loadscope-reorder`), each
taking a test module whole, the longest modules handed out first. Each worker and everything it
starts computes on cores of its own (on 2 cores: one each), so a test's threads never wait on the
other worker's: two threads of one process on a core the other worker also uses made a run 4x
slower. METAAGENT_TEST_CORES names the machine's cores, for a test that needs them all.

Each test leaves the environment as it found it: a main run in-process sets RANK, MASTER_PORT and
the rest (machinery/ranks.py), and every later program of that worker would inherit them."""

import os

import pytest

os.environ.setdefault("METAAGENT_CPU_BITS", "native")
os.environ.setdefault("METAAGENT_TEST_CORES", ",".join(map(str, sorted(os.sched_getaffinity(0)))))

LONGEST = ["test_train.py", "test_gpu_doc.py", "test_first_gpu_run.py", "test_distill.py"]


def pytest_configure(config):
    """A worker of n on its share of the cores (taken in turn), where there are n or more."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... under -n
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker and len(cores) >= count:
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) :: count])


@pytest.fixture(autouse=True)
def environment_restored():
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def pytest_collection_modifyitems(items):
    """The longest modules first (in LONGEST's order), the rest after them as collected."""

    def rank(item):
        name = item.path.name
        return LONGEST.index(name) if name in LONGEST else len(LONGEST)

    items.sort(key=rank)
