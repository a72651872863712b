"""``kvblock-bench gate``: exact allocation and instruction counts held to configured rules and saved baselines."""
