"""``python -m tool_dispatcher`` is the `tool-dispatcher` command."""

from tool_dispatcher.main import main

raise SystemExit(main())
