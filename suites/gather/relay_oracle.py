"""An independent oracle of the relay's bookkeeping: a plain dict of what was stashed in each slot.

The relay's tests compare each gather with eager on the relay's own buffers, and one relay with another; neither
sees a relay that keeps the wrong thing. :class:`StashedSlots` models the contract (``docs/gather.md``, Relay)
without tensors of its own: ``stash`` records each slot's extras converted as documented (``topk_p`` float32,
``topk_index`` and tokens int64, hidden states the relay's ``hidden_dtype``), negative slots wrapped by the pool;
``resolve`` checks what the relay handed out against the records, bit for bit, and forgets them; ``check_pending``
compares the slots still held."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from harness.compare import assert_equivalent

__all__ = ["StashedSlots"]


@dataclasses.dataclass
class StashedSlots:
    pool: int
    topk: int
    hidden_size: int | None
    hidden_dtype: torch.dtype
    slots: dict[int, dict[str, Any]] = dataclasses.field(default_factory=dict)

    def stash(self, slots: torch.Tensor, *, topk_p: torch.Tensor, topk_index: torch.Tensor,
              output_tokens: torch.Tensor, hidden_states: torch.Tensor | None = None) -> None:
        for row, slot in enumerate(slots.tolist()):
            self.slots[slot % self.pool] = dict(
                topk_p=topk_p[row].to("cpu", torch.float32), topk_index=topk_index[row].to("cpu", torch.int64),
                bonus_tokens=output_tokens[row].to("cpu", torch.int64),
                hidden_states=None if hidden_states is None else hidden_states[row].to("cpu", self.hidden_dtype))

    def resolve(self, indices: torch.Tensor, resolved: Any, **context: Any) -> None:
        """Check the relay's ``resolved`` extras of ``indices`` (a :class:`~harness.gather.ResolvedExtras` or its
        fields by name) against what was stashed there, then forget those slots (a slot is read once per stash)."""
        __tracebackhide__ = True
        wrapped = [index % self.pool for index in indices.tolist()]
        missing = [slot for slot in wrapped if slot not in self.slots]
        assert not missing, f"the test resolves slots {missing} it never stashed: a bug in the test"
        expected = {}
        for name, dtype, trailing in (("topk_p", torch.float32, (self.topk,)),
                                      ("topk_index", torch.int64, (self.topk,)), ("bonus_tokens", torch.int64, ()),
                                      ("hidden_states", self.hidden_dtype, (self.hidden_size,))):
            if name == "hidden_states" and self.hidden_size is None:
                expected[name] = None
            elif wrapped:
                expected[name] = torch.stack([self.slots[slot][name] for slot in wrapped])
            else:
                expected[name] = torch.empty((0, *trailing), dtype=dtype)
        fields = resolved if isinstance(resolved, Mapping) else vars(resolved)
        actual = {name: None if value is None else value.to("cpu") for name, value in fields.items()}
        assert_equivalent(actual, expected, exact=True,
                          context={**context, "oracle": "what the test stashed in each slot", "slots": wrapped})
        for slot in wrapped:
            del self.slots[slot]

    def check_pending(self, pending: list[int], **context: Any) -> None:
        __tracebackhide__ = True
        assert pending == sorted(self.slots), (
            f"the relay holds slots {pending}; stashed and not resolved: {sorted(self.slots)} ({context})")
