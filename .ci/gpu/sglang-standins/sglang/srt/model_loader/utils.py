"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.model_loader.utils (the real module imports the model
configuration and DeepGEMM): its resolve_language_model, the function itself, cut verbatim from the wheel into
sglang_discovery.py."""

from sglang_discovery import resolve_language_model  # noqa: F401
