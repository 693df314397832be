"""``python -m dispatcher.testing.sandbox --host H --port P [--database-url URL]``."""

from dispatcher.testing.sandbox.command import main

raise SystemExit(main())
