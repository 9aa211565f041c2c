"""Stand-in (harness .ci/gpu/extract-sglang) for sglang.srt.configs.model_config (the real one parses Hugging
Face configs): the harness's zoo models are no Qwen4-exp architecture."""

from sglang_standin import returns

is_qwen4_exp = returns(False)
