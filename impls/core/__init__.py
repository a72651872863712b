"""The core every implementation shares: validation, base classes, the Numba cache, the reference model."""
