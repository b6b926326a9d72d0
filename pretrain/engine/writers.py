"""The event writers of every training tool: one list, built by :func:`build_writers`.

Pretraining, detection and the classification tools log through detectron2's ``EventStorage``;
these writers turn it into the console line (:class:`~pretrain.engine.hooks.MetricPrinter`),
``metrics.json`` and TensorBoard events (detectron2's ``JSONWriter`` and ``TensorboardXWriter``),
and, when asked (``--log-to``), a Weights & Biases run (offline unless ``WANDB_MODE`` says
otherwise) and an MLflow run (a local file store under the run directory unless
``MLFLOW_TRACKING_URI`` names another). The scalar names are listed in docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from detectron2.engine.defaults import default_writers
from detectron2.utils.events import EventStorage, EventWriter, get_event_storage

from pretrain.engine.hooks import MetricPrinter
from pretrain.utils.errors import ConfigError

__all__ = [
    "LOG_TO",
    "MlflowWriter",
    "WandbWriter",
    "add_log_to_arg",
    "build_writers",
    "check_log_to",
    "log_to_names",
    "write_scalars",
]

# ``--log-to`` choices: the optional writers and the pip package each needs
LOG_TO = {"wandb": "wandb", "mlflow": "mlflow-skinny"}
_MODULES = {"wandb": "wandb", "mlflow": "mlflow"}


def add_log_to_arg(parser: argparse.ArgumentParser) -> None:
    """``--log-to wandb,mlflow``: the optional writers, the same option in every tool."""
    parser.add_argument(
        "--log-to", default="", metavar="WRITERS",
        help="besides TensorBoard events and metrics.json, log the scalars to wandb (offline "
        "unless WANDB_MODE says otherwise) and/or mlflow (a file store <output>/mlruns unless "
        "MLFLOW_TRACKING_URI is set), comma-separated: wandb,mlflow",
    )  # fmt: skip


def log_to_names(text: str) -> tuple[str, ...]:
    """``--log-to``'s comma-separated writers (``"wandb,mlflow"``), checked
    (:func:`check_log_to`: each tool calls this before it writes anything)."""
    names = tuple(dict.fromkeys(w.strip() for w in text.split(",") if w.strip()))
    check_log_to(names)
    return names


def check_log_to(log_to: Sequence[str]) -> None:
    """A :class:`ConfigError` naming the pip package when an optional writer asked for is not
    installed (run before anything is written)."""
    for name in log_to:
        if name not in LOG_TO:
            raise ConfigError(f"--log-to {name}: choose from {', '.join(LOG_TO)}")
        if importlib.util.find_spec(_MODULES[name]) is None:
            raise ConfigError(
                f"--log-to {name}: the {name} package is not installed; pip install "
                f"{LOG_TO[name]}, or leave {name} out of --log-to"
            )


class _NewScalars(EventWriter):
    """Hands each iteration's scalars not yet written to :meth:`_log`, in iteration order, with
    the values the TensorBoard writer writes (median of the window where a scalar asks for
    smoothing). Hand-written, as detectron2 has no W&B or MLflow writer; the loop is
    ``JSONWriter.write``'s."""

    def __init__(self, window_size: int = 20) -> None:
        self._window_size = window_size
        self._last_write = -1

    def write(self) -> None:
        by_iter: dict[int, dict[str, float]] = defaultdict(dict)
        latest = get_event_storage().latest_with_smoothing_hint(self._window_size)
        for key, (value, it) in latest.items():
            if it > self._last_write:
                by_iter[it][key] = float(value)
        for it in sorted(by_iter):
            self._log(it, by_iter[it])
            self._last_write = it

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        raise NotImplementedError


class WandbWriter(_NewScalars):
    """The scalars as a W&B run in ``output_dir/wandb`` (offline mode unless ``WANDB_MODE`` is
    set: no network; ``wandb sync`` uploads it later)."""

    def __init__(
        self, output_dir: str, name: str = "", config: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        import wandb

        os.makedirs(output_dir, exist_ok=True)
        self._run = wandb.init(
            dir=output_dir,
            name=name or os.path.basename(os.path.abspath(output_dir)),
            config=dict(config or {}),
            mode=os.environ.get("WANDB_MODE", "offline"),
            reinit="create_new",  # one run per training (the semi-supervised sweep has several)
        )

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def close(self) -> None:
        self._run.finish()


class MlflowWriter(_NewScalars):
    """The scalars as an MLflow run, in ``MLFLOW_TRACKING_URI`` if set, else in a local file
    store ``output_dir/mlruns`` (no server)."""

    def __init__(
        self, output_dir: str, name: str = "", config: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__()
        from mlflow.tracking import MlflowClient

        uri = os.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            uri = "file:" + os.path.join(os.path.abspath(output_dir), "mlruns")
            # MLflow 3 refuses its file store unless opted in; it is the one local store that
            # needs neither a server nor SQLAlchemy (which mlflow-skinny does not install)
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME", "lorac")
        found = self._client.get_experiment_by_name(experiment)
        exp_id = found.experiment_id if found else self._client.create_experiment(experiment)
        run_name = name or os.path.basename(os.path.abspath(output_dir))
        self.run_id = self._client.create_run(exp_id, run_name=run_name).info.run_id
        for key, value in _flat(config or {}).items():
            self._client.log_param(self.run_id, key, str(value)[:500])

    def _log(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._client.log_metric(self.run_id, key, value, step=step)

    def close(self) -> None:
        self._client.set_terminated(self.run_id)


def _flat(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"SOLVER": {"LR": 1}}`` -> ``{"SOLVER.LR": 1}`` (MLflow's parameters are flat)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


_OPTIONAL = {"wandb": WandbWriter, "mlflow": MlflowWriter}


def build_writers(
    output_dir: str,
    max_iter: int | None = None,
    log_to: Sequence[str] = (),
    *,
    name: str = "",
    config: Mapping[str, Any] | None = None,
    console: bool = True,
) -> list[EventWriter]:
    """The writers of every training tool: detectron2's ``default_writers`` (``metrics.json``,
    TensorBoard events in ``output_dir``) with :class:`MetricPrinter` as the console printer
    (``console``), and the optional writers named in ``log_to`` (``name``: the run's name there,
    ``config``: its parameters)."""
    check_log_to(log_to)
    writers: list[EventWriter] = [MetricPrinter(max_iter)] if console else []
    writers += default_writers(output_dir, max_iter)[1:]
    writers += [_OPTIONAL[n](output_dir, name, config) for n in dict.fromkeys(log_to)]
    return writers


def write_scalars(
    output_dir: str,
    scalars: Mapping[str, float],
    iteration: int = 0,
    log_to: Sequence[str] = (),
    *,
    name: str = "",
    config: Mapping[str, Any] | None = None,
) -> None:
    """``scalars`` at ``iteration`` through the writers of :func:`build_writers` (no console
    line), for what has no training loop: the kNN evaluation, the transfer harness's scores."""
    writers = build_writers(output_dir, None, log_to, name=name, config=config, console=False)
    with EventStorage(iteration):
        get_event_storage().put_scalars(**scalars, smoothing_hint=False)
        for writer in writers:
            writer.write()
            writer.close()
