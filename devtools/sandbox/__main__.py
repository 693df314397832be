"""``python -m devtools.sandbox --host H --port P [--database-url URL]``."""

from devtools.sandbox.command import main

raise SystemExit(main())
