"""The `tool-dispatcher` command line: the composition root above :mod:`reconciler`,
:mod:`dispatcher` and :mod:`outbox_relay` (see :mod:`tool_dispatcher.main`)."""
