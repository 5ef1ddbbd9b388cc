"""tools/: the programs a user runs around the method, not read on the path: the curves (plot.py),
the trees as a page (show.py), one query of your own as a page (ask.py), speed measurements
(bench.py), the paper's ablations (ablations.py: the set and its runner; ablation_report.py: the
report that judges it), a GPU node's first run (first_gpu_run.py) and SFT data from a teacher
(distill.py). Each runs by path from the project's root: `python tools/plot.py out/tiny-rl`.
"""
