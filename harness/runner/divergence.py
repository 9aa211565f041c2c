"""Divergence localisation: the first decoder layer where a replay departs from eager.

:func:`eager_layer_outputs` records eager per-layer outputs; :func:`localise` compares them with a
runner's ``layer_outputs``, telling a slow drift (tolerance) from one layer's jump (a bug)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import torch
from torch import nn

from harness.batch import ForwardBatch
from harness.compare import ComputeSettings, tolerance_for
from harness.errors import MismatchError
from harness.runner.discovery import layer_list

__all__ = ["LayerDivergence", "eager_layer_outputs", "localise", "architecture_divergence", "format_divergence_table",
           "DIVERGENCE_ARCHITECTURES"]


@dataclasses.dataclass(frozen=True)
class LayerDivergence:
    """Per-layer largest differences (up to and including the first divergent layer) and that layer."""

    max_abs_diff: tuple[float, ...]
    first_divergent: int | None
    atol: float

    def table(self) -> str:
        """One line per layer: index, largest |replay - eager|, and a marker at the first divergence."""
        lines = ["layer  max|replay-eager|"]
        for index, diff in enumerate(self.max_abs_diff):
            marker = "  <- first beyond tolerance" if index == self.first_divergent else ""
            lines.append(f"{index:5d}  {diff:.3e}{marker}")
        return "\n".join(lines)

    def __str__(self) -> str:
        where = (f"first diverges at layer {self.first_divergent}" if self.first_divergent is not None
                 else "no layer beyond tolerance")
        return f"{where} (atol {self.atol:.1e})\n{self.table()}"


def _first_tensor(output: Any) -> torch.Tensor | None:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)):
        return next((item for item in output if isinstance(item, torch.Tensor)), None)
    return None


def eager_layer_outputs(model: nn.Module, layer_model: nn.Module, batch: ForwardBatch) -> list[torch.Tensor]:
    """Each decoder layer's output (first tensor) from an eager forward of ``model`` on ``batch``."""
    found = layer_list(layer_model)
    if found is None:
        return []
    outputs: list[torch.Tensor | None] = [None] * len(found[1])

    def hook_for(index: int) -> Any:
        def hook(_module: nn.Module, _args: Any, output: Any) -> None:
            tensor = _first_tensor(output)
            outputs[index] = None if tensor is None else tensor.detach().clone()
        return hook

    handles = [layer.register_forward_hook(hook_for(i)) for i, layer in enumerate(found[1])]
    try:
        with torch.no_grad():
            model(batch.input_ids, batch.positions, batch)
    finally:
        for handle in handles:
            handle.remove()
    return [tensor if tensor is not None else torch.empty(0) for tensor in outputs]


def localise(runner: Any, model: nn.Module, batch: ForwardBatch) -> LayerDivergence:
    """Replay ``batch`` and compare every layer's output with eager on the batch padded to its bucket.

    Raises :class:`~harness.errors.MismatchError` when there is nothing to compare layer by layer: the
    runner recorded no output (or an empty one) for a decoder layer of this bucket, another number of
    layers than the stack has, or shapes other than eager's. A localisation that compares nothing
    must not read as "no layer diverges"."""
    runner.replay(batch)
    replayed = runner.layer_outputs(batch)
    bucket = runner.bucket_for(batch.num_tokens)
    eager = eager_layer_outputs(model, runner.layer_model, batch.padded_to(bucket))
    unusable = [index for index, (actual, expected) in enumerate(zip(replayed, eager))
                if actual.numel() == 0 or actual.shape != expected.shape]
    if not eager or len(replayed) != len(eager) or unusable:
        raise MismatchError(
            f"nothing to localise in bucket {bucket}: the stack has {len(eager)} decoder layers, the runner recorded "
            f"{len(replayed)} outputs" + (f", of which layers {unusable} are empty or not eager's shape "
                                          f"{tuple(eager[unusable[0]].shape)}" if unusable else "")
            + "; a runner that records per-layer outputs must record one per decoder layer in every bucket")
    diffs: list[float] = []
    first = None
    settings = ComputeSettings.now()
    atol = (tolerance_for(replayed[0].dtype, device_type=replayed[0].device.type, settings=settings).atol
            if replayed else 0.0)
    for index, (actual, expected) in enumerate(zip(replayed, eager)):
        diff = float((actual.double() - expected.double()).abs().max()) if actual.numel() else 0.0
        diffs.append(diff)
        tol = tolerance_for(actual.dtype, device_type=actual.device.type, settings=settings)
        if not torch.allclose(actual, expected, rtol=tol.rtol, atol=tol.atol):
            first = index
            break
    return LayerDivergence(tuple(diffs), first, atol)


# The bench's default: a dense, an MoE, a VLM and a hybrid of the transformers zoo.
DIVERGENCE_ARCHITECTURES = ("llama", "qwen3-moe", "llava", "lfm2")


def architecture_divergence(names: Iterable[str] = DIVERGENCE_ARCHITECTURES, *, graphs: Any,
                            device: torch.device | str = "cpu", runner_factory: Any = None,
                            lengths: tuple[int, ...] = (3, 5, 2), seed: int = 0) -> dict[str, LayerDivergence | str]:
    """Per-layer divergence of ``runner_factory`` (the reference runner by default; called as
    ``factory(model, buckets=..., graphs=graphs)``) on transformers-zoo architectures ``names``, one
    batch of ``lengths`` each; an unavailable architecture maps to its reason."""
    import warnings

    from harness.models.transformers_adapter import TransformersAdapter
    from harness.models.transformers_zoo import VOCAB_SIZE, ArchitectureUnavailable, architecture, build_architecture

    if runner_factory is None:
        from harness.runner.runner import LayerStackRunner as runner_factory
    batch = ForwardBatch.from_lengths(list(lengths), vocab_size=VOCAB_SIZE - 2, seed=seed, device=device)
    reports: dict[str, LayerDivergence | str] = {}
    for name in names:
        try:
            adapter = TransformersAdapter(build_architecture(name, seed=seed, device=device),
                                          layout=architecture(name).layout)
        except ArchitectureUnavailable as error:
            reports[name] = str(error)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            runner = runner_factory(adapter, buckets=(16,), graphs=graphs)
        reports[name] = localise(runner, adapter, batch)
    return reports


def format_divergence_table(reports: Mapping[str, LayerDivergence | str]) -> str:
    """One line per architecture and layer: the largest |replay - eager| up to the first divergence."""
    lines = [f"{'architecture':14} {'layer':>5} {'max|replay-eager|':>18}  verdict"]
    for name, report in reports.items():
        if isinstance(report, str):
            lines.append(f"{name:14} {'-':>5} {'-':>18}  unavailable: {report}")
            continue
        for index, diff in enumerate(report.max_abs_diff):
            verdict = "FIRST DIVERGENT" if index == report.first_divergent else f"ok (atol {report.atol:.0e})"
            lines.append(f"{name:14} {index:5d} {diff:18.3e}  {verdict}")
    return "\n".join(lines)
