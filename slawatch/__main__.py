from __future__ import annotations

from slawatch.cli import main

raise SystemExit(main())
