"""Optional parts: what a feature needs that a plain ``pip install runwatch`` leaves out.

Counting tokens with a Hugging Face tokenizer needs the ``tokens`` extra (transformers,
tokenizers); the demo's mock servers and tokenizer need the ``demo`` extra (uvicorn, starlette,
tokenizers). ``make`` installs both.
"""

from __future__ import annotations

import importlib
import types

from supervisor.errors import RunwatchError


def require(module: str, feature: str, extra: str) -> types.ModuleType:
    """Import ``module`` for ``feature``, or say which extra of runwatch brings it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = module.split(".")[0]
        raise RunwatchError(
            f"{feature} needs the Python package {package}, which is not installed ({e})",
            f"install it with: pip install 'runwatch[{extra}]'",
        ) from None
