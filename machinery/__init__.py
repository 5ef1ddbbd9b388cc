"""machinery/: what makes the method fast and safe, each file behind the one function the method
calls.

Generation (engine.py, and decode.py's written-out loop under its lean backend; reload_check.py
proves each weight sync), the sandbox's isolation (isolation.py, under sandbox.py), a run's folder
and record (rundir.py, recorder.py, loggers.py, provenance.py: the commit a run came from), the
ranks (ranks.py), the trainer's weights in the engine (weights.py), the idle role's Adam state in
host memory (offload.py), the update's rows and their log-probs (logprob_rows.py: the plain,
chunked and shared-prompt layouts, proven equal), the model's speed-ups (speed.py), the SFT
optimizer (muon.py), and the benchmark files (data.py). One concept a file, each copyable with the
files its docstring's Needs line names.
"""
