"""``python -m dispatcher`` is the `tool-dispatcher` command."""

from dispatcher.cli.main import main

raise SystemExit(main())
