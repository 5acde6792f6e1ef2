"""``python -m benchmarks``: run the capture, inspection, probing and training benchmarks and update BENCHMARKS.md
(``--no-*`` skips one; the streaming benchmark has its own script)."""

from benchmarks.run import main

raise SystemExit(main())
