"""bench.py: performance measurements, each printed as a ratio measured side by side in one run.

Speed and memory never appear in tests (machines are noisy); they live here. Each section measures our
implementation against a plain baseline in the same process, so that the printed ratio means something on
any machine.

    python bench.py            # every section
    python bench.py sandbox    # run_code overhead vs `python -c`, workflow executions per second
    python bench.py grade      # answers graded per second
    python bench.py rollout    # batched rollout tokens/s vs one plain engine.generate
    python bench.py train      # chunked GRPO update vs full-logits update: tokens/s and peak memory
    python bench.py gpu        # only with CUDA: Qwen3-4B-shaped bf16 rollout + update + reload, MFU
"""

import sys


SECTIONS = {}


def main(argv):
    names = argv or list(SECTIONS)
    unknown = [n for n in names if n not in SECTIONS]
    if unknown:
        sys.exit(f"unknown section(s) {unknown}; choose from {sorted(SECTIONS)}")
    for name in names:
        print(f"== bench {name}")
        SECTIONS[name]()


if __name__ == "__main__":
    main(sys.argv[1:])
