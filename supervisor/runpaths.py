"""Where a run lives on its host: workdir, output dir, log, lock and fingerprint sidecars."""

from __future__ import annotations

import os
import posixpath

from supervisor.agent.protocol import FINGERPRINT_NAME, LOCK_NAME, SIDECAR_DIR
from supervisor.config import Config, RunConfig


def _host_path(hc_local: bool, path: str) -> str:
    return os.path.expanduser(path) if hc_local else path


def run_paths(config: Config, run: RunConfig) -> dict[str, str]:
    """Paths of a run on its host: workdir, output dir, lock, fingerprint sidecar, log."""
    hc = config.host(run.host)
    workdir = _host_path(hc.local, run.workdir)
    out = posixpath.normpath(posixpath.join(workdir, _host_path(hc.local, run.output_dir)))
    side = posixpath.join(out, SIDECAR_DIR)
    log = (
        posixpath.join(workdir, _host_path(hc.local, run.log))
        if run.log
        else posixpath.join(side, "run.log")
    )
    return {"workdir": workdir, "out": out, "log": posixpath.normpath(log)}


def run_sidecars(config: Config, run: RunConfig) -> tuple[list[str], dict[str, str]]:
    """(lock files, fingerprint file per dataset) of a run, in ``<out>/.runwatch/``.

    One lock per dataset (``<dataset>.lock``), so that two runs sharing an output dir never block
    each other while two writers of one dataset can never both start; one fingerprint per dataset
    (``<dataset>.launch.json``), so that a change of model or sampling is caught even when another
    run writes the dataset next. A run whose datasets are unknown uses ``run.lock`` and
    ``launch.json``.
    """
    side = posixpath.join(run_paths(config, run)["out"], SIDECAR_DIR)
    datasets = config.run_datasets(run)
    if not datasets:
        return [posixpath.join(side, LOCK_NAME)], {"*": posixpath.join(side, FINGERPRINT_NAME)}
    locks = [posixpath.join(side, f"{ds}.lock") for ds in datasets]
    return locks, {ds: posixpath.join(side, f"{ds}.launch.json") for ds in datasets}
