"""The mutation runner (``devtools/mutation.py``) names modules and tests that exist,
and its list of equivalent mutants names modules it mutates, each with a reason. The
benchmark itself is not run here: it takes about half an hour."""

from __future__ import annotations

from devtools.mutation import EQUIVALENT_FILE, TARGETS, Score, description, load_equivalent
from tests.fixtures.paths import REPO


def test_every_target_and_each_of_its_tests_exists() -> None:
    missing = [m for m in TARGETS if not (REPO / m).is_file()]
    # A test may be named by node id (``file::test``): its file must exist.
    files = {t.split("::")[0] for target in TARGETS.values() for t in target.tests}
    missing += sorted(f for f in files if not (REPO / f).is_file())
    assert missing == []
    # Under half an hour in all, with room for each module's copy and report.
    assert sum(t.budget_seconds for t in TARGETS.values()) <= 28 * 60


def test_each_equivalent_mutant_is_of_a_target_and_says_why() -> None:
    listed = load_equivalent(EQUIVALENT_FILE)
    assert set(listed) <= set(TARGETS)
    assert all(reason.strip() for reasons in listed.values() for reason in reasons.values())


def test_a_mutant_is_described_by_its_function_and_change() -> None:
    diff = (
        "--- dispatcher/x.py\n+++ dispatcher/x.py\n@@ -1,3 +1,3 @@\n"
        " def f(a):\n-    return a + 1\n+    return a - 1"
    )
    assert description("dispatcher.x.x_f__mutmut_12", diff) == "f: return a + 1 => return a - 1"
    method = "dispatcher.x.xǁClaimǁkey__mutmut_3"
    assert description(method, diff).startswith("Claim.key: ")


def test_equivalent_and_unrun_mutants_leave_the_denominator() -> None:
    statuses = {"a": "killed", "b": "survived", "c": "survived", "d": "not run"}
    score = Score("m", statuses=statuses)
    assert score.score == 1 / 3
    score.equivalent = {"c": "a log line"}
    assert (score.score, score.count("survived")) == (1 / 2, 1)
