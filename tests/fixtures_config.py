"""Config files for tests that run on this machine: one local host named ``here``.

- ``write_local_config(path, body, top="", python=False)``: top-level keys, the ``here`` host
  table (with ``python`` set to the test interpreter when asked), then ``body`` (the runs,
  datasets and endpoints of the test, as TOML text).
- ``write_api_run_config(tmp_path, url, dataset, ...)``: demo prompts for one dataset and a run
  ``api-run`` of it against an API endpoint ``api`` at ``url``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from supervisor.demo.prompts import write_prompts


def write_local_config(path: Path, body: str, *, top: str = "", python: bool = False) -> Path:
    """Write a config whose one host is this machine (``here``) and return ``path``."""
    host = '[[hosts]]\nname = "here"\nlocal = true\n'
    if python:
        host += f"python = {json.dumps(sys.executable)}\n"
    path.write_text(f"{top.strip()}\n\n{host}{body}")
    return path


def write_api_run_config(
    tmp_path: Path, url: str, dataset: str, *, prompts: int, token_budget: int, endpoint: str
) -> Path:
    """``<tmp>/runwatch.toml``: run ``api-run`` in ``<tmp>/work`` writing ``dataset`` (with
    ``prompts`` demo prompts) through endpoint ``api`` at ``url``; ``endpoint`` adds its keys."""
    work = tmp_path / "work"
    write_prompts(work / "prompts", [dataset], count=prompts)
    return write_local_config(
        tmp_path / "runwatch.toml",
        f"""
[[runs]]
name = "api-run"
host = "here"
workdir = "{work}"
argv = ["python3", "run_inference.py", "--datasets", "{dataset}"]
endpoint = "api"
[datasets.{dataset}]
token_budget = {token_budget}
prompts = "prompts/{dataset}.jsonl"
[[endpoints]]
name = "api"
kind = "api"
base_url = "{url}"
{endpoint.strip()}
""",
    )
