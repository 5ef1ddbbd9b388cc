"""The test suite's runs of train.py, sft.py and world/final_table.py compute on this CPU's own
kernels (machinery/cpu_bits.py: METAAGENT_CPU_BITS=native): their numbers need only agree with
themselves, and the pins cost 3-4x in matrix products. tests/test_cpu_bits.py runs with the pins."""

import os

os.environ.setdefault("METAAGENT_CPU_BITS", "native")
