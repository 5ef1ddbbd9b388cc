"""world/: the embedded tiny world the default runs in, one CPU and no downloads: its tasks,
tokenizer, model and SFT traces (tiny.py), the held-out measurements and the learning curve
(heldout.py), and the table the main job ends with (final_table.py: `python world/final_table.py
out/tiny-rl`). The method runs on any world (settings.data_mix); this one is small enough to learn
in minutes and exact enough to measure each role.
"""
