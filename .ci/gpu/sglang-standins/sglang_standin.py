"""Helpers of the harness's stand-ins for SGLang modules (.ci/gpu/extract-sglang copies them into its folder).

Not SGLang's code. ``reached(what)`` tells the harness's conformance report that the running test's verdict rests
on the stand-in ``what``; ``unreached(name)`` is a placeholder for a name an SGLang module imports but the
harness's control path never uses: calling or instantiating it raises, naming it, so a path that does reach it
fails loudly instead of running on a guess."""

try:  # the harness's conformance report marks the verdicts of the tests that reach a stand-in
    from harness.conformance.clauses import rests_on_stand_in as reached
except ImportError:  # the folder used without the harness

    def reached(what):
        return None


def unreached(name):
    class Unreached:
        def __init__(self, *args, **kwargs):
            raise NotImplementedError(
                f"stand-in (harness .ci/gpu/extract-sglang): SGLang's {name} is not reached by the control path "
                "the harness runs (one GPU, breakable prefill backend, no DP/CP/PP/LoRA/speculative decoding)")

    Unreached.__name__ = Unreached.__qualname__ = name.rsplit(".", 1)[-1]
    return Unreached


def returns(value):
    """A function of any arguments that answers ``value`` (a feature this one-GPU set-up does not enable)."""

    def answer(*args, **kwargs):
        return value

    return answer
