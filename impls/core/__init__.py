"""The core every implementation shares: argument validation, the base classes of interpreted and compiled
designs (one place for the contract's checks and the whole-step entry point), the Numba cache, and the
reference model (the contract's executable definition)."""
