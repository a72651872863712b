"""``kvblock-bench gate``: exact counts held to configured rules and saved baselines."""
