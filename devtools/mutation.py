"""Mutation score of the modules that carry the guarantees: it measures the tests,
not speed, so it lives with the dev tooling rather than in bench/.

    .venv/bin/python -m devtools.mutation [--module NAME ...] [--jobs N] [--budget-scale F]
    make mutation

Each module of ``TARGETS`` is mutated by mutmut (3.x, in the bench extra) in a scratch
copy of the repository (a temporary directory; the worktree is never touched), and
each mutant is run against that module's own fast tests only (files, or single tests
by node id), within the module's time budget. mutmut's trampolines select, per
mutated function, the tests that call it, and it forks each mutant from a process
that has imported everything already: a mutant costs its covering tests, not an
interpreter start. The tests run against one PostgreSQL and one broker for the whole
run (``TOOL_DISPATCHER_TEST_*`` if set, else embedded ones started here), so no mutant
pays for starting a server.

It prints, per module: mutants, killed, survived (no covering test counts as
survived), timeout, not run (the budget ran out first), equivalent, and the score
``killed / (mutants - not run - equivalent)``; then every surviving mutant as a diff, and the
mutants judged equivalent or harmless in ``devtools/mutation_equivalent.toml`` with their
reasons. Log calls are not mutated at all (``NO_MUTATE``): what they say is no promise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EQUIVALENT_FILE = Path(__file__).with_name("mutation_equivalent.toml")
# What the tests read besides the packages (schemas in docs/, examples, the README).
COPIED = (
    "dispatcher",
    "outbox_relay",
    "reconciler",
    "kit",
    "tool_dispatcher",
    "devtools",
    "bench",
    "tests",
    "docs",
    "examples",
)
COPIED_FILES = ("pyproject.toml", "README.md", ".importlinter")
SOURCES = ("dispatcher", "outbox_relay", "reconciler")
# A log line's wording is no promise; its mutants would only pad the equivalent list.
NO_MUTATE = (r"^\s*(log|logger)\.(debug|info|warning|error|exception)\(",)
# A test that hangs on a mutant fails well before mutmut's own timeout would.
TEST_TIMEOUT_SECONDS = 30


@dataclass(frozen=True)
class Target:
    """A module that carries a guarantee, the fast tests that guard it, and its budget."""

    tests: tuple[str, ...]
    budget_seconds: int
    broker: bool = False


_WORKER = (
    "tests/worker/test_execution.py",
    "tests/worker/test_execution_batch.py",
    "tests/worker/test_resend_settlement.py",
    "tests/worker/test_outcome_batches.py",
    "tests/worker/test_claim_and_record.py",
    "tests/worker/test_fencing.py",
)
TARGETS: dict[str, Target] = {
    # Provider classification: which answers are definitive, which are "sent, unknown".
    "dispatcher/provider/contract.py": Target(("tests/unit/test_provider_contract.py",), 40),
    # The one place "not sent" is decided, and nothing sent twice behind our back.
    "dispatcher/provider/transport.py": Target(
        (
            "tests/unit/test_transport_table.py",
            "tests/worker/test_provider_transport.py",
            "tests/worker/test_transport_wire.py",
        ),
        20,
    ),
    "dispatcher/provider/client.py": Target(
        (
            "tests/unit/test_provider_contract.py",
            "tests/unit/test_provider_answers.py",
            *_WORKER,
            "tests/worker/test_provider_credentials.py",
            "tests/unit/test_provider_backoff.py",
        ),
        140,
    ),
    # Point A (the claim, before the send) and point B (the outcome, after it).
    "dispatcher/worker/claims.py": Target(("tests/unit/test_claim_lease.py", *_WORKER), 100),
    "dispatcher/worker/executor.py": Target(_WORKER, 140),
    "dispatcher/worker/outcomes.py": Target(_WORKER, 120),
    # Recovery of lapsed leases and redrive of commands the broker never delivered.
    "dispatcher/worker/recovery.py": Target(
        ("tests/unit/test_recovery_rule.py", "tests/worker/test_recovery.py"), 120
    ),
    "dispatcher/worker/redrive.py": Target(("tests/worker/test_redrive.py",), 120),
    # The relay's publish and settle. The broker fault tests start a broker of their
    # own each (seconds a run): only the one of rows not acknowledged is here.
    "outbox_relay/relay.py": Target(
        (
            "tests/unit/test_relay_backoff.py",
            "tests/unit/test_relay_units.py",
            "tests/relay/test_relay_publish.py",
            "tests/relay/test_relay_leases.py",
            "tests/relay/test_relay_broker.py::test_rows_not_acknowledged_are_recorded_and_reported",
            "tests/relay/test_relay_dead_letters.py",
            "tests/relay/test_relay_retention.py",
        ),
        140,
        broker=True,
    ),
    "outbox_relay/schedule.py": Target(("tests/unit/test_relay_units.py",), 10),
    "outbox_relay/settle.py": Target(("tests/unit/test_relay_units.py",), 30),
    # Intake's key and fingerprint, and what an approval binds itself to.
    # Pure functions: their unit tests alone (the intake tests take a database each).
    "dispatcher/intake/keys.py": Target(("tests/unit/test_idempotency_keys.py",), 40),
    "dispatcher/intake/approvals.py": Target(
        ("tests/control/test_approvals.py", "tests/control/test_approval_in_view.py"), 60
    ),
    "dispatcher/control/approvals.py": Target(
        ("tests/control/test_approval_lifecycle.py", "tests/control/test_approvals.py"), 140
    ),
    # The reconciler's policy, its re-send and the writes that settle a call.
    "reconciler/policy.py": Target(("tests/unit/test_reconcile_policy.py",), 60),
    "reconciler/loop.py": Target(
        (
            "tests/reconciler/test_reconciler.py",
            "tests/reconciler/test_reconciler_reversals.py",
            "tests/reconciler/test_reconciler_passes.py",
        ),
        90,
    ),
    "reconciler/rulings.py": Target(
        (
            "tests/reconciler/test_reconciler.py",
            "tests/reconciler/test_reconciler_reversals.py",
            "tests/reconciler/test_reconciler_passes.py",
        ),
        50,
    ),
    "reconciler/record.py": Target(
        ("tests/reconciler/test_reconciler.py", "tests/reconciler/test_reconciler_writes.py"), 70
    ),
    "dispatcher/ledger/marks.py": Target(
        ("tests/reconciler/test_reconciler.py", "tests/reconciler/test_reconciler_writes.py"), 50
    ),
    "dispatcher/control/escalations.py": Target(
        ("tests/control/test_escalation_lifecycle.py", "tests/control/test_escalations.py"), 140
    ),
}

# mutmut's exit codes of a mutant's test run, as its ``stats.status_by_exit_code``.
KILLED = {1, 3}
SURVIVED = {0, 5, 33}
TIMEOUT = {24, -24, 36, 152, 255}


@dataclass
class Score:
    module: str
    statuses: dict[str, str] = field(default_factory=dict)
    diffs: dict[str, str] = field(default_factory=dict)
    equivalent: dict[str, str] = field(default_factory=dict)  # mutant -> reason
    stale: list[str] = field(default_factory=list)  # listed as equivalent, yet killed
    seconds: float = 0.0

    def count(self, status: str) -> int:
        return sum(
            1 for name, s in self.statuses.items() if s == status and name not in self.equivalent
        )

    @property
    def score(self) -> float:
        """Killed over the mutants checked that are not equivalent: a module whose
        budget ran out is scored on the mutants mutmut reached (the cheapest first)."""
        judged = len(self.statuses) - self.count("not run") - len(self.equivalent)
        return self.count("killed") / judged if judged else 1.0


def status_of(exit_code: int | None) -> str:
    if exit_code is None:
        return "not run"
    if exit_code in KILLED:
        return "killed"
    if exit_code in SURVIVED:
        return "survived"
    if exit_code in TIMEOUT:
        return "timeout"
    return "killed" if exit_code in (-9, -11) else "survived"


def description(mutant: str, diff: str) -> str:
    """A mutant named by its function and its change, stable while the function is:
    mutmut's numbers shift whenever a mutation is added earlier in the function."""
    function = re.sub(r"__mutmut_\d+$", "", mutant.rsplit(".", 1)[-1]).removeprefix("x_")
    function = function.replace("xǁ", "").replace("ǁ", ".")
    lines = [line for line in diff.splitlines() if not line.startswith(("---", "+++", "@@"))]
    removed = " / ".join(line[1:].strip() for line in lines if line.startswith("-"))
    added = " / ".join(line[1:].strip() for line in lines if line.startswith("+"))
    return f"{function}: {removed} => {added}"


def load_equivalent(path: Path = EQUIVALENT_FILE) -> dict[str, dict[str, str]]:
    """module -> {mutant description -> why it is equivalent or harmless}."""
    found: dict[str, dict[str, str]] = {}
    for entry in tomllib.loads(path.read_text()).get("mutant", []):
        found.setdefault(entry["module"], {})[entry["mutant"]] = entry["reason"]
    return found


def scratch_copy(module: str, target: Target) -> Path:
    """A copy of the repository whose pyproject tells mutmut what to mutate and run."""
    root = Path(tempfile.mkdtemp(prefix="td-mutation-"))
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "mutants")
    for name in COPIED:
        shutil.copytree(REPO / name, root / name, ignore=ignore)
    for name in COPIED_FILES:
        if (REPO / name).exists():
            shutil.copy2(REPO / name, root / name)
    config = {
        "source_paths": list(SOURCES),
        "only_mutate": [module],
        "do_not_mutate_patterns": list(NO_MUTATE),
        "pytest_add_cli_args_test_selection": list(target.tests),
        "pytest_add_cli_args": ["-p", "no:cacheprovider", f"--timeout={TEST_TIMEOUT_SECONDS}"],
        "also_copy": ["docs", "examples", "README.md", ".importlinter"],
    }
    with (root / "pyproject.toml").open("a") as out:
        out.write("\n[tool.mutmut]\n")
        out.writelines(f"{key} = {json.dumps(value)}\n" for key, value in config.items())
    return root


# Run inside the scratch copy (mutmut reads its configuration from the working
# directory when imported): each mutant's exit code, and the diff of each survivor.
_REPORT = """
import json, sys
from pathlib import Path
from mutmut.mutation.diff_apply import get_diff_for_mutant
meta = json.loads(Path("mutants", sys.argv[1] + ".meta").read_text())["exit_code_by_key"]
diffs = {m: get_diff_for_mutant(m, path=sys.argv[1]) for m, c in meta.items()
         if c not in (1, 3, -9, -11) and c is not None}
print(json.dumps({"exit_codes": meta, "diffs": diffs}))
"""


def run_module(
    module: str, target: Target, jobs: int, budget: float | None, env: dict[str, str]
) -> Score:
    """mutmut over ``module`` in a scratch copy, stopped after ``budget`` seconds."""
    root = scratch_copy(module, target)
    log = root / "mutmut.log"
    started = time.monotonic()
    try:
        with log.open("w") as out:
            proc = subprocess.Popen(
                [sys.executable, "-c", "from mutmut.__main__ import cli; cli()", "run",
                 "--max-children", str(jobs)],
                cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            try:
                proc.wait(timeout=budget)
            except subprocess.TimeoutExpired:
                print(f"  budget of {budget:.0f} s spent; stopping", flush=True)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        score = Score(module, seconds=time.monotonic() - started)
        if not (root / "mutants" / f"{module}.meta").exists():
            tail = log.read_text()[-3000:]
            raise RuntimeError(f"mutmut produced no results for {module}:\n{tail}")
        report = subprocess.run(
            [sys.executable, "-c", _REPORT, module],
            cwd=root, env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        found = json.loads(report.stdout)
        score.statuses = {m: status_of(code) for m, code in found["exit_codes"].items()}
        score.diffs = found["diffs"]
        return score
    finally:
        shutil.rmtree(root, ignore_errors=True)


def judge(score: Score, equivalent: dict[str, str]) -> None:
    """Exclude the survivors listed as equivalent; note listed ones the tests now kill."""
    described = {m: description(m, d) for m, d in score.diffs.items()}
    for mutant, text in described.items():
        if score.statuses[mutant] != "killed" and text in equivalent:
            score.equivalent[mutant] = equivalent[text]
    seen = set(described.values())
    score.stale = sorted(text for text in equivalent if text not in seen)


def table(scores: list[Score]) -> str:
    head = "| module | mutants | killed | survived | timeout | not run | equivalent | score |"
    rows = [head, "|" + "---|" * 8]
    for s in scores:
        rows.append(
            f"| `{s.module}` | {len(s.statuses)} | {s.count('killed')} | {s.count('survived')}"
            f" | {s.count('timeout')} | {s.count('not run')} | {len(s.equivalent)}"
            f" | {s.score:.0%} |"
        )
    return "\n".join(rows)


def details(scores: list[Score]) -> Iterator[str]:
    for s in scores:
        living = [m for m, st in s.statuses.items() if st != "killed" and m not in s.equivalent]
        if living:
            yield f"\n## {s.module}: {len(living)} not killed"
            for mutant in sorted(living):
                yield f"- {s.statuses[mutant]}: {description(mutant, s.diffs.get(mutant, ''))}"
        if s.equivalent:
            yield f"\n## {s.module}: {len(s.equivalent)} equivalent or harmless"
            for mutant, reason in sorted(s.equivalent.items()):
                yield f"- {description(mutant, s.diffs[mutant])}\n    because {reason}"
        for text in s.stale:
            yield f"- listed as equivalent but not a surviving mutant now: {text}"


@contextlib.contextmanager
def services(broker: bool) -> Iterator[dict[str, str]]:
    """The environment of the tests: one database server and one broker for the run."""
    from devtools.embedded import EmbeddedPostgres, Tansu

    env = dict(os.environ)
    with contextlib.ExitStack() as stack:
        if not env.get("TOOL_DISPATCHER_TEST_DATABASE_URL"):
            home = Path(tempfile.mkdtemp(prefix="td-mutation-pg-"))
            stack.callback(shutil.rmtree, home, ignore_errors=True)
            server = EmbeddedPostgres(home / "data")
            env["TOOL_DISPATCHER_TEST_DATABASE_URL"] = server.start()
            stack.callback(server.stop)
        if broker and not env.get("TOOL_DISPATCHER_TEST_KAFKA_BOOTSTRAP"):
            tansu = Tansu()
            env["TOOL_DISPATCHER_TEST_KAFKA_BOOTSTRAP"] = tansu.start()
            stack.callback(tansu.stop)
        yield env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.mutation", description=__doc__)
    parser.add_argument("--module", action="append", choices=sorted(TARGETS), help="repeatable")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once")
    parser.add_argument(
        "--budget-scale", type=float, default=1.0, help="times each budget (0: no budget)"
    )
    args = parser.parse_args(argv)
    # Smallest budgets first: the pure modules finish early and leave their spare time
    # to the ones whose tests need the database.
    chosen = sorted(args.module or TARGETS, key=lambda m: TARGETS[m].budget_seconds)
    equivalent = load_equivalent()
    started = time.monotonic()
    scores = []
    spare = 0.0  # what the modules before left of their budgets goes to the next one
    with services(any(TARGETS[m].broker for m in chosen)) as env:
        for module in chosen:
            target = TARGETS[module]
            budget = (
                target.budget_seconds * args.budget_scale + spare if args.budget_scale else None
            )
            print(f"mutating {module} against {' '.join(target.tests)}", flush=True)
            score = run_module(module, target, args.jobs, budget, env)
            spare = max(0.0, budget - score.seconds) if budget is not None else 0.0
            judge(score, equivalent.get(module, {}))
            print(f"  {len(score.statuses)} mutants, {score.score:.0%}, {score.seconds:.0f} s")
            # Each module's mutants as soon as they are known: a long run stopped early
            # still says what it found.
            for line in details([score]):
                print(line, flush=True)
            scores.append(score)
    print(f"\n{table(scores)}\n\nmeasured {time.strftime('%Y-%m-%d', time.gmtime())}, "
          f"{time.monotonic() - started:.0f} s in all")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
