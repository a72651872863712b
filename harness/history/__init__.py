"""``kvblock-bench history``: an engine's releases measured in lockstep, their figures, verdicts, figure and README
section."""
