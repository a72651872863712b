"""Compare an implementation with the reference model up to a renaming of physical block ids."""

from __future__ import annotations

from collections.abc import Container


class IdMap:
    """A growing bijection between the model's block ids and one implementation's."""

    def __init__(self) -> None:
        self.to_impl: dict[int, int] = {}
        self.to_model: dict[int, int] = {}

    def bind(self, model_id: int, impl_id: int) -> None:
        """Record that ``impl_id`` stands for ``model_id``; AssertionError if either is bound otherwise."""
        known = self.to_impl.get(model_id)
        if known is None:
            assert impl_id not in self.to_model, f"impl block {impl_id} already stands for another block"
            self.to_impl[model_id] = impl_id
            self.to_model[impl_id] = model_id
        else:
            assert known == impl_id, f"model block {model_id} is impl block {known}, now {impl_id}"

    def forget_free(self, model_refs: list[int], keep: Container[int] = ()) -> None:
        """Blocks back in the pool may be renamed when taken again, except ``keep`` (evictable: same identity)."""
        for model_id in [m for m in self.to_impl if model_refs[m] == 0 and m not in keep]:
            del self.to_model[self.to_impl.pop(model_id)]

    def slot(self, model_slot: int, impl_slot: int, block_size: int) -> None:
        """A slot is ``block * block_size + offset``: same offset, and the blocks must correspond."""
        assert model_slot % block_size == impl_slot % block_size, (
            f"slot offsets differ: model slot {model_slot}, impl slot {impl_slot}"
        )
        self.bind(model_slot // block_size, impl_slot // block_size)
