"""``python -m slawatch``: the same as the ``slawatch`` command."""

from __future__ import annotations

from slawatch.cli import main

raise SystemExit(main())
