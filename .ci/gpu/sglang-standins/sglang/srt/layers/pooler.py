"""Stand-in (harness .ci/gpu/extract-sglang): the zoo's models are generative; no embedding pooler output."""

from sglang_standin import unreached

EmbeddingPoolerOutput = unreached("EmbeddingPoolerOutput")
