"""Measure how far the reference runner's replays are from eager, per zoo model and dtype.

The numbers behind :data:`harness.compare.TOLERANCES` for layer stacks: run it on the machine and
backend in question and record the worst case next to the table.

    python -m harness bench runner --device cuda --graph-backend cuda --json measured.json

For each model and dtype it replays random batches (all logits, all hidden states) and reports the
largest absolute difference to eager on the same batch and the largest *tolerance use*
``|replay - eager| / (atol + rtol * |eager|)``: above 1 the suites would fail.
"""

from __future__ import annotations

import argparse
import json
import random
import warnings
from typing import Any, Sequence

import torch

from harness.compare import tolerance_for
from harness.devices import DEVICE_CHOICES, resolve_device
from harness.graphs import GraphCapturer, get_backend
from harness.models import build_model
from harness.batch import ForwardBatch
from harness.runner.runner import LayerStackRunner

__all__ = ["measure", "main"]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _worst(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    tol = tolerance_for(expected.dtype)
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    diff = (a - e).abs()
    return float(diff.max()), float((diff / (tol.atol + tol.rtol * e.abs())).max())


def measure(*, device: str = "cpu", graph_backend: str = "emulated", models: Sequence[str] = ("dense", "moe", "vlm"),
            dtypes: Sequence[str] = tuple(_DTYPES), batches: int = 20, seed: int = 0,
            buckets: Sequence[int] = (4, 8, 16, 32)) -> list[dict[str, Any]]:
    """One row per (model, dtype): worst absolute difference and worst tolerance use over ``batches``."""
    backend = get_backend(graph_backend, device=device if graph_backend == "cuda" else None)
    capturer = GraphCapturer(backend)
    rows = []
    for name in models:
        for dtype_name in dtypes:
            model = build_model(name, seed=seed, dtype=_DTYPES[dtype_name], device=device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runner = LayerStackRunner(model, buckets=buckets, graphs=capturer)
            draw = random.Random(seed)
            worst_abs = worst_use = 0.0
            for index in range(batches):
                total = draw.randint(1, max(buckets))
                cuts = sorted(draw.sample(range(1, total), min(total - 1, draw.randint(0, 15))))
                lengths = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
                batch = ForwardBatch.from_lengths(lengths, vocab_size=model.config.vocab_size, seed=index,
                                                  device=device, hidden_mode="full", all_logits=True)
                replayed = runner.replay(batch)
                with torch.no_grad():
                    expected = model(batch.input_ids, batch.positions, batch)
                for field in ("next_token_logits", "hidden_states"):
                    absolute, use = _worst(getattr(replayed, field), getattr(expected, field))
                    worst_abs, worst_use = max(worst_abs, absolute), max(worst_use, use)
            rows.append({"model": name, "dtype": dtype_name, "backend": backend.name, "device": device,
                         "batches": batches, "max_abs_diff": worst_abs, "max_tolerance_use": worst_use,
                         "torch": torch.__version__})
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness bench runner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", choices=DEVICE_CHOICES)
    parser.add_argument("--graph-backend", default="emulated", choices=("emulated", "cuda"))
    parser.add_argument("--models", nargs="+", default=["dense", "moe", "vlm"])
    parser.add_argument("--dtypes", nargs="+", default=list(_DTYPES), choices=list(_DTYPES))
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--json", help="also write the rows here")
    options = parser.parse_args(argv)
    rows = measure(device=str(resolve_device(options.device)), graph_backend=options.graph_backend, models=options.models,
                   dtypes=options.dtypes, batches=options.batches)
    print(f"{'model':8} {'dtype':9} {'max |replay-eager|':>19} {'tolerance use':>14}")
    for row in rows:
        print(f"{row['model']:8} {row['dtype']:9} {row['max_abs_diff']:19.3g} {row['max_tolerance_use']:14.3f}")
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(rows, handle, indent=2)
    return 0 if all(row["max_tolerance_use"] <= 1.0 for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
