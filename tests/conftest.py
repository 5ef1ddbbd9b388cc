"""The test suite's runs of train.py, sft.py and world/final_table.py compute on this CPU's own
kernels (machinery/cpu_bits.py: METAAGENT_CPU_BITS=native): their numbers need only agree with
themselves, and the pins cost 3-4x in matrix products. tests/test_cpu_bits.py runs with the pins.

The README's test command runs two workers, each taking a test module whole (`-n 2 --dist
loadfile`); the longest modules are handed out first, so that neither worker ends alone on one."""

import os

os.environ.setdefault("METAAGENT_CPU_BITS", "native")

LONGEST = ["test_train.py", "test_gpu_doc.py", "test_distill.py", "test_first_gpu_run.py"]


def pytest_collection_modifyitems(items):
    """The longest modules first (in LONGEST's order), the rest after them as collected."""

    def rank(item):
        name = item.path.name
        return LONGEST.index(name) if name in LONGEST else len(LONGEST)

    items.sort(key=rank)
