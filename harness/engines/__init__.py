"""The engines behind the contenders: per engine one module (import plan, eras, adapter, baselines), the
catalog of engines, and what they share (fetching, importing by plan, metering the engine's own calls)."""
