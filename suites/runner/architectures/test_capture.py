"""Capturing real transformers layer stacks: replay equals eager for batches of 1 to 8 requests in
every hidden-state mode (a dense, an MoE, a VLM and a hybrid in every profile, the whole zoo under
``nightly``), MoE under a caller's grad mode, per-layer divergence localisation, and the capture
matrix (every architecture against every discovery rule) as a golden."""

from __future__ import annotations

import json
import os
import types
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.compare import assert_equivalent, equivalent
from harness.golden import GoldenExtension, assert_upstream_golden
from harness.graphs import GraphCapturer
from harness.models.transformers_zoo import (
    ARCHITECTURES,
    EXPERTS_IMPLEMENTATIONS,
    VOCAB_SIZE,
    ArchitectureUnavailable,
    experts_implementation,
)
from harness.oracle import CALLING_MODES
from harness.plugin.profiles import capped_examples, current_hypothesis_profile
from harness.plugin.session import session_of
from harness.runner import ForwardBatch, capture_verdicts, select_bucket
from harness.runner.capture_verdicts import (
    COMPARED_CLASSES,
    DEVICE_DIFFERENCES,
    UNCAPTURABLE,
    golden_name,
    uncapturable,
    verdict_class,
    verdict_differences,
)
from harness.runner.cases import eager, eager_padded
from harness.runner.divergence import localise
from harness.runner.matrices import capture_row
from harness.upstream import release_files, version_label

pytestmark = pytest.mark.clause("replay-equals-eager")

CI_SUBSET = ("llama", "qwen3-moe", "llava", "lfm2")  # dense, MoE, VLM, hybrid (grid layout)
MAX_TOKENS = 16


def _verdict_class(config: pytest.Config) -> str:
    session = session_of(config)
    return verdict_class(session.backend.name, session.device)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # Every profile replays the subset; nightly the whole zoo this verdict class captures (its examples
    # cost seconds on a CPU). A class never recorded replays every stack: its failures are news.
    if metafunc.definition.name != "test_replay_equals_eager":
        return
    names = CI_SUBSET
    if current_hypothesis_profile() == "nightly":
        recorded = uncapturable(_verdict_class(metafunc.config))
        refused = recorded.stacks if recorded is not None else {}
        names = tuple(a.name for a in ARCHITECTURES if a.name not in refused)
    metafunc.parametrize("name", names)


def _lengths():
    return st.integers(1, 8).flatmap(lambda count: st.lists(st.integers(1, MAX_TOKENS // count), min_size=count,
                                                            max_size=count))


def _runner(architecture_runner, name, **options):
    try:
        return architecture_runner(name, **options)
    except ArchitectureUnavailable as error:
        pytest.skip(str(error))  # the installed transformers lacks it: the reason is in the message


@capped_examples(3)
@given(lengths=_lengths(), seed=st.integers(0, 2**16), mode=st.sampled_from(["none", "last", "full"]),
       all_logits=st.booleans(), calling=st.sampled_from(CALLING_MODES))
def test_replay_equals_eager(architecture_runner, architecture_buckets, check_run, failure_context, device, name,
                             lengths, seed, mode, all_logits, calling):
    """Two oracles, as in the runner suites: through ``check_run``, eager at the replay's shapes (the batch padded
    to its bucket), bitwise where :func:`harness.compare.bitwise_expected` says so, on everything a caller can
    observe; and eager on the batch itself within the tolerance table. Some architectures are not
    shape-invariant in eager: qwen3-next's chunked linear attention gives logits ~2e-5 apart for the same requests
    padded and unpadded (fp32, measured here). Where eager disagrees with itself beyond the table, the replay is
    held to eager at the replay's shapes only; the message says so."""
    adapter, runner = _runner(architecture_runner, name)
    batch = ForwardBatch.from_lengths(lengths, vocab_size=VOCAB_SIZE - 2, seed=seed, device=device,
                                      hidden_mode=mode, all_logits=all_logits)
    bucket = select_bucket(batch.num_tokens, architecture_buckets)
    try:
        actual = check_run(runner, adapter, batch, mode=calling, buckets=architecture_buckets,
                           twin=lambda b: eager_padded(adapter, b, bucket), model=name, seed=seed,
                           oracle="eager at the replay's shapes")
        unpadded = eager(adapter, batch)
        if not equivalent(actual, unpadded) and equivalent(eager_padded(adapter, batch, bucket), unpadded):
            # eager is shape-invariant here, so the replay must equal eager on the batch itself too
            assert_equivalent(actual, unpadded, exact=False, context=failure_context(
                model=name, seed=seed, batch=batch.describe(), comparison="against eager on the batch itself"))
    except AssertionError as error:
        layers = localise(runner, adapter, batch) if hasattr(runner, "layer_outputs") else "no per-layer outputs"
        raise AssertionError(f"{error}\nper-layer divergence of {name}:\n{layers}") from None


@pytest.mark.clause("no-grad")
def test_moe_under_caller_grad_mode(architecture_runner, architecture_buckets, check_run, device):
    # Parameters that require grad, a caller with autograd on: outputs are eager's (no grad_fn), values too.
    adapter, runner = _runner(architecture_runner, "qwen3-moe", requires_grad=True)
    batch = ForwardBatch.from_lengths([3, 4, 1], vocab_size=VOCAB_SIZE - 2, seed=5, device=device)
    check_run(runner, adapter, batch, mode="grad", buckets=architecture_buckets, model="qwen3-moe", seed=5)


@pytest.mark.clause("layer-outputs")
@pytest.mark.parametrize("name", CI_SUBSET)
def test_no_layer_diverges(architecture_runner, device, name):
    adapter, runner = _runner(architecture_runner, name)
    if not hasattr(runner, "layer_outputs"):
        pytest.skip("the runner under test records no per-layer outputs (optional: it only localises failures)")
    report = localise(runner, adapter, ForwardBatch.from_lengths([2, 5], vocab_size=VOCAB_SIZE - 2, seed=3,
                                                                 device=device))
    assert report.first_divergent is None, f"{name}: replay departs from eager\n{report}"


# The zoo is captured in shards, so that under pytest-xdist several workers capture at once (the whole zoo
# on one worker was the suites' longest step on a GPU run).
CAPTURE_SHARDS = 8


def _capture_shard(shard, graph_backend, device):
    graphs = GraphCapturer(graph_backend)
    matrix = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for arch in ARCHITECTURES[shard::CAPTURE_SHARDS]:
            try:
                matrix[arch.name] = capture_row(arch.name, graphs=graphs, device=device)
            except ArchitectureUnavailable as error:
                matrix[arch.name] = {"unavailable": error.reason}
    return matrix


@pytest.fixture(scope="module")
def capture_shard(graph_backend, device, tmp_path_factory, pytestconfig):
    """``capture_shard(k)``: shard ``k`` of every architecture against every rule (reference runner, selected
    graph backend), computed once per run: under pytest-xdist the first worker to need a shard writes it
    (plain JSON) where the others read it, instead of every worker building and capturing it again."""
    computed = {}
    # This process's own xdist run, if it is a worker: not PYTEST_XDIST_WORKER, which a pytest started from a
    # worker's test inherits (its basetemp's parent is then every run's, and it read an earlier run's matrix).
    worker_input = getattr(pytestconfig, "workerinput", None)

    def shard_of(shard):
        if shard not in computed:
            if worker_input is None:
                computed[shard] = _capture_shard(shard, graph_backend, device)
            else:
                from filelock import FileLock

                run = worker_input["testrunuid"]
                shared = tmp_path_factory.getbasetemp().parent / f"capture-matrix-{run}-{shard}.json"
                with FileLock(str(shared) + ".lock"):
                    if not shared.is_file():
                        shared.write_text(json.dumps(_capture_shard(shard, graph_backend, device)))
                    computed[shard] = json.loads(shared.read_text())
        return computed[shard]

    return shard_of


@pytest.fixture(scope="module")
def capture_matrix(capture_shard):
    """The whole matrix in the zoo's order; a worker starts at its own shard, so workers that need the whole
    matrix at once capture different shards instead of queueing behind one lock."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    start = int(worker[2:]) if worker[2:].isdigit() else 0
    rows = {}
    for step in range(CAPTURE_SHARDS):
        rows.update(capture_shard((start + step) % CAPTURE_SHARDS))
    return {arch.name: rows[arch.name] for arch in ARCHITECTURES}


@pytest.mark.parametrize("shard", range(CAPTURE_SHARDS), ids=lambda shard: f"shard{shard}of{CAPTURE_SHARDS}")
def test_harness_rule_stacks_replay_like_eager(capture_shard, shard):
    # The whole capturable zoo, a shard a test: where the harness rule's stack captures, several requests
    # replay it and match eager. Stacks that do not capture are recorded in the golden with the op that
    # stopped them.
    rows = capture_shard(shard)
    assert rows, f"shard {shard} of {CAPTURE_SHARDS} holds no architecture: the comparison would compare nothing"
    wrong = {name: row["harness"] for name, row in rows.items() if "harness" in row
             and row["harness"]["captures"]
             and not (row["harness"]["replays_several_requests"] and row["harness"]["replay_matches_eager"])}
    assert not wrong, f"harness-rule stacks that capture but do not replay several requests like eager: {wrong}"


def test_uncapturable_stacks_are_the_known_ones(capture_matrix, graph_backend, pytestconfig, request):
    """The stacks the harness rule cannot capture here are the ones recorded for this transformers release and
    verdict class, stopped by the recorded op (the emulation names it). Under a release with no record of its
    own, the nearest release's record stands in: what moved is upstream drift in the run report, not a failure."""
    kind = _verdict_class(pytestconfig)
    recorded = uncapturable(kind)
    refused = {name: row["harness"]["stopped_by"] for name, row in capture_matrix.items()
               if "harness" in row and not row["harness"]["captures"]}
    assert recorded is not None, (
        f"no capture verdicts are recorded for {kind!r}; these stacks refused capture here: {refused}. Record them "
        "in harness/runner/capture_verdicts.py (UNCAPTURABLE) and the matrix with --snapshot-update")
    known = recorded.stacks
    mismatched = {}
    if graph_backend.name == "emulated":  # the emulation names the op: it must be the recorded one
        mismatched = {name: message for name, message in refused.items()
                      if name in known and known[name].split(" (")[0] not in message}
    differences = [f"{name}: - captures  + refused by {refused[name]}" for name in sorted(set(refused) - set(known))]
    differences += [f"{name}: - refused by {known[name]}  + captures" for name in sorted(set(known) - set(refused))]
    differences += [f"{name}: - refused by {known[name]}  + refused by {message}"
                    for name, message in sorted(mismatched.items())]
    if not recorded.exact:
        from harness.golden import report_upstream_drift
        from harness.plugin.failures import file_node_id
        from harness.upstream import installed_version

        report_upstream_drift(
            record=capture_verdicts.__file__, where=f"UNCAPTURABLE[{version_label(recorded.version)!r}][{kind!r}]",
            nodeid=file_node_id(request.node), package="transformers",
            installed=installed_version("transformers") or (), compared_with=recorded.version,
            differences=differences,
            how="add the release's stacks to UNCAPTURABLE in harness/runner/capture_verdicts.py")
        return
    assert not differences, (
        f"the harness rule's stacks that do not capture on {kind} under transformers "
        f"{'.'.join(map(str, recorded.version))} are not the recorded ones (- recorded in UNCAPTURABLE, + now): "
        f"{differences}. A stack that now captures joins the nightly replay tests once it leaves UNCAPTURABLE")


def _pinned(matrix):
    # The largest difference and the error's text differ by run: reported (bench, GPU script), not pinned.
    return {name: {rule: {key: value for key, value in cell.items() if key not in ("max_abs_diff", "stopped_by")}
                   for rule, cell in row.items()} if "unavailable" not in row else row
            for name, row in matrix.items()}


def test_capture_matrix_golden(capture_matrix, snapshot, graph_backend, device):
    # One golden per verdict class, experts implementation (harness.runner.capture_verdicts) and transformers
    # release: what a stack's code does is transformers' own, so a release without a golden of its own is held
    # to the nearest one's as upstream drift, reported with the command that records it.
    assert_upstream_golden(snapshot, _pinned(capture_matrix), package="transformers",
                           prefix=f"{golden_name(graph_backend.name, device, experts_implementation())}-")


def _golden_folder() -> Path:
    location = types.SimpleNamespace(filepath=__file__, basename="test_capture")
    return Path(GoldenExtension.dirname(test_location=location))


def _recorded_matrices() -> dict[str, dict[str, dict]]:
    """``{transformers release: {verdict class: matrix}}`` of the committed goldens (experts: the default)."""
    recorded: dict[str, dict[str, dict]] = {}
    for kind in COMPARED_CLASSES:
        files = release_files(_golden_folder(), stem="test_capture_matrix_golden",
                              label=f"{kind}-{EXPERTS_IMPLEMENTATIONS[0]}-transformers-")
        for release, path in files.items():
            recorded.setdefault(version_label(release), {})[kind] = json.loads(path.read_text())
    return recorded


def test_emulated_and_cuda_verdicts_differ_only_where_listed(pytestconfig):
    """For every transformers release recorded on both classes, the matrices of the emulation and of CUDA (H200)
    agree on every stack, or the difference is listed with its cause in DEVICE_DIFFERENCES; UNCAPTURABLE agrees
    with every recording of its release."""
    recorded = _recorded_matrices()
    for release, matrices in sorted(recorded.items()):
        for kind, matrix in matrices.items():
            refused = {name for name, row in matrix.items() if "harness" in row and not row["harness"]["captures"]}
            listed = UNCAPTURABLE.get(release, {}).get(kind)
            if listed is None:
                continue  # a release recorded but not triaged: test_uncapturable_stacks_are_the_known_ones says so
            assert refused == set(listed), (
                f"UNCAPTURABLE[{release!r}][{kind!r}] {sorted(listed or ())} disagrees with its recorded matrix "
                f"{sorted(refused)} (harness/runner/capture_verdicts.py)")
    paired = {release: matrices for release, matrices in recorded.items() if set(COMPARED_CLASSES) <= set(matrices)}
    if not paired:
        golden_dir = session_of(pytestconfig).golden_dir
        into = f" --golden-dir={golden_dir}" if golden_dir is not None else ""
        pytest.skip(f"no transformers release has the capture matrices of both {' and '.join(COMPARED_CLASSES)} in "
                    f"{_golden_folder()} (recorded: {_releases(recorded) or 'none'}); only a GPU of class "
                    f"{COMPARED_CLASSES[1]} records one, with: pytest {__file__}::test_capture_matrix_golden "
                    f"--device cuda --graph-backend cuda --snapshot-update{into}")
    for release, matrices in sorted(paired.items()):
        differences = verdict_differences(*(matrices[kind] for kind in COMPARED_CLASSES))
        listed = DEVICE_DIFFERENCES.get(release, {})
        unlisted = {name: verdict for name, verdict in differences.items() if name not in listed}
        stale = sorted(set(listed) - set(differences))
        assert not unlisted and not stale, (
            f"transformers {release}: verdicts (captures on {' / '.join(COMPARED_CLASSES)}) that differ without a "
            f"listed cause: {unlisted}; listed differences that no longer hold: {stale} "
            "(harness/runner/capture_verdicts.py, DEVICE_DIFFERENCES)")


def _releases(recorded: dict[str, dict]) -> str:
    return ", ".join(f"{release} ({'/'.join(sorted(kinds))})" for release, kinds in sorted(recorded.items()))
