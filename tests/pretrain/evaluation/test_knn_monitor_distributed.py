"""The kNN monitor on several processes: each embeds its share, the main process gathers.

Two CPU processes (gloo, detectron2's ``launch``) against one process on the same images and the
same weights: the gathered features must be the single-process ones bit for bit (the same
batches through the same float32 kernels, one thread each), so the kNN top-1 is equal too.
"""

from __future__ import annotations

import json
import logging
import socket
from datetime import timedelta
from pathlib import Path

import pytest
import torch
from detectron2.engine import launch
from detectron2.utils import comm
from torch.nn.parallel import DistributedDataParallel

from pretrain.config import load_config
from pretrain.engine.trainer import PretrainTrainer
from pretrain.evaluation.features import batch_shards, gather_embeddings
from pretrain.evaluation.knn_monitor import KNNHook, build_knn_hook
from pretrain.modeling import build_model
from tests.helpers import make_image_folder, tiny_opts
from transfer.classification.demo import DEMO_CONFIG


@pytest.mark.parametrize(
    ("counts", "batch_size", "world"),
    [
        ([20, 14], 4, 2),
        ([10000, 5000], 256, 8),  # IN-1K's monitor: 40 + 20 batches
        ([1000, 5000], 256, 8),  # IN-100's: 4 + 20 batches, fewer references than processes
        ([7], 3, 1),
        ([0, 4], 4, 2),
        ([5, 1], 8, 3),
    ],
)
def test_batch_shards_deal_out_whole_batches_in_order(counts, batch_size, world):
    """Proves each set's shares put back together in rank order are range(count), every share
    is a run of whole batches of the single-process batching (it starts at a multiple of
    batch_size, only a set's last share may end in its short batch), and the processes' batch
    counts over all sets differ by at most one."""
    shares = [batch_shards(counts, batch_size, r, world) for r in range(world)]
    per_process = [0] * world
    for i, n in enumerate(counts):
        assert [j for r in range(world) for j in shares[r][i]] == list(range(n))
        for r in range(world):
            s = shares[r][i]
            per_process[r] += -(-len(s) // batch_size)
            if len(s):
                assert s.start % batch_size == 0
                assert len(s) % batch_size == 0 or s.stop == n
    assert max(per_process) - min(per_process) <= 1, per_process


def test_batch_shards_reject_a_rank_outside_the_world():
    with pytest.raises(ValueError, match="rank"):
        batch_shards([10], 4, 2, 2)


def test_one_process_features_are_the_loaders_in_order_with_their_time():
    """Proves gather_embeddings in one process (no collective) returns each loader's features
    and labels in order, and one embedding time."""
    x = torch.arange(12.0).reshape(6, 2)
    y = torch.arange(6)
    loaders = [[(x[:4], y[:4]), (x[4:], y[4:])], [(x[:2], y[:2])]]
    got = gather_embeddings(lambda images: 2 * images, loaders)
    assert got is not None and len(got.seconds) == 1 and got.seconds[0] >= 0
    (train_x, train_y), (test_x, test_y) = got.sets
    assert torch.equal(train_x, 2 * x) and torch.equal(train_y, y)
    assert torch.equal(test_x, 2 * x[:2]) and torch.equal(test_y, y[:2])


KNN = {
    "TEST.KNN_PERIOD": 2,
    # 24 train images -> 20 references = 5 batches of 4; 15 val images -> 14 queries = batches
    # of 4, 4, 4, 2: 9 batches, 4 references' to the first process, the other 5 to the second
    # (uneven shares, a set split between processes, a short last batch)
    "TEST.KNN_TRAIN_IMAGES": 20,
    "TEST.KNN_TEST_IMAGES": 14,
    "TEST.KNN_BATCH_SIZE": 4,
    "TEST.KNN_K": 5,
    "DATALOADER.NUM_WORKERS": 1,  # the monitor's loaders start a worker on each process
}


def _embed(opts: list[str], out: str) -> None:
    """One process of the comparison: the trainer's model (DDP-wrapped on two processes, in
    train mode), the trainer's normalisation, the hook; saves what this process saw and got."""
    torch.set_num_threads(1)
    cfg = load_config(DEMO_CONFIG, opts)
    world = comm.get_world_size()
    torch.manual_seed(0)
    model = build_model(cfg, world)
    model.train()
    wrapped, ddp_forwards = model, []
    if world > 1:
        wrapped = DistributedDataParallel(model, broadcast_buffers=False)
        wrapped.register_forward_pre_hook(lambda *_: ddp_forwards.append(1))
    embedded = []  # batch sizes the backbone saw on this process
    model.encoder_q.backbone.register_forward_pre_hook(
        lambda _, args: embedded.append(args[0].shape[0])
    )
    hook = build_knn_hook(cfg, wrapped)
    gathered = hook.features()
    embedded_once = list(embedded)
    top1 = hook.compute()
    torch.save(
        {
            "sets": None if gathered is None else gathered.sets,
            "seconds": None if gathered is None else gathered.seconds,
            "top1": top1,
            "embedded": embedded_once,
            "ddp_forwards": len(ddp_forwards),
            "training": (model.training, model.encoder_q.backbone.training),
        },
        Path(out) / f"rank{comm.get_rank()}_of_{world}.pt",
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pretrain(opts: list[str]) -> None:
    torch.set_num_threads(1)
    PretrainTrainer(load_config(DEMO_CONFIG, opts)).train()


def _both(embed_opts: list[str], out: str, pretrain_opts: list[str]) -> None:
    """Both 2-process checks, one after the other in one pair of processes."""
    _embed(embed_opts, out)
    _pretrain(pretrain_opts)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> dict:
    """The monitor alone (``_embed``) and a 2-process pretraining run with it, each on its own
    generated images, in one launch of two processes (each start costs seconds)."""
    tmp = tmp_path_factory.mktemp("knn")
    labelled = tmp / "labelled"
    make_image_folder(labelled / "train", classes=3, per_class=8)
    make_image_folder(labelled / "val", classes=3, per_class=5)
    knn = {**KNN, "TEST.KNN_ROOT": str(labelled)}
    data = make_image_folder(tmp / "data", classes=2, per_class=4)
    embed = tiny_opts(data, tmp / "embed_run", **knn)
    # the final checkpoint only: none of the periodic ones is read here
    pretrain_data = make_image_folder(tmp / "pretrain_data", classes=2, per_class=8)
    run = tmp / "run"
    pretrain = tiny_opts(pretrain_data, run, **knn, **{"SOLVER.CHECKPOINT_PERIOD": 100})
    out = tmp / "results"
    out.mkdir()
    launch(
        _both,
        2,
        dist_url=f"tcp://127.0.0.1:{_free_port()}",
        args=(embed, str(out), pretrain),
        timeout=timedelta(minutes=2),
    )
    return {"embed_opts": embed, "results": out, "run": run}


@pytest.mark.processes  # make test-processes
def test_two_processes_gather_the_one_process_features_and_top1(two_processes):
    """Proves the 2-process monitor (each process embedding its own share with a loader worker,
    the DDP-wrapped model, NaiveSyncBN in eval mode) gathers on the main process exactly the
    features and labels one process computes, in the original order, and the same kNN top-1;
    each process embedded only its share (4 and 1 + 4 batches: uneven, so a collective inside
    the backbone would have hung until the 2-minute timeout); DDP's forward never ran;
    train mode is restored; the other process gets None."""
    out = two_processes["results"]
    _embed(two_processes["embed_opts"], str(out))  # one process, here
    one = torch.load(out / "rank0_of_1.pt")
    main, other = (torch.load(out / f"rank{r}_of_2.pt") for r in range(2))

    assert one["embedded"] == [4, 4, 4, 4, 4, 4, 4, 4, 2]  # 20 references, 14 queries
    assert main["embedded"] == [4, 4, 4, 4] and other["embedded"] == [4, 4, 4, 4, 2]
    (ref_x, ref_y), (query_x, query_y) = one["sets"]
    assert ref_x.shape[0] == 20 and query_x.shape[0] == 14
    for (x, y), (x1, y1) in zip(main["sets"], one["sets"], strict=True):
        assert torch.equal(y, y1)
        assert torch.equal(x, x1), (x - x1).abs().max()
    assert main["top1"] == one["top1"] and 0.0 <= one["top1"] <= 1.0
    assert len(main["seconds"]) == 2
    assert other["sets"] is None and other["top1"] is None
    assert main["ddp_forwards"] == 0 and other["ddp_forwards"] == 0
    assert main["training"] == other["training"] == one["training"] == (True, True)


class _Trainer:
    """What the hook reads of a trainer: the event storage and the iteration counters."""

    def __init__(self) -> None:
        from detectron2.utils.events import EventStorage

        self.storage = EventStorage(0)
        self.iter, self.max_iter = 0, 1


def test_the_log_line_gives_the_cost_and_a_long_wait_is_a_warning(caplog, monkeypatch):
    """Proves the hook logs images, processes, time and the wait at the gather, and warns
    naming the keys when a process waited more than half of DIST.TIMEOUT_MINUTES (here a
    fabricated 2-process timing: 400 s and 10 s of work against a 10-minute timeout)."""
    x, y = torch.randn(8, 3), torch.arange(8) % 2
    loader = [(x, y)]

    def hook(timeout_minutes: float) -> KNNHook:
        knn = KNNHook(1, lambda b: b, loader, loader, 2, k=3, timeout_minutes=timeout_minutes)
        knn.trainer = _Trainer()
        return knn

    with caplog.at_level(logging.INFO, logger="pretrain.evaluation.knn_monitor"):
        hook(10).after_train()
    assert "8 references + 8 queries on 1 process(es)" in caplog.text
    assert "longest wait at the gather 0.0 s" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    import pretrain.evaluation.knn_monitor as monitor

    real = monitor.gather_embeddings

    def two_processes(feature_fn, loaders):
        got = real(feature_fn, loaders)
        return got._replace(seconds=[400.0, 10.0])

    monkeypatch.setattr(monitor, "gather_embeddings", two_processes)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pretrain.evaluation.knn_monitor"):
        hook(10).after_train()
    (warning,) = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert "waiting 390 s" in warning.getMessage()
    for key in ("DIST.TIMEOUT_MINUTES", "TEST.KNN_TRAIN_IMAGES", "DATALOADER.NUM_WORKERS"):
        assert key in warning.getMessage()
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="pretrain.evaluation.knn_monitor"):
        hook(14).after_train()  # 390 s < half of 14 min: no warning
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.processes  # make test-processes
def test_two_process_pretraining_writes_knn_every_period_and_at_the_end(two_processes):
    """Proves the monitor inside a 2-process DDP pretraining run (its gather between the
    trainer's own collectives, every process embedding its share with a loader worker) ends
    and writes knn/top1 after iterations 2 and 4 and after training, from the main process."""
    out = two_processes["run"]
    rows = [json.loads(line) for line in (out / "metrics.json").read_text().splitlines()]
    records = [(r["iteration"], r["knn/top1"]) for r in rows if "knn/top1" in r]
    assert [it for it, _ in records] == [1, 3, 6], records
    assert all(abs(top1 * 14 - round(top1 * 14)) < 1e-6 for _, top1 in records)  # 14 queries
