from __future__ import annotations

from slurmddp.cli import main

raise SystemExit(main())
