"""``python -m stormguard``: the ``stormguard`` command."""

from __future__ import annotations

from stormguard.cli import main

raise SystemExit(main())
