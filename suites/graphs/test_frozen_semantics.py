"""The CUDA-graph rules every backend must reproduce, one test per rule."""

from __future__ import annotations

import gc

import pytest
import torch

from harness.compare import assert_equivalent
from harness.errors import CaptureError, GraphHazardError

pytestmark = pytest.mark.clause("frozen-capture")


def test_python_branch_is_frozen_at_capture(graph_oracle, make_tensor):
    x = make_tensor(4, 3, seed=1)
    flags = {"double": True}
    graph = graph_oracle.capture(lambda: x * 2 if flags["double"] else x * 3)
    flags["double"] = False
    x.copy_(make_tensor(4, 3, seed=2))
    graph_oracle.replay(graph, lambda: x * 2, inputs=[x], exact=True)


def test_python_scalar_is_frozen_at_capture(graph_oracle, make_tensor):
    x = make_tensor(5, seed=3)
    scale = [2.0]
    graph = graph_oracle.capture(lambda: x * scale[0])
    scale[0] = 5.0
    graph_oracle.replay(graph, lambda: x * 2.0, inputs=[x], exact=True)


def test_refilled_static_input_changes_the_result(graph_oracle, make_tensor):
    x = make_tensor(6, seed=4)
    program = lambda: torch.exp(x) + 1  # noqa: E731
    graph = graph_oracle.capture(program)
    x.copy_(make_tensor(6, seed=5))
    graph_oracle.replay(graph, program, inputs=[x], exact=True)


# Ops whose keyword-only arguments change the result: alpha, an accumulation dtype, a rounding mode.
KEYWORD_ONLY_ARGUMENT_OPS = {
    "add_alpha": lambda x, g: torch.add(x, x.flip(0), alpha=3),
    "sum_dtype": lambda x, g: x.sum(0, dtype=torch.float64).float() + x,
    "div_rounding_mode": lambda x, g: torch.div(x * 7, 2, rounding_mode="floor"),
}


@pytest.mark.parametrize("op", sorted(KEYWORD_ONLY_ARGUMENT_OPS))
def test_keyword_only_arguments_replay(graph_oracle, make_tensor, op):
    """An op's keyword-only arguments are part of what the graph replays, as CUDA replays the kernel they chose."""
    x = make_tensor(4, 3, seed=6)
    generator, twin = torch.Generator(device=x.device), torch.Generator(device=x.device)
    generator.manual_seed(5)
    graph = graph_oracle.capture(lambda: KEYWORD_ONLY_ARGUMENT_OPS[op](x, generator))
    for seed in (7, 8):
        x.copy_(make_tensor(4, 3, seed=seed))
        twin.set_state(generator.get_state())
        graph_oracle.replay(graph, lambda: KEYWORD_ONLY_ARGUMENT_OPS[op](x, twin), inputs=[x], exact=True, op=op)


def test_a_draw_from_a_generator_of_the_programs_own_is_refused_at_capture(graph_oracle, make_tensor):
    """CUDA refuses to capture a draw from a generator the graph was not told about (only the default generator's
    stream is replayed); every backend refuses it at capture, naming the generator, not at a later replay."""
    x = make_tensor(4, 3, seed=6)
    generator = torch.Generator(device=x.device)
    generator.manual_seed(5)
    graph_oracle.capture_fails(lambda: x + torch.rand(x.shape, generator=generator, device=x.device),
                               (CaptureError, RuntimeError), match="generator")


def test_fresh_tensor_handed_in_after_capture_is_ignored(graph_oracle, make_tensor):
    holder = {"x": make_tensor(3, 3, seed=6)}
    static = holder["x"]
    graph = graph_oracle.capture(lambda: holder["x"] * 2)
    holder["x"] = make_tensor(3, 3, seed=7)  # a new object: the graph only knows `static`
    graph_oracle.replay(graph, lambda: static * 2, inputs=[static, holder["x"]], exact=True, replay=0)
    static.copy_(make_tensor(3, 3, seed=8))
    graph_oracle.replay(graph, lambda: static * 2, inputs=[static, holder["x"]], exact=True, replay=1)


def test_views_of_static_inputs_see_new_data(graph_oracle, make_tensor):
    x = make_tensor(4, 4, seed=9)
    column, rows = x[:, 1], x[1:3]
    graph = graph_oracle.capture(lambda: (column * 2, rows.sum(dim=0)))
    x.copy_(make_tensor(4, 4, seed=10))
    graph_oracle.replay(graph, lambda: (x[:, 1] * 2, x[1:3].sum(dim=0)), inputs=[x], exact=True)


def test_in_place_updates_replay(graph_oracle, make_tensor):
    accumulator = torch.zeros(5, device=make_tensor(1, seed=0).device)
    x = make_tensor(5, seed=11)
    graph = graph_oracle.capture(lambda: accumulator.add_(x))
    twin = accumulator.clone()  # where the capture left it (CUDA: one warm-up run; emulated: the recording run)
    for replay in range(2):  # the eager twin accumulates into its own copy; both must end alike
        graph_oracle.replay(graph, lambda: twin.add_(x), inputs=[accumulator, x], eager_inputs=[twin, x],
                            exact=True, replay=replay)


def test_state_replaced_after_capture_is_not_what_replays_update(graph_oracle, make_tensor):
    """A state tensor re-allocated after the capture (a new tensor at another address with the same values, as an
    engine's memory release and resume may leave it): replays keep reading and writing the one they were captured
    on, and never touch the new one (so a runner over such a graph must capture again)."""
    x = make_tensor(5, seed=12)
    owner = {"state": torch.zeros(5, device=x.device)}
    graph = graph_oracle.capture(lambda: owner["state"].add_(x))
    captured = owner["state"]
    twin = captured.clone()  # where the capture left it
    owner["state"] = captured.clone()  # re-allocated; the engine keeps the old one alive here (a backup)
    moved = owner["state"]
    before = moved.clone()
    graph_oracle.replay(graph, lambda: twin.add_(x), inputs=[captured, x], eager_inputs=[twin, x], exact=True)
    assert_equivalent(moved, before, exact=True,
                      context={"checking": "the re-allocated state after a replay: the graph writes the captured one"})


def test_random_ops_draw_fresh_numbers_each_replay(graph_oracle, device):
    """Each replay draws what eager draws from the same generator state, and leaves the generator where eager
    leaves it (the checker runs both from one state): so replays draw fresh numbers, never a frozen set."""
    program = lambda: torch.rand(64, device=device) + 0  # noqa: E731
    graph = graph_oracle.capture(program)
    first = graph_oracle.replay(graph, program, exact=True, replay=0).clone()
    second = graph_oracle.replay(graph, program, exact=True, replay=1)
    assert not torch.equal(first, second), "a random op replayed the same numbers: its RNG state is frozen"


def test_tensors_created_inside_capture_are_refreshed(graph_oracle, make_tensor, device):
    x = make_tensor(3, seed=12)
    program = lambda: torch.ones(3, device=device) * x  # noqa: E731
    graph = graph_oracle.capture(program)
    x.copy_(make_tensor(3, seed=13))
    graph_oracle.replay(graph, program, inputs=[x], exact=True)


@pytest.mark.parametrize("rows", [0, 1])
def test_empty_intermediates_belong_to_the_graph(graph_oracle, make_tensor, rows):
    """A tensor of zero elements made inside the capture (an empty slice of a batch, scaled) has no memory a pool
    could keep, yet it is the graph's own, as any op's result: the program drops it after capture and the replays
    still equal eager (not a released outside tensor)."""
    x = make_tensor(4, 3, seed=8)

    def program():
        part = x[:rows] * 2  # zero rows: an empty result
        return torch.cat([x + 1, part + 1]) + part.sum(0)

    graph = graph_oracle.capture(program)
    gc.collect()
    for seed in (9, 10):
        x.copy_(make_tensor(4, 3, seed=seed))
        graph_oracle.replay(graph, program, inputs=[x], exact=True, rows=rows)


@pytest.mark.clause("pools")
def test_graphs_sharing_a_pool_replay_independently(graph_oracle, make_tensor):
    pool = graph_oracle.new_pool()
    x = make_tensor(8, seed=14)
    first = graph_oracle.capture(lambda: x + 1, pool=pool)
    second = graph_oracle.capture(lambda: first.output * 3, pool=pool)
    x.copy_(make_tensor(8, seed=15))
    graph_oracle.replay(first, lambda: x + 1, inputs=[x], exact=True, graph="first")
    graph_oracle.replay(second, lambda: (x + 1) * 3, inputs=[x], exact=True, graph="second")
    assert_equivalent(first.output, x + 1, exact=True,
                      context={"checking": "the first graph's output after the second, in its pool, replayed"})


@pytest.mark.clause("pools")
def test_a_capture_handed_memory_another_graph_freed_computes_as_eager(graph_oracle, make_tensor):
    """The first graph's intermediates (``x * 2`` and its column sums) are freed when its capture ends; a later
    capture into the same pool may be handed that memory, the best fit (CUDA's allocator re-carves it). The later
    capture's run, which stands in for the warm-up (``docs/graphs.md``, Graph backends), updates state from the
    re-used memory as eager does, and the graphs, replayed in capture order, equal eager."""
    pool = graph_oracle.new_pool()
    n = 64
    x, y = make_tensor(n, n, seed=20), make_tensor(n, n, seed=21)
    total = torch.zeros(n, n, device=x.device)
    first_program = lambda: (x * 2).sum(dim=0) + 1  # noqa: E731
    second_program = lambda accumulator: lambda: accumulator.add_(y * 3) * 1.0  # noqa: E731
    first = graph_oracle.capture(first_program, pool=pool)
    second = graph_oracle.capture(second_program(total), pool=pool)
    assert_equivalent(total, y * 3, exact=True,
                      context={"checking": "state a capture into freed pool memory updated, against eager's update"})
    for replay, seed in enumerate((22, 23)):
        x.copy_(make_tensor(n, n, seed=seed))
        y.copy_(make_tensor(n, n, seed=seed + 10))
        graph_oracle.replay(first, first_program, inputs=[x], exact=False, graph="first", replay=replay)
        twin = total.clone()
        graph_oracle.replay(second, second_program(twin), inputs=[y, total], eager_inputs=[y, twin], exact=True,
                            graph="second", replay=replay)


@pytest.mark.clause("hazards")
def test_released_external_tensor_is_reported_as_hazard(graph_oracle, graph_backend, make_tensor):
    if graph_backend.name != "emulated":
        pytest.skip("only the emulated backend can see released memory; CUDA silently reads whatever is there")
    holder = [make_tensor(16, seed=16)]
    graph = graph_oracle.capture(lambda: holder[0] * 2)
    graph_oracle.replay(graph, lambda: holder[0] * 2, inputs=holder, exact=True)  # alive: fine
    holder.clear()
    gc.collect()
    graph_oracle.replay_fails(graph, GraphHazardError, match="released")


@pytest.mark.clause("hazards")
@pytest.mark.parametrize("change", ["grown", "shrunk", "set to another storage"])
def test_a_captured_input_whose_storage_was_resized_is_reported_as_hazard(graph_oracle, graph_backend, make_tensor,
                                                                           change):
    """PyTorch #191589: ``resize_`` on a captured tensor between capture and replay moves (or shortens) its memory,
    and the graph keeps reading the old address. Where the backend can see it, the replay refuses."""
    if graph_backend.name != "emulated":
        pytest.skip("only the emulated backend can see a storage moved under a graph; on CUDA the graph reads the old "
                    "address, which the hazard amplifiers fill with NaN once it is free (their positive control: "
                    "test_hazard_amplifiers.py::test_poison_makes_a_replay_over_a_moved_input_read_nan)")
    x = make_tensor(16, seed=24)
    graph = graph_oracle.capture(lambda: x * 2)
    graph_oracle.replay(graph, lambda: x * 2, inputs=[x], exact=True)  # as captured: fine
    if change == "grown":
        x.resize_(1 << 14)
    elif change == "shrunk":
        x.untyped_storage().resize_(0)
    else:
        x.set_(make_tensor(16, seed=25))
    # set_ drops the tensor's last hold on its old storage: the memory the graph reads is released, not moved
    graph_oracle.replay_fails(graph, GraphHazardError,
                              match="released by its owner" if change.startswith("set") else "resized or moved")


@pytest.mark.clause("pools")
def test_graphs_captured_without_a_pool_do_not_share_memory(graph_oracle, make_tensor):
    """Only graphs given one pool may share memory (and must then replay in capture order). Two graphs
    captured with no pool are independent: replaying one never changes the other's output, even where
    the second's output could take the memory of the first's released intermediates."""
    x, y = make_tensor(256, 256, seed=17), make_tensor(256, 256, seed=18)
    # The intermediate x * 2 is released during the first capture: a pool shared with the second
    # graph would hand its memory to the second graph's output, the same size.
    first = graph_oracle.capture(lambda: (x * 2).sum(dim=0))
    second = graph_oracle.capture(lambda: y * 3)
    graph_oracle.replay(second, lambda: y * 3, inputs=[y], exact=True, graph="second")
    expected = second.output.clone()
    x.copy_(make_tensor(256, 256, seed=19))
    graph_oracle.replay(first, lambda: (x * 2).sum(dim=0), inputs=[x], exact=False, graph="first")
    assert_equivalent(second.output, expected, exact=True,
                      context={"checking": "the output of a graph after another graph, with its own pool, replayed"})


def test_a_replay_runs_in_its_captures_context(graph_oracle, make_tensor, device):
    """docs/graphs.md, caller's context: a context set after the capture does not reach a replay, which equals
    eager run in the capture's context (autocast here); a caller who changes the context captures again."""
    x, weight = make_tensor(4, 8, seed=16), make_tensor(8, 8, seed=17)
    program = lambda: x @ weight  # noqa: E731

    def in_capture_context():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            return program()

    with torch.autocast(device.type, dtype=torch.bfloat16):
        graph = graph_oracle.capture(program)
    x.copy_(make_tensor(4, 8, seed=18))
    replayed = graph_oracle.replay(graph, in_capture_context, inputs=[x])  # autocast off now
    assert replayed.dtype == torch.bfloat16 != program().dtype, "the replay ran in the replay's context"
