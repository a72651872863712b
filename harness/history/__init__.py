"""``kvblock-bench history``: an engine's releases measured in lockstep, judged, drawn."""
