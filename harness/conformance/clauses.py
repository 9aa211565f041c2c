"""The contract clauses of each component, with their tiers (``core``: wrong results; ``strict``: must raise).

A test names its clause with ``@pytest.mark.clause("ID")`` (parameter, test or module; the nearest wins).
Each component's doc shows every clause id and tier; ``tests/test_clauses.py`` checks doc, table and
suites agree. An engine adapter may declare clauses its engine documents away (:class:`DocumentedAway`): the
report gives them neither held nor violated, with the engine's own sentence."""

from __future__ import annotations

import dataclasses

from harness.errors import UsageError

__all__ = ["Clause", "CORE", "STRICT", "TIERS", "CLAUSES", "MARKER", "clauses_of", "DocumentedAway",
           "outside_contract", "rests_on_stand_in", "running_test_notes"]

CORE, STRICT = "core", "strict"
TIERS = {
    CORE: "a violation gives wrong results (stale reads, silent broadcast or cast, lost write-back, made-up data)",
    STRICT: "the harness's stance on what must raise or be reported; an engine may document the case as undefined",
}
MARKER = "clause"


@dataclasses.dataclass(frozen=True)
class Clause:
    """One clause of a component's contract: ``id`` as tests name it, its tier, and what it says."""

    component: str
    id: str
    tier: str
    summary: str

    @property
    def name(self) -> str:
        return f"{self.component}:{self.id}"


@dataclasses.dataclass(frozen=True)
class DocumentedAway:
    """A clause an engine's own documentation narrows away, as its adapter declares it.

    ``quote`` is the engine's sentence that says so, verbatim (its docstring, or the message it raises);
    ``where`` names the file and the object that carries it; ``note`` says, in the harness's words, how the
    engine's contract differs from the clause. The clause's tests still run and their counts are shown, but
    they give it neither ``held`` nor ``violated``: the report says ``documented away`` and quotes the
    engine (:func:`harness.conformance.build_report`)."""

    clause: str
    quote: str
    where: str
    note: str = ""


# What engine adapters and stand-ins said of the running test, in this process: the documented-away clauses it
# stepped outside of (outside_contract) and the stand-ins it reached (rests_on_stand_in).
_NOTES: dict[str, list[str]] = {"outside_contract": [], "stand_ins": []}


def _note(kind: str, text: str) -> None:
    if text not in _NOTES[kind]:
        _NOTES[kind].append(text)


def outside_contract(clause: str) -> None:
    """Say, from an engine adapter, that the running test uses the engine where the engine's own documentation
    leaves it outside the contract of ``clause``, one of the adapter's :class:`DocumentedAway` entries (a vLLM
    break that returns a new tensor, where vLLM requires breaks to write a caller-provided buffer).

    A failing test that did so is not counted against its own clause: the report lists it as outside the
    engine's contract, under ``clause``, and judges its clause by the other tests. Outside a conformance run
    nothing reads it."""
    _note("outside_contract", clause)


def rests_on_stand_in(what: str) -> None:
    """Say, from a stand-in for an engine module (one an extraction script wrote in place of code that cannot
    be imported here), that the running test reached it: ``what`` names the stand-in and what it replaces. The
    report marks every clause whose verdict rests on tests that did. Outside a conformance run nothing reads it."""
    _note("stand_ins", what)


def running_test_notes(*, clear: bool = False) -> dict[str, list[str]]:
    """What :func:`outside_contract` and :func:`rests_on_stand_in` said since the last ``clear``, by kind, the
    empty kinds left out (the conformance plugin clears them as each test starts)."""
    notes = {kind: list(texts) for kind, texts in _NOTES.items() if texts}
    if clear:
        for texts in _NOTES.values():
            texts.clear()
    return notes


def _table(component: str, *rows: tuple[str, str, str]) -> tuple[Clause, ...]:
    return tuple(Clause(component, clause_id, tier, summary) for clause_id, tier, summary in rows)


CLAUSES: dict[str, tuple[Clause, ...]] = {
    "graphs": _table(
        "graphs",
        ("replay-equals-eager", CORE, "after the static inputs are refilled in place, a replay equals the function "
                                      "run eagerly (random programs, state machines, compiled code)"),
        ("frozen-capture", CORE, "captured code is frozen: Python control flow and scalars keep their capture-time "
                                 "values, new tensor objects are ignored, views, in-place updates, RNG and tensors "
                                 "made inside the capture replay"),
        ("live-breaks", CORE, "every break runs again at every replay, in capture order, with the same argument "
                              "objects, seeing this replay's values however it was called; random draws in a "
                              "break are fresh and in the eager generator stream"),
        ("write-back", CORE, "break outputs are written back in place into the objects returned at capture "
                             "(tensors, views element by element, lists, tuples, dicts, objects with __dict__ or "
                             "__slots__, the Python values they hold); graph.output is refreshed in place and "
                             "replay() returns that object itself"),
        ("changes-raise", CORE, "a break output of another shape, dtype, device or structure at replay raises "
                                "ReplayError at that break, never broadcasts, casts or silently replaces"),
        ("fault-recovery", CORE, "an exception from a break at replay propagates, and the next replay equals eager "
                                 "again"),
        ("handled-break-errors", CORE, "a break that raises during capture, handled by the captured program, is "
                                       "recorded as the program ran: its handler replays, the break runs again and "
                                       "must raise as it did, and a replay where it no longer does raises "
                                       "ReplayError"),
        ("capture-failure-clean", CORE, "an exception during capture propagates, leaves no capture active and "
                                        "restores the process state the capture changed; a capture or replay "
                                        "that succeeds restores it too"),
        ("per-thread", CORE, "capture state is per thread: another thread's breaks are plain calls"),
        ("warm-up", CORE, "state the function creates lazily is created at warm-up, outside the graph"),
        ("pools", CORE, "graphs sharing a pool replay in capture order without clobbering each other; graphs "
                        "captured without a pool never share memory"),
        ("capture-rules", STRICT, "host synchronisations and data-dependent shapes fail the capture with "
                                  "CaptureError"),
        ("not-reentrant", STRICT, "a capture inside a capture, also from a break body, raises CaptureError"),
        ("nested-breaks-inline", STRICT, "a break called from inside a break body runs inline"),
        ("immutable-values-refused", STRICT, "a Python value a break returns outside a mutable container (bare, "
                                             "in tuples only) fails the capture with CaptureError"),
        ("accounting", STRICT, "segment_count, break_count and break_names describe the capture"),
        ("hazards", STRICT, "a captured tensor the caller released is reported as a hazard (GraphHazardError)"),
    ),
    "gather": _table(
        "gather",
        ("bit-identical", CORE, "each output is buf[indices], bit-identical to eager indexing, for every dtype, "
                                "index dtype, count (0 and duplicates included) and value (-0.0, infinities, "
                                "int64 beyond 2**53), reading the sources as they are at the call"),
        ("layouts", CORE, "indices and sources of any memory layout (strided, sliced, offset views) give the same "
                          "result"),
        ("index-domain", CORE, "negative indices in [-pool, 0) wrap as in Python, by each buffer's own pool; an "
                               "index outside [-pool, pool) raises, never returns made-up data"),
        ("fresh-outputs", CORE, "outputs are new tensors that alias no source; sources are never modified"),
        ("no-hidden", CORE, "hidden_states_buf=None gives hidden_states=None"),
        ("in-graph", CORE, "captured in a graph, a replay after the indices and sources are refilled gathers the "
                           "new values"),
        ("relay", CORE, "the stash/resolve relay over the gather equals the relay over the eager oracle"),
        ("relay-misuse", STRICT, "resolving a never-stashed or already-resolved slot is caught"),
        ("streams", CORE, "called on any stream, a gather reads and writes in that stream's order: the relay over "
                          "it with stash and resolve on two streams, the caller dropping its tensors at once, equals "
                          "the eager relay on one stream"),
        ("compile-bounded", STRICT, "over a stream of index counts a compiled gather compiles a bounded number of "
                                    "graphs and never falls back to eager"),
        ("launch-promise", STRICT, "a declared promised_kernel_launches holds on CUDA"),
    ),
    "runner": _table(
        "runner",
        ("replay-equals-eager", CORE, "a replay equals the model run eagerly under no_grad on the same batch (bitwise "
                                      "at the bucket's padded shapes where harness.compare.bitwise_expected holds), "
                                      "for every zoo model and dtype and the transformers architectures"),
        ("several-requests", CORE, "a graph captured with a one-request dummy serves batches of several requests: "
                                   "each request's outputs equal eager's whatever the split of the tokens, its "
                                   "batchmates and its place among them; a batch ending in zero-length padding "
                                   "requests gets one row per request, equal to eager's"),
        ("buckets-and-padding", CORE, "a batch replays in the smallest bucket holding every row it carries (padding "
                                      "it arrived with included), buckets given in any order, and its per-token "
                                      "outputs are cut to its real tokens; a batch no bucket holds runs eagerly; "
                                      "every pad row reaches attention with the padding fill (position 0, request-"
                                      "pool slot 0), never the capture's or a previous batch's values"),
        ("hidden-states", CORE, "hidden mode none hands out no hidden states, last one row per request and full one "
                                "per token, equal to eager's selection"),
        ("stack-arguments", CORE, "the static inputs are filled from the arguments the outer model passes the layer "
                                  "stack at this call, not from the batch: shifted positions, keyword side inputs "
                                  "and tensors inside lists and dicts reach the graph"),
        ("argument-writes", CORE, "what the layer stack writes into its arguments in place (a fused add-norm's "
                                  "residual, positions a draft loop steps) reaches the caller's tensors as eager's "
                                  "writes do, at every bucket, an exact fill and a padded batch included"),
        ("frozen-arguments", CORE, "a stack argument the graph froze (a Python value other than the capture's, a "
                                   "tensor where the capture saw None) is refused with a HarnessError or run "
                                   "eagerly, never replayed with the capture's value"),
        ("outputs-owned", CORE, "outputs are the caller's: cut and copied whatever their structure (dataclass, dict, "
                                "tuple), an exact fill of a bucket included, so later replays never overwrite them"),
        ("no-grad", CORE, "capture, replay and the eager fallback run without autograd whatever the caller's mode "
                          "(grad, no_grad, inference_mode) and whichever mode built the runner; outputs carry "
                          "eager's autograd metadata (no grad_fn)"),
        ("forward-restored", CORE, "layer_model.forward is what it was at the call after every call, also after an "
                                   "Exception or a BaseException from the outer forward (on every rank under tensor "
                                   "parallelism), and the runner stays usable"),
        ("runs-once", CORE, "per call the graph replays once and the real layer forward never runs; the logits "
                            "processor and hooks on the layer module run once in Python, and hooks on decoder layers "
                            "replay their captured work once, as eagerly"),
        ("decode-steps", CORE, "paged-KV decode and speculative verify loops equal their eager twin after every step "
                               "(tokens, logits, hidden states, the relay, the whole KV cache), each step replaying "
                               "exactly once"),
        ("tensor-parallel", CORE, "on a tensor-parallel model every rank replays the bucket of the group's largest "
                                  "arrival (or every rank runs eagerly) and equals eager on its shard and the "
                                  "unsharded model, the ranks bitwise equal"),
        ("lifecycle", CORE, "over any sequence of calls, errors, nested calls, another instance running inside a "
                            "replay, forward wrappers changed and weights updated in place, every call equals eager, "
                            "earlier outputs keep their values, the layer module's dicts are as the user left them "
                            "and no forward context stays published"),
        ("moved-state", CORE, "a parameter or buffer the engine re-allocates between replays (a new tensor at "
                              "another address, as a memory release and resume may leave it) is what the next "
                              "replay reads and writes, never the memory the graphs were captured on"),
        ("concurrent-runners", CORE, "two runners over models of their own, called from two threads at once, "
                                     "each equal eager on their own model and batch"),
        ("discovery", CORE, "discovery picks the module that owns the decoder-layer list and returns hidden states "
                            "(each zoo layout's and architecture's known path, never a modality tower) and says when "
                            "it fell back"),
        ("fell-back-graph", CORE, "after a discovery fallback the whole-model graph replays only batches like its "
                                  "dummy capture (one request, hidden mode none, last-token logits); any other batch "
                                  "runs eagerly and replay() refuses it"),
        ("discovery-reported", STRICT, "a fallback or a stack found only by searching warns (a UserWarning naming the "
                                       "model's class and the paths tried), a found stack does not; "
                                       "strict_discovery=True raises DiscoveryError instead"),
        ("bucket-errors", STRICT, "bad buckets (none, zero or negative, repeated) raise BucketError at construction; "
                                  "bucket_for and replay raise BucketError naming the count no bucket holds"),
        ("not-reentrant", STRICT, "run and replay called from inside a replay raise ReplayError, and the outer "
                                  "replay still returns eager values"),
        ("accounting", STRICT, "stats count the captures and one replay (by bucket) or one eager fallback per call; "
                               "capture_plan() gives each bucket's segments and breaks as the model's structure "
                               "fixes them"),
        ("layer-outputs", STRICT, "a runner offering layer_outputs records one output per decoder layer in every "
                                  "bucket at its padded shape, equal to eager's layer by layer"),
        ("rank-errors-raise", STRICT, "an error on one rank fails the step on every rank within its deadline, "
                                      "naming each rank's fate, with every rank's forward restored: no rank hangs"),
    ),
}


def clauses_of(component: str) -> tuple[Clause, ...]:
    """The clauses of ``component``; :class:`UsageError` where it declares none."""
    if component not in CLAUSES:
        raise UsageError(f"no contract clauses are declared for {component!r} yet (harness/conformance/clauses.py); "
                         f"components with a conformance report: {', '.join(CLAUSES)}")
    return CLAUSES[component]
