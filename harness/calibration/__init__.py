"""``kvblock-bench calibrate``: our contenders timed beside the engines' own block managers.

``fetch`` (the engine's wheel with the user's pip, into a cache outside the repository, or a source folder),
``loader`` (its modules imported unmodified by an import plan, with tripwired stand-ins for the rest),
``engine_vllm`` / ``engine_sglang`` / ``engine_nano_vllm`` (each engine's plan, adapters and baselines),
``traces`` (a trace as an engine without fork serves it), ``replays`` (a worker process's repetitions,
interleaved as ``run`` does), ``run`` (the workers' samples merged, and the ratios), ``table`` (the calibration
table), ``destination`` (a new folder, or the committed table when asked). See ``results/calibration/README.md``.
"""
