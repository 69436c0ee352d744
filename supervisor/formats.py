"""Record formats as profiles (placeholder: the dataset-engine work fills this in)."""

from __future__ import annotations

BUILTIN_FORMATS = ("raw", "raw-legacy", "specforge", "modelopt", "speculators")
