"""The static ShuffleBN plan (pretrain.modeling.shuffle): fixed equal splits, a permutation.

In two real gloo processes: every global row is encoded exactly once, each process receives
b / world rows of every process, the keys come back to their rows, BN groups equal a one-process
computation of the same groups from the plan, and what the exchange dispatches (ops, shapes,
strides, dtypes, the collectives' split sizes) is the same for every seed, with no host sync and
no index built during the step (today's path, with its per-step split sizes and host-built
indices, fails the same checks). In one process: the plan's structure for 1, 2 and 4 processes
and 1, 2 and 4 BN groups each (the exchange's code has no branch on the number of processes
beyond one, so two real processes run all of it), its law over many seeds, the sizes it
refuses, and how it travels (device, static buffer, pickling for data workers).
"""

from __future__ import annotations

import collections
import itertools
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pretrain.modeling.distributed import memory_format, take_global_rows
from pretrain.modeling.shuffle import (
    encode_shuffled,
    restore_rows_static,
    shuffle_plan,
    static_shuffle_problem,
    take_rows_static,
)
from tests.helpers.dispatch import OpRecorder

B = 4  # rows per process
SHAPE = (2, 3, 3)
SEEDS = (11, 12)
SPLITS = (1, 2)


def _global_batch(world: int) -> torch.Tensor:
    """(world * B, *SHAPE) float64, row i's values i * 1000 + 0..17 (rows tell who they are)."""
    n, size = world * B, torch.Size(SHAPE).numel()
    rows = torch.arange(n, dtype=torch.float64).view(n, 1) * 1000
    return (rows + torch.arange(size, dtype=torch.float64)).view(n, *SHAPE)


def _bn(group: torch.Tensor) -> torch.Tensor:
    """A stand-in for a key encoder with BatchNorm: what a row gets depends on its group."""
    return (group - group.mean(0, keepdim=True)).flatten(1) * 2


def _index_from(calls: list, table: torch.Tensor) -> list[bool]:
    """For each index_select of ``calls``: whether its index is a view of ``table`` (given)."""
    ptr = table.untyped_storage().data_ptr()
    return [
        args[2].untyped_storage().data_ptr() == ptr
        for name, args, _ in calls
        if name == "aten.index_select.default"
    ]


def _record(x: torch.Tensor, world: int, rank: int) -> dict:
    """The ops of the static path and of today's for each seed, and where their indices came
    from; host syncs and copies counted by benchmarks/bench_step.py's counter (x and the plan
    count as device tensors: the plan arrives on the device with the batch)."""
    from benchmarks.bench_step import StepCounter

    out: dict = {"static": [], "today": []}
    for seed in SEEDS:
        plan = shuffle_plan(seed, world, B, 2, rank=rank)
        with OpRecorder() as rec:
            encode_shuffled(x, plan, _bn)
        counter = StepCounter()
        counter.mark([x, plan.table])
        with counter:
            encode_shuffled(x, plan, _bn)
        out["static"].append(
            {
                "ops": rec.ops,
                "given_index": _index_from(rec.calls, plan.table),
                "syncs": dict(counter.syncs),
                "copies": dict(counter.async_copies),
                "layout_mismatches": counter.layout_mismatches,
                "device_ops": counter.ops,
            }
        )
        perm = torch.randperm(world * B, generator=torch.Generator().manual_seed(seed))
        with OpRecorder() as rec:
            take_global_rows(x, perm)
        counter = StepCounter()
        counter.mark(x)  # today's permutation is a host tensor
        with counter:
            take_global_rows(x, perm)
        out["today"].append(
            {
                "ops": rec.ops,
                "given_index": _index_from(rec.calls, perm),
                "copies": dict(counter.async_copies),
            }
        )
    return out


def _worker(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    batch = _global_batch(world)[rank * B : (rank + 1) * B]
    results: dict = {}
    for splits, channels_last, seed in itertools.product(SPLITS, (False, True), SEEDS):
        x = batch.contiguous(memory_format=torch.channels_last) if channels_last else batch
        plan = shuffle_plan(seed, world, B, splits, rank=rank)
        mine = take_rows_static(x, plan)
        images = restore_rows_static(mine, plan)
        results[splits, channels_last, seed] = {
            "mine": mine.contiguous(),
            "layouts": {memory_format(t) == memory_format(x) for t in (mine, images)},
            "keys": restore_rows_static(mine.flatten(1), plan),  # an encoder per row
            "images": images.contiguous(),
            "bn": encode_shuffled(x, plan, _bn),
            "today": take_global_rows(x, plan.global_order()).contiguous(),
        }
    results["record"] = _record(batch.contiguous(memory_format=torch.channels_last), world, rank)
    torch.save(results, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def exchanged(tmp_path_factory: pytest.TempPathFactory):
    """(world, each rank's results) of one spawn of two gloo processes for the module."""
    world = 2
    tmp = tmp_path_factory.mktemp(f"shuffle{world}")
    out = str(tmp / "out")
    mp.spawn(_worker, args=(world, f"file://{tmp / 'rendezvous'}", out), nprocs=world, join=True)
    return world, [torch.load(f"{out}.{r}", weights_only=False) for r in range(world)]


def _cases():
    return itertools.product(SPLITS, (False, True), SEEDS)


def test_every_row_is_encoded_once_and_its_key_comes_back(exchanged):
    world, ranks = exchanged
    batch = _global_batch(world)
    for case in _cases():
        taken = torch.cat([r[case]["mine"] for r in ranks])
        rows = (taken[:, 0, 0, 0] / 1000).long()  # which global row each encoded image is
        assert sorted(rows.tolist()) == list(range(world * B)), case
        for d, r in enumerate(ranks):
            senders = collections.Counter((rows[d * B : (d + 1) * B] // B).tolist())
            assert senders == {p: B // world for p in range(world)}, (case, d)
            torch.testing.assert_close(r[case]["mine"], r[case]["today"], rtol=0, atol=0)
            torch.testing.assert_close(r[case]["keys"], batch.flatten(1), rtol=0, atol=0)
            torch.testing.assert_close(r[case]["images"], batch, rtol=0, atol=0)
            assert r[case]["layouts"] == {True}, case


def _reference_bn(batch: torch.Tensor, plans: list) -> torch.Tensor:
    """One process encodes every rank's BN groups as the plans document them: rank d receives
    rank p's rows ``send_p[d * m : (d + 1) * m]`` in rank order, orders them by ``arrange_d``
    and cuts them into ``splits`` groups; each key lands on its image's row."""
    world, m = len(plans), B // len(plans)
    keys = torch.empty(world * B, batch[0].numel(), dtype=batch.dtype)
    for d, plan in enumerate(plans):
        received = [p * B + int(plans[p].send[d * m + k]) for p in range(world) for k in range(m)]
        ordered = [received[int(j)] for j in plan.arrange]
        size = B // plan.splits
        for g in range(plan.splits):
            rows = ordered[g * size : (g + 1) * size]
            keys[rows] = _bn(batch[rows])
    return keys


def test_bn_groups_equal_one_process_computing_the_same_groups(exchanged):
    world, ranks = exchanged
    batch = _global_batch(world)
    for splits, channels_last, seed in _cases():
        plans = [shuffle_plan(seed, world, B, splits, rank=r) for r in range(world)]
        want = _reference_bn(batch, plans)
        assert not torch.equal(want, _bn(batch))  # the groups matter
        for r in ranks:
            torch.testing.assert_close(r[splits, channels_last, seed]["bn"], want, rtol=0, atol=0)


def test_the_exchange_dispatches_the_same_ops_for_every_seed(exchanged):
    """Names, shapes, strides, dtypes and split sizes: what a graph replay needs. Today's path
    sends per-step split sizes, so its two seeds differ (the recorder sees it)."""
    _, ranks = exchanged
    for r in ranks:
        static, today = r["record"]["static"], r["record"]["today"]
        assert static[0]["ops"] == static[1]["ops"]
        collectives = [op for op in static[0]["ops"] if op[0].startswith("c10d.")]
        assert [op[0] for op in collectives] == [
            "c10d.alltoall_base_.default",
            "c10d.allgather_.default",
        ]
        assert collectives[0][1][3:5] == ((), ())  # no split sizes: equal splits
        assert today[0]["ops"] != today[1]["ops"]


def test_the_exchange_makes_no_host_sync_and_builds_no_index(exchanged):
    """No op reads a value, every op works on the given device tensors (x, the plan), every
    index is a view of the plan's table and nothing is copied to the device during the step;
    today's path copies fresh host-built indices every step (the check can fail)."""
    _, ranks = exchanged
    for r in ranks:
        for static in r["record"]["static"]:
            assert static["syncs"] == {} and static["layout_mismatches"] == []
            assert static["copies"] == {}
            assert static["device_ops"] == len(static["ops"])  # no op on a host tensor
            assert static["given_index"] and all(static["given_index"])
        for today in r["record"]["today"]:
            assert not any(today["given_index"]) and today["copies"]


@pytest.mark.parametrize(
    ("world", "b", "splits"),
    [
        (1, 4, 1),
        (1, 6, 3),
        (2, 4, 1),
        (2, 4, 2),
        (2, 8, 4),
        (4, 4, 1),
        (4, 4, 2),
        (4, 8, 2),
        (4, 8, 4),
    ],
)
def test_the_plan_is_a_stratified_permutation(world, b, splits):
    """Every rank's send and arrange are permutations of its b rows, the restore is the same on
    every rank and inverts the global order, rank d encodes b / world rows of every process
    (those the senders' plans send it), and every BN group holds as even a share of every
    process as fits: b / (splits * world) rows when that divides, else the floor or ceiling."""
    m, size = b // world, b // splits
    for seed in range(20):
        plans = [shuffle_plan(seed, world, b, splits, rank=r) for r in range(world)]
        order = plans[0].global_order()
        assert sorted(order.tolist()) == list(range(world * b))
        for d, plan in enumerate(plans):
            assert plan.table.shape == (2 * b + world * b,) and plan.table.dtype == torch.long
            assert sorted(plan.send.tolist()) == list(range(b))
            assert sorted(plan.arrange.tolist()) == list(range(b))
            assert torch.equal(plan.restore, plans[0].restore)
            mine = order[d * b : (d + 1) * b]
            sent = sorted(p * b + int(i) for p in range(world) for i in plans[p].send[d * m :][:m])
            assert sorted(mine.tolist()) == sent
            for g in range(splits):
                share = collections.Counter((mine[g * size : (g + 1) * size] // b).tolist())
                want = {size // world, -(-size // world)}
                counts = [share.get(p, 0) for p in range(world)]
                assert set(counts) <= want and sum(counts) == size, (seed, d, g, share)


def test_the_plan_is_a_pure_function_of_its_arguments():
    a = shuffle_plan(5, 4, 8, 2, rank=1)
    assert torch.equal(a.table, shuffle_plan(5, 4, 8, 2, rank=1).table)
    assert not torch.equal(a.table, shuffle_plan(6, 4, 8, 2, rank=1).table)
    torch.manual_seed(0)  # the global generator plays no part
    b = shuffle_plan(5, 4, 8, 2, rank=1)
    assert torch.equal(a.table, b.table)


def test_which_rows_a_process_sends_where_is_uniform():
    """Over 1200 seeds (2 processes of 4 rows) each of the 6 pairs of rows a process can send
    to a rank is sent about equally often (200 each; 5 standard deviations: 65); over 1600
    seeds (4 processes, 2 BN groups each) every row lands in each of the 8 groups about
    equally often (200; 5 standard deviations: 66)."""
    pairs: collections.Counter = collections.Counter()
    for seed in range(1200):
        for p in range(2):
            send = shuffle_plan(seed, 2, 4, 1, rank=p).send
            for d in range(2):
                pairs[p, d, tuple(sorted(send[d * 2 : d * 2 + 2].tolist()))] += 1
    assert len(pairs) == 2 * 2 * 6
    assert all(abs(n - 200) < 65 for n in pairs.values()), pairs
    groups: collections.Counter = collections.Counter()
    for seed in range(1600):
        order = shuffle_plan(seed, 4, 4, 2, rank=0).global_order()
        for pos, row in enumerate(order.tolist()):
            groups[row, pos // 2] += 1  # BN group pos // 2: rank pos // 4, group (pos % 4) // 2
    assert len(groups) == 16 * 8
    assert all(abs(n - 200) < 66 for n in groups.values()), groups


def test_sizes_that_do_not_fit_are_refused():
    assert static_shuffle_problem(8, 32, 1) is None
    problem = static_shuffle_problem(8, 4, 1)
    assert "SOLVER.IMS_PER_BATCH" in problem and "take_global_rows" in problem
    assert "MODEL.KEY_BN_SPLITS" in static_shuffle_problem(2, 4, 3)
    with pytest.raises(ValueError, match="SOLVER.IMS_PER_BATCH"):
        shuffle_plan(0, 3, 4, 1, rank=0)
    with pytest.raises(ValueError, match="MODEL.KEY_BN_SPLITS"):
        shuffle_plan(0, 2, 4, 3, rank=0)
    with pytest.raises(ValueError, match="rank 2"):
        shuffle_plan(0, 2, 4, 1, rank=2)


def test_one_process_is_one_index_select():
    """Without a process group: the rows in ``send`` order (a uniform random grouping), one op;
    the wrong plan for this process, batch or device is refused (metadata only)."""
    x = _global_batch(1)
    plan = shuffle_plan(3, 1, B, 2, rank=0)
    with OpRecorder() as rec:
        mine = take_rows_static(x, plan)
    assert rec.names() == ["aten.slice.Tensor", "aten.index_select.default"]  # a view, a gather
    torch.testing.assert_close(mine, x[plan.send], rtol=0, atol=0)
    torch.testing.assert_close(restore_rows_static(mine.flatten(1), plan), x.flatten(1))
    torch.testing.assert_close(encode_shuffled(x, plan, _bn), _reference_bn(x, [plan]))
    with pytest.raises(ValueError, match="rank 0 of 1"):
        take_rows_static(x, shuffle_plan(3, 2, B, 1, rank=0))
    with pytest.raises(ValueError, match="6 rows"):
        take_rows_static(torch.zeros(6, 2), plan)
    with pytest.raises(ValueError, match="plan.to"):
        take_rows_static(x.to("meta"), plan)


def test_the_plan_travels_as_data():
    """A data worker pickles it, the step moves it to the device and a captured graph's static
    buffer takes the next step's values in place."""
    plan = shuffle_plan(1, 2, B, 2, rank=1)
    again = pickle.loads(pickle.dumps(plan))
    assert (again.world, again.rank, again.b, again.splits) == (2, 1, B, 2)
    assert torch.equal(again.table, plan.table)
    assert torch.equal(plan.to("cpu").table, plan.table)
    static = shuffle_plan(0, 2, B, 2, rank=1)
    ptr = static.table.data_ptr()
    assert static.copy_(plan) is static and static.table.data_ptr() == ptr
    assert torch.equal(static.table, plan.table)
    with pytest.raises(ValueError, match="cannot fill"):
        static.copy_(shuffle_plan(1, 2, B, 2, rank=0))


needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


@pytest.mark.cuda  # make gpu-check runs the tests marked cuda
@needs_gpu
def test_a_cuda_graph_replays_the_plan_it_is_given():
    """Captured once, replayed with each step's plan copied into the static buffer (pinned,
    non-blocking): the same keys as eager with that plan."""
    x = torch.randn(8, 3, 4, 4, device="cuda").contiguous(memory_format=torch.channels_last)
    static = shuffle_plan(1, 1, 8, 2, rank=0).pin_memory().to("cuda")
    assert static.table.is_cuda
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        encode_shuffled(x, static, _bn)  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        keys = encode_shuffled(x, static, _bn)
    for seed in (2, 3):
        plan = shuffle_plan(seed, 1, 8, 2, rank=0)
        assert plan.pin_memory().table.is_pinned()
        static.copy_(plan.pin_memory().to("cuda"))
        graph.replay()
        torch.testing.assert_close(keys, encode_shuffled(x, plan.to("cuda"), _bn))
