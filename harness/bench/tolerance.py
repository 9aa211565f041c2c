"""``python -m harness bench tolerance``: how far replays are from eager, per zoo model and dtype.

Reports the largest difference and the largest *tolerance use* ``|replay - eager| / (atol + rtol *
|eager|)`` (above 1 the suites would fail; the command then exits 1): the evidence behind
:data:`harness.compare.TOLERANCES` for layer stacks."""

from __future__ import annotations

import argparse
import random
import warnings
from typing import Any

import torch

from harness.bench.report import Result
from harness.compare import tolerance_for
from harness.graphs import GraphCapturer
from harness.models import build_model
from harness.runner import ForwardBatch

__all__ = ["COMPONENTS", "add_options", "settings_of", "arguments_for", "run", "format_table", "failed"]

COMPONENTS = ("runner",)
DESCRIPTION = __doc__.splitlines()[0]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", nargs="+", default=["dense", "moe", "vlm"])
    parser.add_argument("--dtypes", nargs="+", default=list(_DTYPES), choices=list(_DTYPES))
    parser.add_argument("--batches", type=int, default=20, help="random batches per model and dtype")
    parser.add_argument("--buckets", type=int, nargs="+", default=[4, 8, 16, 32])


def settings_of(options: argparse.Namespace, *, device: torch.device) -> dict[str, Any]:
    """What a run with ``options`` measures, as its report records it."""
    return {"models": options.models, "dtypes": options.dtypes, "batches": options.batches,
            "buckets": sorted(options.buckets)}


def arguments_for(recorded: dict[str, Any]) -> list[str]:
    """The options of a run that measures what ``recorded`` (a report's settings) holds."""
    return ["--models", *recorded["models"], "--dtypes", *recorded["dtypes"], "--batches", str(recorded["batches"]),
            "--buckets", *map(str, recorded["buckets"])]


def _worst(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, float]:
    tol = tolerance_for(expected.dtype)
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    diff = (a - e).abs()
    return float(diff.max()), float((diff / (tol.atol + tol.rtol * e.abs())).max())


def run(options: argparse.Namespace, *, device: torch.device, backend: Any, implementations: dict[str, Any],
        repeat: int) -> Result:
    """One row per (model, dtype): worst absolute difference and worst tolerance use over ``--batches``."""
    (_, implementation), = implementations.items()
    settings = settings_of(options, device=device)
    buckets = settings["buckets"]
    rows = []
    for name in options.models:
        for dtype_name in options.dtypes:
            model = build_model(name, seed=0, dtype=_DTYPES[dtype_name], device=device)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                runner = implementation.obj(model, buckets=buckets, graphs=GraphCapturer(backend))
            draw = random.Random(0)
            worst_abs = worst_use = 0.0
            for index in range(options.batches):
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
            rows.append({"model": name, "dtype": dtype_name, "batches": options.batches,
                         "max_abs_diff": worst_abs, "max_tolerance_use": worst_use})
    return Result(settings, rows, {})


def format_table(result: Result, *, device: torch.device) -> str:
    lines = [f"{'model':8} {'dtype':9} {'max |replay-eager|':>19} {'tolerance use':>14}"]
    lines += [f"{row['model']:8} {row['dtype']:9} {row['max_abs_diff']:19.3g} {row['max_tolerance_use']:14.3f}"
              for row in result.rows]
    return "\n".join(lines)


def failed(result: Result) -> bool:
    """Above 100% of the tolerance table somewhere: the suites would fail on this machine."""
    return any(row["max_tolerance_use"] > 1.0 for row in result.rows)
