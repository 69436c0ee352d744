"""The last lines of a run's log on its host (for a live log pane), with secrets masked."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from supervisor.agent.masking import mask_text
from supervisor.runenv import known_secrets
from supervisor.runpaths import run_paths

if TYPE_CHECKING:
    from supervisor.engine import Engine


async def tail_log(engine: Engine, run_name: str, lines: int = 50) -> dict[str, Any]:
    """The last ``lines`` of a run's log on its host: ``{"path", "exists", "size", "lines"}``.

    Key-shaped tokens and every endpoint's API key (when set here) are masked.
    """
    config = engine.config
    run = config.run(run_name)
    secrets = known_secrets(config)
    path = run_paths(config, run)["log"]
    reply: dict[str, Any] = await engine.host(run.host).request(
        "tail_log", {"path": path, "lines": int(lines)}
    )
    reply["lines"] = [mask_text(str(line), secrets) for line in reply.get("lines") or []]
    return reply
