"""``python -m benchmarks``: run the speed and coverage benchmarks and update BENCHMARKS.md."""

from benchmarks.run import main

raise SystemExit(main())
