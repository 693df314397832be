"""The harness's pure parts: checkpoints written atomically and read strictly, crash
plans, the scripted model, and the tools' read-only flags against the capabilities."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dispatcher.capabilities import load_registry
from examples.agent_harness.checkpoint import (
    Checkpoint,
    CheckpointError,
    PendingToolUse,
    load_checkpoint,
    save_checkpoint,
)
from examples.agent_harness.crash import LABELS, CrashPlan, CrashSpecError
from examples.agent_harness.model import RESPONSES, UNSURE, ScriptedModel, ScriptExhausted
from examples.agent_harness.tools import TOOLS
from tests.fixtures.harness import EXAMPLE, REPO, transcript_problems


def a_checkpoint() -> Checkpoint:
    return Checkpoint(
        "task",
        "run-1",
        turns=3,
        tokens_used=900,
        messages=[{"role": "user", "content": "task"}],
        pending=PendingToolUse("toolu_03", "write_report", {"path": "r"}, "run-1.toolu_03"),
    )


def test_save_then_load_round_trips_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save_checkpoint(path, a_checkpoint())
    save_checkpoint(path, a_checkpoint())

    assert load_checkpoint(path) == a_checkpoint()
    assert json.loads(path.read_text())["pendingToolUse"]["toolCallId"] == "run-1.toolu_03"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.json"]


def test_a_save_that_dies_midway_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    save_checkpoint(path, a_checkpoint())
    broken = a_checkpoint()
    # json.dump has written part of the file when it meets what it cannot encode.
    broken.messages = [{"role": "user", "content": "x" * 10_000}, {"bad": object()}]

    with pytest.raises(TypeError):
        save_checkpoint(path, broken)

    assert load_checkpoint(path) == a_checkpoint()


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('{"version":1,"turns":3,"pendingT', "cannot be parsed; it may have been cut off"),
        ("", "cannot be parsed"),
        ('{"version": 2, "turns": 3}', "has version=2; this program only accepts version=1"),
        ("[1, 2]", "has version=null"),
        ('{"version": 1, "turns": 3}', "is not a checkpoint this program wrote"),
    ],
)
def test_load_refuses_what_it_cannot_trust(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(text)
    with pytest.raises(CheckpointError, match=says):
        load_checkpoint(path)


def test_load_refuses_a_pending_call_without_its_tool_call_id(tmp_path: Path) -> None:
    data = a_checkpoint().to_json()
    del data["pendingToolUse"]["toolCallId"]
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="toolCallId must be a str"):
        load_checkpoint(path)


def test_load_refuses_a_missing_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="nothing to --resume"):
        load_checkpoint(tmp_path / "checkpoint.json")


def run_harness(
    tmp_path: Path, *args: str, crash: str | None = None
) -> subprocess.CompletedProcess[str]:
    key = tmp_path / "key"
    key.write_text("tdk_unused\n")
    env = {"PATH": "/usr/bin:/bin", **({"CRASH_AFTER": crash} if crash else {})}
    return subprocess.run(
        [sys.executable, "-m", "examples.agent_harness", "--api-key-file", str(key), *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_resume_from_a_truncated_checkpoint_exits_2_with_one_line(tmp_path: Path) -> None:
    (tmp_path / "checkpoint.json").write_text('{"version":1,"turns":3,"pendingT')
    done = run_harness(tmp_path, "--workdir", str(tmp_path), "--resume")

    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert "cannot be parsed; it may have been cut off mid-write" in done.stderr
    # Refused, not replaced: the file is left as it was for a human to look at.
    assert (tmp_path / "checkpoint.json").read_text() == '{"version":1,"turns":3,"pendingT'


@pytest.mark.parametrize(
    ("args", "crash"), [((), "after-lunch:3"), (("--wait-seconds", "soon"), None)]
)
def test_bad_input_exits_2_with_one_line(
    tmp_path: Path, args: tuple[str, ...], crash: str | None
) -> None:
    done = run_harness(tmp_path, "--workdir", str(tmp_path), *args, crash=crash)
    assert done.returncode == 2
    assert len(done.stderr.splitlines()) == 1, done.stderr


@pytest.mark.parametrize("spec", ["after-save-a", "after-save-a:0", "after-save-a:x", "nope:1"])
def test_crash_plan_refuses_a_bad_spec(spec: str) -> None:
    with pytest.raises(CrashSpecError):
        CrashPlan.parse(spec)


def test_crash_plan_parses_every_label() -> None:
    assert [CrashPlan.parse(f"{label}:2") for label in LABELS] == [
        CrashPlan(label, 2) for label in LABELS
    ]
    assert CrashPlan.parse(None) == CrashPlan.parse("") == CrashPlan()


def test_scripted_model_resumes_after_the_answered_responses() -> None:
    transcript = [{"role": "user", "content": "task"}]
    fresh = ScriptedModel()
    for response in RESPONSES[:2]:
        assert fresh.create(transcript) == response
        transcript.append({"role": "assistant", "content": response["content"]})

    resumed = ScriptedModel.resuming(transcript)
    assert resumed.create(transcript) == RESPONSES[2]
    assert resumed.create(transcript) == RESPONSES[3]
    with pytest.raises(ScriptExhausted):
        resumed.create(transcript)


def test_scripted_model_does_not_claim_a_write_in_doubt() -> None:
    transcript = [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": True}]}
    ]
    assert ScriptedModel(RESPONSES[3:]).create(transcript) == UNSURE


def test_the_tools_read_only_flags_match_their_capabilities() -> None:
    registry = load_registry(EXAMPLE / "capabilities.toml")
    assert {c.id: not c.side_effects for c in registry} == {
        t.name: t.read_only for t in TOOLS.values()
    }


def test_transcript_check_finds_missing_and_doubled_results() -> None:
    use = {"role": "assistant", "content": [{"type": "tool_use", "id": "t1"}]}
    result = {"type": "tool_result", "tool_use_id": "t1"}
    assert transcript_problems([use, {"role": "user", "content": [result]}]) == []
    assert transcript_problems([use]) != []
    assert transcript_problems([use, {"role": "user", "content": [result, result]}]) != []
    stray = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9"}]}
    assert transcript_problems([{"role": "user", "content": "task"}, stray]) != []
