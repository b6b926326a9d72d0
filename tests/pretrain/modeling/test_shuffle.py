"""ShuffleBN from a plan (pretrain.utils.shuffle_plan, pretrain.modeling.shuffle).

In two real gloo processes, for per-process batches that divide among the processes and BN
groups and ones that do not: every global row is encoded exactly once, each process receives
the fixed split sizes of every process, the keys come back to their rows, BN groups equal a
one-process computation of the same groups from the plan, what the exchange dispatches (ops,
shapes, strides, dtypes, the collectives' split sizes) is the same for every seed, with no host
sync and no index built during the step, and the exchange compiled (``aot_eager``, one graph)
gives eager's rows, every collective of its graph moving a plainly contiguous tensor. In one
process: the plan's structure for 1 to 5 processes and 1 to 4 BN groups each (the exchange's
code has no branch on the number of processes beyond one, so two real processes run all of
it), its law over many seeds, the sizes it refuses, and how it travels (device, static buffer,
pickling for data workers).
"""

from __future__ import annotations

import collections
import functools
import itertools
import pickle

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch._dynamo.backends.debugging import aot_eager, boxed_nop

from pretrain.modeling.distributed import memory_format
from pretrain.modeling.shuffle import encode_shuffled, restore_rows, take_rows
from pretrain.utils.shuffle_plan import shuffle_plan, split_size
from tests.helpers.dispatch import OpRecorder

B = 4  # rows per process where one size is enough
SHAPE = (2, 3, 3)
SEEDS = (11, 12)
# (rows per process, BN groups): b / 2 processes and b / splits whole, then neither
SIZES = ((4, 1), (4, 2), (5, 1), (5, 3))
# (b, splits, channels_last, seed)
CASES = [(b, s, cl, seed) for (b, s), cl, seed in itertools.product(SIZES, (False, True), SEEDS)]


def _global_batch(world: int, b: int = B) -> torch.Tensor:
    """(world * b, *SHAPE) float64, row i's values i * 1000 + 0..17 (rows tell who they are)."""
    n, size = world * b, torch.Size(SHAPE).numel()
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


def _record(world: int, rank: int) -> dict:
    """The exchange's ops for each seed (channels_last rows, 2 BN groups), and where its indices
    came from; host syncs and copies counted by the step counter (x and the
    plan count as device tensors: the plan arrives on the device with the batch)."""
    from pretrain.diagnostics.op_counter import StepCounter

    out: dict = {}
    for b in (4, 5):
        x = _global_batch(world, b)[rank * b : (rank + 1) * b]
        x = x.contiguous(memory_format=torch.channels_last)
        for seed in SEEDS:
            plan = shuffle_plan(seed, world, b, 2, rank=rank)
            with OpRecorder() as rec:
                encode_shuffled(x, plan, _bn)
            counter = StepCounter()
            counter.mark([x, plan.table])
            with counter:
                encode_shuffled(x, plan, _bn)
            out.setdefault(b, []).append(
                {
                    "ops": rec.ops,
                    "given_index": _index_from(rec.calls, plan.table),
                    "syncs": dict(counter.syncs),
                    "copies": dict(counter.async_copies),
                    "layout_mismatches": counter.layout_mismatches,
                    "device_ops": counter.ops,
                }
            )
    return out


def _aot_eager_keeping(graphs: list) -> functools.partial:
    """torch.compile's ``aot_eager`` backend, keeping each forward graph it runs."""

    def keep(gm: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append(gm)
        return boxed_nop(gm, inputs)

    return functools.partial(aot_eager, fw_compiler=keep)


def _collective_inputs(graphs: list) -> list[tuple[str, bool]]:
    """(collective, whether its input is plainly contiguous) for every functional collective
    of ``graphs`` (a compiled collective allocates its output plainly contiguous)."""
    return [
        (str(node.target), node.args[0].meta["val"].is_contiguous())
        for gm in graphs
        for node in gm.graph.nodes
        if str(node.target).startswith("_c10d_functional.") and "wait" not in str(node.target)
    ]


def _compiled(world: int, rank: int) -> dict:
    """The exchange compiled (one graph each way) on channels_last rows, with eager's result."""
    out = {}
    for b, splits in ((4, 2), (5, 3)):
        x = _global_batch(world, b)[rank * b : (rank + 1) * b]
        x = x.contiguous(memory_format=torch.channels_last)
        plan = shuffle_plan(SEEDS[0], world, b, splits, rank=rank)
        graphs: list = []
        backend = _aot_eager_keeping(graphs)
        mine = torch.compile(take_rows, backend=backend, fullgraph=True)(x, plan)
        images = torch.compile(restore_rows, backend=backend, fullgraph=True)(mine, plan)
        eager = take_rows(x, plan)
        out[b, splits] = {
            "mine": mine.contiguous(),
            "eager": eager.contiguous(),
            "images": images.contiguous(),
            "collectives": _collective_inputs(graphs),
        }
    return out


def _worker(rank: int, world: int, init: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    results: dict = {}
    for b, splits, channels_last, seed in CASES:
        x = _global_batch(world, b)[rank * b : (rank + 1) * b]
        x = x.contiguous(memory_format=torch.channels_last) if channels_last else x
        plan = shuffle_plan(seed, world, b, splits, rank=rank)
        mine = take_rows(x, plan)
        images = restore_rows(mine, plan)
        results[b, splits, channels_last, seed] = {
            "mine": mine.contiguous(),
            "layouts": {memory_format(t) == memory_format(x) for t in (mine, images)},
            "keys": restore_rows(mine.flatten(1), plan),  # an encoder per row
            "images": images.contiguous(),
            "bn": encode_shuffled(x, plan, _bn),
        }
    results["record"] = _record(world, rank)
    results["compiled"] = _compiled(world, rank)
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


def test_every_row_is_encoded_once_and_its_key_comes_back(exchanged):
    """Each rank gets its rows of the global batch in the plan's global order (NCHW and
    channels_last, the layout kept), the fixed split sizes of each process, and every key back
    on its row, where b divides among the processes and groups and where it does not."""
    world, ranks = exchanged
    for case in CASES:
        b, splits, _, seed = case
        batch = _global_batch(world, b)
        order = shuffle_plan(seed, world, b, splits, rank=0).global_order()
        taken = torch.cat([r[case]["mine"] for r in ranks])
        rows = (taken[:, 0, 0, 0] / 1000).long()  # which global row each encoded image is
        assert sorted(rows.tolist()) == list(range(world * b)), case
        for d, r in enumerate(ranks):
            senders = collections.Counter((rows[d * b : (d + 1) * b] // b).tolist())
            assert senders == {p: split_size(world, b, p, d) for p in range(world)}, (case, d)
            want = batch[order[d * b : (d + 1) * b]]
            torch.testing.assert_close(r[case]["mine"], want, rtol=0, atol=0)
            torch.testing.assert_close(r[case]["keys"], batch.flatten(1), rtol=0, atol=0)
            torch.testing.assert_close(r[case]["images"], batch, rtol=0, atol=0)
            assert r[case]["layouts"] == {True}, case


def _reference_bn(batch: torch.Tensor, plans: list) -> torch.Tensor:
    """One process encodes every rank's BN groups as the plans document them: rank d receives
    rank p's rows ``send_p`` cut at the split sizes, in rank order, orders them by ``arrange_d``
    and cuts them into ``splits`` groups (``tensor_split``); each key lands on its image's
    row."""
    world, b = len(plans), plans[0].b
    keys = torch.empty(world * b, batch[0].numel(), dtype=batch.dtype)
    sizes = [[split_size(world, b, p, d) for d in range(world)] for p in range(world)]
    pieces = [plans[p].send.split(sizes[p]) for p in range(world)]
    for d, plan in enumerate(plans):
        received = [p * b + int(i) for p in range(world) for i in pieces[p][d]]
        ordered = torch.tensor([received[int(j)] for j in plan.arrange])
        for rows in ordered.tensor_split(plan.splits):
            keys[rows] = _bn(batch[rows])
    return keys


def test_bn_groups_equal_one_process_computing_the_same_groups(exchanged):
    world, ranks = exchanged
    for b, splits, channels_last, seed in CASES:
        batch = _global_batch(world, b)
        plans = [shuffle_plan(seed, world, b, splits, rank=r) for r in range(world)]
        want = _reference_bn(batch, plans)
        assert not torch.equal(want, _bn(batch))  # the groups matter
        for r in ranks:
            got = r[b, splits, channels_last, seed]["bn"]
            torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_the_exchange_dispatches_the_same_ops_for_every_seed(exchanged):
    """Names, shapes, strides, dtypes and split sizes: what a graph replay needs. The split
    sizes are none where b divides among the processes, else the plan's fixed ones."""
    world, ranks = exchanged
    for rank, r in enumerate(ranks):
        for b, records in r["record"].items():
            assert records[0]["ops"] == records[1]["ops"]
            collectives = [op for op in records[0]["ops"] if op[0].startswith("c10d.")]
            assert [op[0] for op in collectives] == [
                "c10d.alltoall_base_.default",
                "c10d.allgather_.default",
            ]
            plan = shuffle_plan(SEEDS[0], world, b, 2, rank=rank)
            sizes = tuple(tuple(s or ()) for s in plan.split_sizes())
            assert collectives[0][1][3:5] == sizes
            assert (sizes == ((), ())) == (b % world == 0)


def test_the_exchange_makes_no_host_sync_and_builds_no_index(exchanged):
    """No op reads a value, every op works on the given device tensors (x, the plan), every
    index is a view of the plan's table and nothing is copied to the device during the step."""
    _, ranks = exchanged
    for r in ranks:
        for records in r["record"].values():
            for record in records:
                assert record["syncs"] == {} and record["layout_mismatches"] == []
                assert record["copies"] == {}
                assert record["device_ops"] == len(record["ops"])  # no op on a host tensor
                assert record["given_index"] and all(record["given_index"])


def test_the_compiled_exchange_moves_rows_no_collective_can_misread(exchanged):
    """Compiled (aot_eager, one graph each way) on channels_last images: the rows eager takes,
    which are the input's rows in the plan's order, and the images back in batch order; every
    collective in the graphs gets a plainly contiguous input, the layout in which a compiled
    collective allocates its output (a channels_last input would come back as NCHW bytes on
    NCCL; gloo happens to read it by its strides, so the values alone could not fail here)."""
    world, ranks = exchanged
    for d, r in enumerate(ranks):
        for (b, splits), got in r["compiled"].items():
            batch = _global_batch(world, b)
            order = shuffle_plan(SEEDS[0], world, b, splits, rank=0).global_order()
            torch.testing.assert_close(got["mine"], got["eager"], rtol=0, atol=0)
            want = batch[order[d * b : (d + 1) * b]]
            torch.testing.assert_close(got["mine"], want, rtol=0, atol=0)
            torch.testing.assert_close(got["images"], batch, rtol=0, atol=0)
            names = [name for name, _ in got["collectives"]]
            assert names == [
                "_c10d_functional.all_to_all_single.default",
                "_c10d_functional.all_gather_into_tensor.default",
            ]
            assert all(contiguous for _, contiguous in got["collectives"]), got["collectives"]


@pytest.mark.parametrize(
    ("world", "b", "splits"),
    [
        (1, 4, 1),
        (1, 6, 3),
        (1, 6, 4),
        (1, 5, 2),
        (2, 4, 1),
        (2, 4, 2),
        (2, 5, 1),
        (2, 5, 3),
        (2, 8, 4),
        (3, 4, 1),
        (3, 7, 2),
        (3, 2, 2),
        (4, 4, 2),
        (4, 8, 4),
        (4, 6, 4),
        (5, 3, 2),
    ],
)
def test_the_plan_is_a_stratified_permutation(world, b, splits):
    """Every rank's send and arrange are permutations of its b rows, the restore is the same on
    every rank and inverts the global order, rank d encodes the rows the senders' plans send it
    (their fixed split sizes), and every BN group (``tensor_split``) holds as even a share of
    every process as fits: floor or ceil of its size / world."""
    groups = [len(g) for g in torch.arange(b).tensor_split(splits)]
    sizes = [[split_size(world, b, p, d) for d in range(world)] for p in range(world)]
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
            sent = [p * b + int(i) for p in range(world) for i in plans[p].send.split(sizes[p])[d]]
            assert sorted(mine.tolist()) == sorted(sent)
            for g, rows in zip(groups, mine.split(groups), strict=True):
                share = collections.Counter((rows // b).tolist())
                counts = [share.get(p, 0) for p in range(world)]
                assert set(counts) <= {g // world, -(-g // world)}, (seed, d, share)


@pytest.mark.parametrize(("world", "b"), [(1, 5), (2, 4), (2, 5), (3, 7), (4, 6), (5, 3)])
def test_split_sizes_depend_only_on_the_sizes(world, b):
    """Every process sends b rows and every rank receives b: b // world each, one more from
    each process to the b % world ranks after it (never to itself); the all-to-all is told
    only where they differ, the same sizes for every seed."""
    q, r = divmod(b, world)
    for p in range(world):
        sends = [split_size(world, b, p, d) for d in range(world)]
        receives = [split_size(world, b, d, p) for d in range(world)]
        assert sum(sends) == sum(receives) == b
        assert [d for d in range(world) if sends[d] > q] == sorted(
            (p + 1 + k) % world for k in range(r)
        )
        assert sends[p] == q
        plans = [shuffle_plan(seed, world, b, 1, rank=p) for seed in range(3)]
        want = (receives, sends) if r else (None, None)
        assert all(plan.split_sizes() == want for plan in plans)


@pytest.mark.parametrize(("procs", "b"), [(2, 4), (4, 2), (3, 3)])
def test_one_process_groups_as_that_many_processes(procs, b):
    """One process of procs * b rows in procs BN groups draws the plan of procs processes of b
    rows each, one group each (MODEL.KEY_BN_SPLITS emulates them): the same rows, in order."""
    for seed in range(5):
        one = shuffle_plan(seed, 1, procs * b, procs, rank=0)
        many = shuffle_plan(seed, procs, b, 1, rank=0)
        assert torch.equal(one.global_order(), many.global_order())
        assert torch.equal(one.send, many.global_order())


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


def test_only_impossible_sizes_are_refused():
    with pytest.raises(ValueError, match="MODEL.KEY_BN_SPLITS"):
        shuffle_plan(0, 2, 4, 5, rank=0)  # more groups than rows
    with pytest.raises(ValueError, match="MODEL.KEY_BN_SPLITS"):
        shuffle_plan(0, 2, 4, 0, rank=0)
    with pytest.raises(ValueError, match="rank 2"):
        shuffle_plan(0, 2, 4, 1, rank=2)


def test_one_process_is_one_index_select():
    """Without a process group: the rows in ``send`` order, one gather and views; the wrong
    plan for this process, batch or device is refused (metadata only)."""
    x = _global_batch(1, 6)
    for splits in (2, 4):  # 6 rows: 3 processes' plan; a uniform random grouping
        plan = shuffle_plan(3, 1, 6, splits, rank=0)
        with OpRecorder() as rec:
            mine = take_rows(x, plan)
        assert rec.names().count("aten.index_select.default") == 1
        assert set(rec.names()) == {"aten.slice.Tensor", "aten.view.default",
                                    "aten.index_select.default"}  # fmt: skip
        torch.testing.assert_close(mine, x[plan.send], rtol=0, atol=0)
        torch.testing.assert_close(restore_rows(mine.flatten(1), plan), x.flatten(1))
        torch.testing.assert_close(encode_shuffled(x, plan, _bn), _reference_bn(x, [plan]))
    with pytest.raises(ValueError, match="rank 0 of 1"):
        take_rows(x, shuffle_plan(3, 2, 6, 1, rank=0))
    with pytest.raises(ValueError, match="4 rows"):
        take_rows(torch.zeros(4, 2), plan)
    with pytest.raises(ValueError, match="plan.to"):
        take_rows(x.to("meta"), plan)


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
