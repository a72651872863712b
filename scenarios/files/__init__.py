"""The project's file plumbing, the one place for it: atomic writes (:mod:`.atomic`) and the rule for paths that
are not regular files (:mod:`.kinds`). It imports nothing of the project; ``scenarios`` and ``harness`` use it."""
