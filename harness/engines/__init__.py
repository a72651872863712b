"""Each engine in one module (import plan, eras, adapter, baselines), its catalog, and what they share."""
