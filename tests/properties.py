"""How many examples a property test (hypothesis) tries: two profiles, chosen by the
``HYPOTHESIS_PROFILE`` environment variable.

- ``unit``, the default (``make test-fast``, a bare ``pytest``): at most ``UNIT_EXAMPLES`` examples
  per test and no deadline, so that the unit tier stays a quick loop on a loaded machine.
- ``long`` (``make test`` sets ``HYPOTHESIS_PROFILE=long``): every test its own count, given as
  ``@settings(max_examples=examples(n))``, and hypothesis's default of 100 (and its deadline) for a
  test that names none.

``tests/conftest.py`` loads the profile; a test module that calls :func:`examples` imports this
module, which registers both profiles first.
"""

from __future__ import annotations

import os

from hypothesis import settings

UNIT_EXAMPLES = 30
PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "unit")

settings.register_profile("unit", max_examples=UNIT_EXAMPLES, deadline=None)
settings.register_profile("long", max_examples=100)
if PROFILE not in ("unit", "long"):
    raise RuntimeError(f"HYPOTHESIS_PROFILE={PROFILE!r}: the test profiles are 'unit' and 'long'")


def examples(n: int) -> int:
    """A property test's ``max_examples``: ``n`` under the long profile, at most
    ``UNIT_EXAMPLES`` under the unit profile."""
    return n if PROFILE == "long" else min(n, UNIT_EXAMPLES)


def load() -> None:
    """Make the chosen profile hypothesis's default settings."""
    settings.load_profile(PROFILE)
