"""The synchronised BatchNorm: two processes equal one BatchNorm over the whole batch.

Two CPU processes (gloo), each with half of a batch, against ``nn.BatchNorm2d`` on the whole
batch in one process: the outputs, the input gradients, the running statistics and the sum of
the processes' weight and bias gradients (what DDP's all-reduce forms) agree to float32
rounding, for NCHW and channels_last inputs, and the collectives keep one layout.
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from pretrain.modeling.encoder import convert_norm
from pretrain.modeling.norm import (
    BatchNorm2d,
    SyncBatchNorm,
    add_counted_batches,
    convert_batchnorm,
)

C = 5


def _data(channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, C, 6, 7, generator=g) * 3 + torch.arange(C).view(1, C, 1, 1)
    upstream = torch.randn(8, C, 6, 7, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, upstream


def _reference(channels_last: bool) -> dict[str, torch.Tensor]:
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(C)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    nn.init.uniform_(bn.bias, -0.5, 0.5)
    x, upstream = _data(channels_last)
    x.requires_grad_(True)
    y = bn(x)
    (y * upstream).sum().backward()
    return {
        "y": y.detach(),
        "dx": x.grad,
        "dw": bn.weight.grad,
        "db": bn.bias.grad,
        "mean": bn.running_mean,
        "var": bn.running_var,
    }


def _whole_batch(rank: int, world: int, channels_last: bool) -> dict:
    """This process's half of the batch through SyncBN; the outputs and input gradients
    gathered from every process, the summed weight and bias gradients."""
    torch.manual_seed(1)
    bn = convert_batchnorm(nn.BatchNorm2d(C), SyncBatchNorm)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    nn.init.uniform_(bn.bias, -0.5, 0.5)
    x, upstream = _data(channels_last)
    share = slice(rank * 4, (rank + 1) * 4)
    x = x[share].detach().requires_grad_(True)
    y = bn(x)
    (y * upstream[share]).sum().backward()
    grads = torch.cat([bn.weight.grad, bn.bias.grad])
    dist.all_reduce(grads)
    ys = [torch.empty_like(y.detach().contiguous()) for _ in range(world)]
    dist.all_gather(ys, y.detach().contiguous())
    dxs = [torch.empty_like(x.grad.contiguous()) for _ in range(world)]
    dist.all_gather(dxs, x.grad.contiguous())
    return {
        "y": torch.cat(ys),
        "dx": torch.cat(dxs),
        "dw": grads[:C],
        "db": grads[C:],
        "mean": bn.running_mean,
        "var": bn.running_var,
        "y_channels_last": y.is_contiguous(memory_format=torch.channels_last),
        "tracked": int(bn.num_batches_tracked),
    }


def _worker(rank: int, init: str, out: str) -> None:
    """One of the two gloo processes: both checks' results, saved to ``out.<rank>``."""
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    torch.set_num_threads(1)
    whole = {channels_last: _whole_batch(rank, 2, channels_last) for channels_last in (False, True)}
    torch.save({"whole_batch": whole, "compiled": _compiled_cases(rank)}, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory) -> list[dict]:
    """Each process's results (rank order); one pair of processes for the module's checks."""
    tmp = tmp_path_factory.mktemp("sync_bn")
    out = tmp / "out.pt"
    mp.spawn(_worker, args=(f"file://{tmp / 'rendezvous'}", str(out)), nprocs=2, join=True)
    return [torch.load(f"{out}.{rank}") for rank in range(2)]


@pytest.mark.parametrize("channels_last", [False, True])
def test_two_processes_equal_batchnorm_on_the_whole_batch(two_processes, channels_last):
    got = two_processes[0]["whole_batch"][channels_last]
    want = _reference(channels_last)
    for key in ("y", "dx", "dw", "db", "mean", "var"):
        torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-5, msg=key)
    assert got["y_channels_last"] == channels_last
    assert got["tracked"] == 0  # the forward does not count itself: its owner adds the count


def test_one_process_and_eval_mode_are_plain_batchnorm():
    """Without a process group (and in eval mode) the module is nn.BatchNorm2d itself."""
    torch.manual_seed(0)
    plain = nn.BatchNorm2d(C)
    synced = convert_batchnorm(nn.BatchNorm2d(C), SyncBatchNorm)
    synced.load_state_dict(plain.state_dict())
    x = torch.randn(4, C, 3, 3)
    torch.testing.assert_close(synced(x), plain(x), rtol=0, atol=0)
    synced.eval(), plain.eval()
    torch.testing.assert_close(synced(x), plain(x), rtol=0, atol=0)


def test_convert_norm_keeps_the_state_and_replaces_every_bn():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, C, 1), nn.BatchNorm2d(C), nn.Sequential(nn.BatchNorm2d(C)))
    net[1].running_mean.fill_(0.5)
    state = {k: v.clone() for k, v in net.state_dict().items()}
    converted = convert_norm(net, "SyncBN")
    assert sum(isinstance(m, SyncBatchNorm) for m in converted.modules()) == 2
    assert not any(type(m) is nn.BatchNorm2d for m in converted.modules())
    for k, v in converted.state_dict().items():
        torch.testing.assert_close(v, state[k], rtol=0, atol=0)


def test_counted_batchnorm_equals_batchnorm_and_adds_its_counts_in_one_op():
    """The encoders' BatchNorm2d: the same outputs and state as nn.BatchNorm2d once its owner
    adds the forwards it made, with one device op for all layers instead of one per layer and
    call; the forward changes no Python state (a compiled forward would recompile for it)."""
    import copy

    from torch.utils._python_dispatch import TorchDispatchMode

    class _Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    plain = nn.Sequential(nn.BatchNorm2d(C), nn.ReLU(), nn.BatchNorm2d(C))
    counted = convert_batchnorm(copy.deepcopy(plain))
    assert all(type(m) is BatchNorm2d for m in counted if isinstance(m, nn.BatchNorm2d))
    x = torch.randn(4, C, 3, 3)
    for _ in range(3):
        torch.testing.assert_close(counted(x), plain(x), rtol=0, atol=0)
    before = {k: v for k, v in vars(counted[0]).items() if not k.startswith("_")}
    with _Ops() as ops:
        counted(x)
    assert not any("add_" in name for name in ops.names)  # no per-layer counter add
    assert {k: v for k, v in vars(counted[0]).items() if not k.startswith("_")} == before
    plain(x)
    with _Ops() as ops:
        add_counted_batches((counted, 4))
    assert ops.names == ["aten._foreach_add_.Scalar"]
    for (k, a), b in zip(counted.state_dict().items(), plain.state_dict().values(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=k)
    assert int(counted[0].num_batches_tracked) == 4


STEPS = 3
CASES = [(autocast, channels_last) for autocast in (False, True) for channels_last in (False, True)]


def _compiled_cases(rank: int) -> list[dict]:
    """Per case: STEPS training forwards and backwards of conv -> SyncBN -> ReLU, eager and
    compiled (aot_eager, whole graph), from the same state, on the same batches."""
    from torch._dynamo.testing import CompileCounterWithBackend

    results = []
    for autocast, channels_last in CASES:
        torch.compiler.reset()
        torch.manual_seed(0)
        bn = convert_batchnorm(nn.BatchNorm2d(C), SyncBatchNorm)
        nn.init.uniform_(bn.weight, 0.5, 1.5)
        nn.init.uniform_(bn.bias, -0.5, 0.5)
        eager = nn.Sequential(nn.Conv2d(3, C, 3), bn, nn.ReLU())
        fmt = torch.channels_last if channels_last else torch.contiguous_format
        eager.to(memory_format=fmt)
        nets = {"eager": eager, "compiled": copy.deepcopy(eager)}
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(nets["compiled"], fullgraph=True, backend=counter)
        calls = {"eager": eager, "compiled": compiled}
        g = torch.Generator().manual_seed(rank)
        batches = [torch.randn(4, 3, 8, 8, generator=g) * 2 + rank + step for step in range(STEPS)]
        got = {}
        for name, call in calls.items():
            net, steps = nets[name], []
            for x in batches:
                net.zero_grad(set_to_none=True)
                x = x.contiguous(memory_format=fmt).requires_grad_(True)
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    y = call(x)
                (y.float() * torch.linspace(-1, 1, y.numel()).view(y.shape)).sum().backward()
                steps.append([y.detach(), x.grad] + [p.grad for p in net.parameters()])
            got[name] = {
                "steps": steps,
                "buffers": [b.clone() for b in net.buffers()],
                "layout": (y.dtype, y.is_contiguous(memory_format=fmt)),
            }
        got["frames"] = counter.frame_count
        results.append(got)
    return results


def test_compiled_sync_batchnorm_equals_eager_in_one_graph(two_processes):
    """Two gloo processes, float32 and bfloat16 autocast, NCHW and channels_last: compiled whole
    (torch.compile fullgraph, aot_eager), conv -> SyncBN -> ReLU gives eager's outputs, input
    and parameter gradients at each of three steps, and eager's running statistics (updated by
    the compiled graph) and num_batches_tracked after them; one graph, not recompiled."""
    for rank in range(2):
        for (autocast, channels_last), got in zip(
            CASES, two_processes[rank]["compiled"], strict=True
        ):
            case = f"rank {rank}, autocast {autocast}, channels_last {channels_last}"
            assert got["frames"] == 1, case  # one graph for the three calls
            eager, compiled = got["eager"], got["compiled"]
            dtype = torch.bfloat16 if autocast else torch.float32
            assert compiled["layout"] == eager["layout"] == (dtype, True), case
            for step, (want, have) in enumerate(
                zip(eager["steps"], compiled["steps"], strict=True)
            ):
                for i, (a, b) in enumerate(zip(want, have, strict=True)):
                    torch.testing.assert_close(
                        b, a, rtol=0, atol=0, msg=f"{case}, step {step}, {i}"
                    )
            for a, b in zip(eager["buffers"], compiled["buffers"], strict=True):
                torch.testing.assert_close(b, a, rtol=0, atol=0, msg=case)
            assert int(compiled["buffers"][-1]) == 0  # num_batches_tracked: its owner adds it


def test_sync_batchnorm_runs_where_compile_traces_it_on_cuda(tmp_path):
    """Every op of the training forward has a meta kernel, on (fake) CUDA tensors too: torch's
    fused SyncBN kernels (batch_norm_stats, ..._gather_stats_with_counts, ..._elemt and the
    backward's two) have none, and a compiled graph would run them through FakeTensor's unsafe
    fallback, which is off here. The forward runs on this CPU machine; the backward needs the
    autograd engine on a real CUDA device."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rdv'}", rank=0, world_size=1)
    try:
        with FakeTensorMode(allow_fallback_kernels=False):
            bn = SyncBatchNorm(C, device="cuda")
            x = torch.randn(4, C, 3, 3, device="cuda", dtype=torch.bfloat16)
            y = bn(x.contiguous(memory_format=torch.channels_last))
        assert (y.device.type, y.dtype, bn.running_var.dtype) == ("cuda", x.dtype, torch.float32)
    finally:
        dist.destroy_process_group()
