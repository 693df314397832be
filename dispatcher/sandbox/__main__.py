"""``python -m dispatcher.sandbox --host H --port P [--database-url URL]``."""

from dispatcher.sandbox.command import main

raise SystemExit(main())
