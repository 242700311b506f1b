from __future__ import annotations

from slurmddp.cli.main import main

raise SystemExit(main())
