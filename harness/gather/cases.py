"""Gather inputs described by a few numbers: :class:`GatherCase` (pool, count, dtypes, layouts, seed).

``build`` makes tensors deterministically from a CPU ``torch.Generator``; non-contiguous layouts put
the values in a view of a larger junk-filled buffer, so ignoring strides or offsets reads junk."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, cast

import torch

from harness.errors import GatherContractError
from harness.gather.reference import BUFFER_NAMES

__all__ = [
    "SOURCE_LAYOUTS",
    "INDEX_LAYOUTS",
    "INDEX_DTYPES",
    "gather_dtypes",
    "random_values",
    "with_layout",
    "BufferSpec",
    "GatherCase",
    "GatherInputs",
]

# Layouts of a source buffer [pool, *trailing]. For a 1-D buffer the two that need a second
# dimension fall back to a row stride, so every layout is valid for every buffer.
SOURCE_LAYOUTS = ("contiguous", "offset", "row-strided", "column-major", "inner-strided")
INDEX_LAYOUTS = ("contiguous", "offset", "strided")
INDEX_DTYPES = (torch.int32, torch.int64)


def gather_dtypes() -> tuple[torch.dtype, ...]:
    """Every dtype the contract covers on this torch build (float8 only where it exists)."""
    dtypes = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.bool,
              torch.uint8, torch.int8, torch.int32, torch.int64]
    for name in ("float8_e4m3fn", "float8_e5m2"):
        if hasattr(torch, name):
            dtypes.append(getattr(torch, name))
    return tuple(dtypes)


def _special_floats(dtype: torch.dtype) -> list[float]:
    # Values a copy keeps and arithmetic does not: -0.0 (x * 1 + 0 gives +0.0) and infinities (0 * inf is
    # NaN, so a one-hot matmul spreads them into every row). float8 has no infinity in e4m3fn: its
    # largest finite values stand in. NaN is left out: a compiled kernel may round-trip half precision
    # through float32, which canonicalises NaN payloads on some devices.
    if dtype.itemsize == 1:
        largest = torch.finfo(dtype).max
        return [-0.0, largest, -largest]
    return [-0.0, math.inf, -math.inf]


def random_values(shape: Sequence[int], dtype: torch.dtype, *, generator: torch.Generator) -> torch.Tensor:
    """Random CPU values of ``dtype``: integers over the dtype's whole range (int64 beyond 2**53, which a
    trip through float64 loses); floats normal, about one in eight replaced by -0.0 or an infinity."""
    shape = tuple(shape)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=generator).bool()
    if dtype.is_floating_point:
        # float8 has a narrow range: scale so that casting keeps most values finite and distinct.
        scale = 4.0 if dtype.itemsize == 1 else 100.0
        values = torch.randn(shape, generator=generator, dtype=torch.float64) * scale
        specials = torch.tensor(_special_floats(dtype), dtype=torch.float64)
        chosen = specials[torch.randint(0, len(specials), shape, generator=generator)]
        return torch.where(torch.rand(shape, generator=generator) < 0.125, chosen, values).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=generator, dtype=torch.int64).to(dtype)


def with_layout(values: torch.Tensor, layout: str, *, generator: torch.Generator,
                device: torch.device | str) -> torch.Tensor:
    """Return a tensor on ``device`` equal to ``values`` but laid out as ``layout`` says."""
    values = values.to(device)
    shape = tuple(values.shape)
    if layout == "contiguous":
        return values.clone()
    if layout in ("column-major", "inner-strided") and len(shape) < 2:
        layout = "row-strided"
    if layout == "offset":
        base_shape, view = (shape[0] + 3, *shape[1:]), lambda base: base[3:]
    elif layout in ("row-strided", "strided"):
        base_shape, view = (2 * shape[0] + 1, *shape[1:]), lambda base: base[1::2]
    elif layout == "column-major":
        base_shape = tuple(reversed(shape))
        view = lambda base: base.permute(*reversed(range(len(shape))))  # noqa: E731
    elif layout == "inner-strided":
        base_shape, view = (*shape[:-1], 2 * shape[-1]), lambda base: base[..., 1::2]
    else:
        known = ", ".join(SOURCE_LAYOUTS + INDEX_LAYOUTS[2:])
        raise GatherContractError(f"unknown layout {layout!r}; known layouts: {known}")
    base = random_values(base_shape, values.dtype, generator=generator).to(device)
    laid_out = view(base)
    laid_out.copy_(values)
    return laid_out


@dataclasses.dataclass(frozen=True)
class BufferSpec:
    """One source buffer: its trailing shape (after the pool dimension), dtype and layout; ``pool``, when
    given, is its own number of slots (more than the case's: a hidden-states buffer sized apart)."""

    trailing: tuple[int, ...]
    dtype: torch.dtype
    layout: str = "contiguous"
    pool: int | None = None

    def describe(self) -> str:
        slots = "pool" if self.pool is None else f"{self.pool}"
        dtype = str(self.dtype).removeprefix("torch.")
        return f"[{slots}, {', '.join(map(str, self.trailing))}] {dtype} {self.layout}".replace(", ]", "]")


@dataclasses.dataclass
class GatherInputs:
    """Built tensors: the indices and the four source buffers (the last may be ``None``)."""

    indices: torch.Tensor
    buffers: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]

    @property
    def args(self) -> tuple[Any, ...]:
        return (self.indices, *self.buffers)


@dataclasses.dataclass(frozen=True)
class GatherCase:
    """A reproducible gather input. ``index_values`` overrides the random indices when given."""

    pool: int
    count: int
    seed: int
    index_dtype: torch.dtype = torch.int64
    index_layout: str = "contiguous"
    topk_p: BufferSpec = BufferSpec((8,), torch.float32)
    topk_index: BufferSpec = BufferSpec((8,), torch.int64)
    output_tokens: BufferSpec = BufferSpec((), torch.int64)
    hidden: BufferSpec | None = BufferSpec((64,), torch.bfloat16)
    index_values: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.pool < 1:
            raise GatherContractError(f"a gather case needs a pool of at least 1 slot, got pool={self.pool}")
        if self.index_values is not None and len(self.index_values) != self.count:
            raise GatherContractError(
                f"index_values has {len(self.index_values)} entries but count is {self.count}")
        small = [spec.pool for spec in self.specs
                 if spec is not None and spec.pool is not None and spec.pool < self.pool]
        if small:
            raise GatherContractError(f"a buffer's own pool ({small[0]}) is below the case's pool ({self.pool}): the "
                                      "case's pool is the smallest, the domain of its indices")

    @property
    def specs(self) -> tuple[BufferSpec, BufferSpec, BufferSpec, BufferSpec | None]:
        return (self.topk_p, self.topk_index, self.output_tokens, self.hidden)

    def build(self, device: torch.device | str = "cpu") -> GatherInputs:
        generator = torch.Generator().manual_seed(self.seed)
        buffers: list[torch.Tensor | None] = []
        for spec in self.specs:
            if spec is None:
                buffers.append(None)
                continue
            values = random_values((spec.pool or self.pool, *spec.trailing), spec.dtype, generator=generator)
            buffers.append(with_layout(values, spec.layout, generator=generator, device=device))
        if self.index_values is None:
            raw = torch.randint(0, self.pool, (self.count,), generator=generator)
        else:
            raw = torch.tensor(self.index_values, dtype=torch.int64)
        indices = with_layout(raw.to(self.index_dtype), self.index_layout, generator=generator, device=device)
        # the specs' order: three buffers, then the hidden states' or None
        return GatherInputs(indices, cast("tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]",
                                          tuple(buffers)))

    def other_indices(self, count: int, *, seed: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Indices for a later call on this case's buffers: ``count`` random slots in ``[0, pool)`` drawn from
        ``seed``, in the case's index dtype and layout."""
        generator = torch.Generator().manual_seed(seed)
        raw = torch.randint(0, self.pool, (count,), generator=generator)
        return with_layout(raw.to(self.index_dtype), self.index_layout, generator=generator, device=device)

    def describe(self) -> dict[str, Any]:
        """The case in words, for failure messages."""
        described: dict[str, Any] = {
            "seed": self.seed,
            "pool": self.pool,
            "indices": f"{self.count} x {str(self.index_dtype).removeprefix('torch.')} {self.index_layout}",
        }
        if self.index_values is not None:
            described["index values"] = list(self.index_values)
        for name, spec in zip(BUFFER_NAMES, self.specs):
            described[name] = "None" if spec is None else spec.describe()
        return described

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe form (dtypes by name), for handing the case to a subprocess."""
        def spec_json(spec: BufferSpec | None) -> Any:
            if spec is None:
                return None
            return {"trailing": list(spec.trailing), "dtype": _dtype_name(spec.dtype), "layout": spec.layout,
                    "pool": spec.pool}

        return {
            "pool": self.pool, "count": self.count, "seed": self.seed,
            "index_dtype": _dtype_name(self.index_dtype), "index_layout": self.index_layout,
            "topk_p": spec_json(self.topk_p), "topk_index": spec_json(self.topk_index),
            "output_tokens": spec_json(self.output_tokens), "hidden": spec_json(self.hidden),
            "index_values": None if self.index_values is None else list(self.index_values),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GatherCase:
        def spec_of(item: Any) -> BufferSpec | None:
            if item is None:
                return None
            return BufferSpec(tuple(item["trailing"]), _dtype_of(item["dtype"]), item["layout"], item.get("pool"))

        return cls(
            pool=data["pool"], count=data["count"], seed=data["seed"],
            index_dtype=_dtype_of(data["index_dtype"]), index_layout=data["index_layout"],
            topk_p=cast(BufferSpec, spec_of(data["topk_p"])),  # None only where the case allows it (hidden)
            topk_index=cast(BufferSpec, spec_of(data["topk_index"])),
            output_tokens=cast(BufferSpec, spec_of(data["output_tokens"])), hidden=spec_of(data["hidden"]),
            index_values=None if data["index_values"] is None else tuple(data["index_values"]),
        )

    @property
    def element_count(self) -> int:
        return sum((spec.pool or self.pool) * math.prod(spec.trailing) for spec in self.specs if spec is not None)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise GatherContractError(f"unknown dtype {name!r} in a gather case")
    return dtype
