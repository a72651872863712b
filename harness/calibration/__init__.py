"""``kvblock-bench calibrate``: our contenders timed beside the engines' own block managers.
Design: docs/output.md#harnesscalibration__init__py."""
