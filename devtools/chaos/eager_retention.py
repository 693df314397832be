"""``python -m devtools.chaos.eager_retention <command> ...``: `tool-dispatcher` whose
retention job archives and removes calls that can still move, ON PURPOSE, for proving
that the chaos checker catches it (`python -m devtools chaos --plant eager-retention`,
which runs the retention passes through it). Never run it against a real database.

The defence: :mod:`dispatcher.retention.eligibility` lets a call go only when it is
finished, the reconciler no longer follows it, no escalation or approval of it is
open, and its provider's idempotency window has closed. Here only its age is asked.

The product is left as it is: the module's two statements are rebound in this process
only, and the CLI then runs as usual.
"""

from __future__ import annotations

import sys

from sqlalchemy import text

from dispatcher.retention import eligibility

_ANY_OLD = """
    FROM tool_calls c
    WHERE c.tenant = :tenant AND c.updated_at < :cutoff
"""


def arm() -> None:
    eligibility._DUE_BATCH = text(
        f"SELECT c.tool_call_id, c.version, c.updated_at {_ANY_OLD}"
        " ORDER BY c.updated_at LIMIT :limit"
    )
    eligibility._DUE_COUNT = text(
        f"SELECT count(*) FROM (SELECT 1 {_ANY_OLD} LIMIT :limit) AS due"  # noqa: S608
    )


def main() -> int:
    arm()
    from tool_dispatcher.main import main as cli

    return cli(sys.argv[1:])


if __name__ == "__main__":
    raise SystemExit(main())
