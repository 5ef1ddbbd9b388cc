"""cpu_bits.py: the same bits on every x86 CPU, for a run of the tiny world on a CPU.

A float sum depends on its order, and each CPU library picks its kernels, and with them the order,
by the machine it runs on: ATen by instruction set (AVX-512 where there is one), MKL's matrix
products by vendor and instruction set, numpy's loops by instruction set; and each splits its work
by its thread count. A last-bit difference in the first SFT steps grows into another cold start,
another run, another table. So a run of the tiny world on a CPU computes on paths that are the
same on Intel and AMD machines with AVX2 or better:

    ATEN_CPU_CAPABILITY=avx2        ATen's AVX2 kernels: chosen by instruction set alone, so the
                                    same instructions on every AVX2 CPU (exact ones only: no
                                    approximate reciprocal)
    MKL_CBWR=COMPATIBLE             MKL's one reproducibility mode defined for Intel and non-Intel
                                    processors alike (its AVX2 mode is Intel's only: on AMD it
                                    falls back to MKL's own choice)
    ONEDNN_MAX_CPU_ISA=AVX2         oneDNN, wherever torch calls it, capped alike
    NPY_DISABLE_CPU_FEATURES=...    numpy's AVX-512 loops off: its AVX2 ones everywhere
    THREADS=2 (OMP, MKL, torch)     a reduction split the same way on a 2-core or a 64-core machine

Each library reads its setting once, as it loads, so they are set before torch is imported:
`restart_pinned()` starts the script again, in the same process (os.execv), with any that are
missing. A setting the user gave is kept and named (the table then differs from the README's);
METAAGENT_CPU_BITS=native skips the pins: this CPU's fastest kernels, its own table (the test
suite's runs take it: their numbers need only agree with themselves).
The cost: MKL's compatible path is slower than its AVX-512 one.

    if tiny_world and on_a_cpu:        # before the run's work: the script starts again
        cpu_bits.restart_pinned(__file__)   # returns once the pins are in place
    ...
    torch.set_num_threads(cpu_bits.threads(default))   # THREADS where pinned, else default

Whether a CPU computes the recorded bits under the pins: `python tests/cpu_fingerprint.py` prints
the hashes of what the cold start's first steps compute, and a test compares them.

Needs: no other file of this project (the standard library only).
"""

import os
import sys

THREADS = 2
PINS = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "MKL_CBWR": "COMPATIBLE",
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "NPY_DISABLE_CPU_FEATURES": "AVX512F AVX512CD AVX512_SKX AVX512_CLX AVX512_CNL AVX512_ICL "
    "AVX512_SPR",
    "OMP_NUM_THREADS": str(THREADS),
    "MKL_NUM_THREADS": str(THREADS),
}


def restart_pinned(script):
    """The script (its __file__) again, in this process, with PINS in its environment; returns at
    once where they are there, or where this process is not that script (a test calling its
    main). A pin the user set otherwise is kept, and named."""
    native = os.environ.get("METAAGENT_CPU_BITS") == "native"
    if native or os.path.realpath(sys.argv[0]) != os.path.realpath(script):
        return
    missing = [k for k in PINS if k not in os.environ]
    other = [f"{k}={os.environ[k]}" for k in PINS if k in os.environ and os.environ[k] != PINS[k]]
    if missing and other:
        print(f"cpu bits: {', '.join(other)} kept: this CPU's table may differ from the README's")
    if missing:
        print(f"cpu bits: ATen AVX2, MKL compatible, numpy AVX2, {THREADS} threads (any x86 CPU)")
        os.environ.update({k: PINS[k] for k in missing})
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def threads(default):
    """The thread count of this process's torch: THREADS where the pins are set, else default."""
    return int(os.environ["OMP_NUM_THREADS"]) if pinned() else default


def pinned():
    return all(k in os.environ for k in PINS)
