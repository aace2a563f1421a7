"""``python -m benchmarks``: the whole suite (see run.py for the options)."""

from benchmarks.run import main

raise SystemExit(main())
