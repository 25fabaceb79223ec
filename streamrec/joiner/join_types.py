"""The values the joiner's ``join.*`` config keys may take, as ``typing.Literal`` aliases.

The joiner checks a value against ``typing.get_args`` of its alias here; ``streamrec.foundation.config``
annotates its fields with the same aliases and validates them at load time. This module imports only the
standard library: it is the one piece of the joiner the foundation may import (an ``ignore_imports`` entry
in pyproject.toml's import-linter contracts).
"""

from __future__ import annotations

from typing import Literal

JoinMode = Literal["window", "fake_negative"]
"""``join.mode``: ``window`` emits one example per impression (a positive when its action arrives inside the
attribution window, a negative once the window has closed in event time); ``fake_negative`` emits every
impression at once as a negative and again as a positive when its action arrives."""
