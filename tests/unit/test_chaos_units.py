"""The chaos harness's pure parts: the seeded fault plan and the invariant checker
(fed planted violations), plus its TCP proxy against a real socket server."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest

import devtools.__main__ as dev
from devtools.chaos import run
from devtools.chaos.bus_evidence import tally
from devtools.chaos.checker import (
    SIZE_ERROR,
    BusAnswer,
    CallRecord,
    DeadLetterSeen,
    Evidence,
    Waiting,
    check,
    unfenced,
)
from devtools.chaos.proxy import ProxyMode, TcpProxy
from devtools.chaos.schedule import FaultKind, applicable, plan
from dispatcher.ledger.messages import Producer
from dispatcher.schemas import EventView
from dispatcher.states import ExecutionStatus as S
from dispatcher.states import VerificationStatus as V


def test_plan_is_a_function_of_the_seed() -> None:
    first = plan(7, 90, owns_database=True, owns_broker=True)
    assert first == plan(7, 90, owns_database=True, owns_broker=True)
    assert first != plan(8, 90, owns_database=True, owns_broker=True)


def test_plan_deals_every_kind_and_lifts_each_before_the_end() -> None:
    faults = plan(7, 90, owns_database=True, owns_broker=True)
    assert {f.kind for f in faults} == set(FaultKind)
    assert all(f.at + f.seconds < 90 for f in faults)
    assert [f.at for f in faults] == sorted(f.at for f in faults)
    zombies = [f for f in faults if f.kind is FaultKind.ZOMBIE]
    # Past the lease (about 7 s) and the broker's session timeout (6 s).
    assert all(f.seconds > 7 for f in zombies)


def test_borrowed_servers_are_never_restarted() -> None:
    kinds = {f.kind for f in plan(3, 600, owns_database=False, owns_broker=False)}
    assert FaultKind.DB_RESTART not in kinds
    assert FaultKind.BROKER_RESTART not in kinds
    assert FaultKind.PG_TERMINATE in kinds
    assert len(applicable(owns_database=False, owns_broker=False)) == len(FaultKind) - 2


def test_lead_fault_comes_first() -> None:
    faults = plan(
        1, 20, owns_database=True, owns_broker=True, lead=FaultKind.PROVIDER_DROP_AFTER_APPLY
    )
    assert faults[0].kind is FaultKind.PROVIDER_DROP_AFTER_APPLY
    assert faults[0].times > 0


def test_a_lead_zombie_has_the_run_to_itself_until_it_is_lifted() -> None:
    for seed in range(20):
        lead, *rest = plan(
            seed, 60, owns_database=True, owns_broker=True, lead=FaultKind.ZOMBIE_READ_ONLY
        )
        assert lead.kind is FaultKind.ZOMBIE_READ_ONLY
        assert all(f.at > lead.at + lead.seconds for f in rest)


def test_fence_zombies_may_stop_a_worker_past_a_takeover() -> None:
    faults = plan(7, 90, owns_database=True, owns_broker=True)
    by_kind = {f.kind: f for f in faults}
    # A re-dispatch: the lease (about 7 s) and a claim; a re-send: inFlightSeconds (10 s).
    assert by_kind[FaultKind.ZOMBIE_READ_ONLY].seconds > 10
    assert by_kind[FaultKind.ZOMBIE_RESEND].seconds > 15


def test_every_plant_the_cli_offers_is_one_the_harness_runs() -> None:
    assert set(dev.PLANTS) == set(run.PLANTS)


T = datetime(2026, 1, 1, tzinfo=UTC)


def event(
    call: str | None, event_type: str, n: int, producer: str = Producer.WORKER, **payload: Any
) -> tuple[str, EventView]:
    return "t", EventView(
        event_id=f"{call}-{n}",
        event_type=event_type,
        run_id="run-1",
        turn_id=None,
        producer=producer,
        reasoning_object_id=None,
        capability_id="refund",
        correlation_id=None,
        causation_id=None,
        tool_call_id=call,
        schema_version=1,
        occurred_at=T,
        payload=payload,
    )


def of(tenant: str, tagged: tuple[str, EventView]) -> tuple[str, EventView]:
    """The event as ``tenant``'s."""
    return tenant, tagged[1]


def completed_log(call: str, tenant: str = "t") -> list[tuple[str, EventView]]:
    log = [
        event(call, "tool.call.requested", 0),
        event(call, "tool.call.authorized", 1),
        claimed(call, 2, "w-1", 3),
        ended(call, 3, "w-1", 3),
        event(call, "tool.call.completed", 4, **{"from": ["accepted"]}, to="completed"),
    ]
    return [of(tenant, e) for e in log]


def claimed(call: str, n: int, worker: str, version: int) -> tuple[str, EventView]:
    return event(
        call, "tool.call.dispatching", n, to="dispatching", worker=worker, claimVersion=version
    )


def ended(
    call: str, n: int, worker: str, version: int, to: str = "accepted"
) -> tuple[str, EventView]:
    """An outcome recorded for the claim ``worker`` took at ``version``."""
    fields = {"from": ["dispatching"], "to": to, "worker": worker, "claimVersion": version}
    return event(call, f"tool.call.{to}", n, **fields)


def taken_over(call: str, n: int, worker: str, version: int) -> tuple[str, EventView]:
    """The recovery sweep re-dispatches a read-only call whose worker's lease lapsed."""
    fields = {"from": ["dispatching"], "to": "authorized", "deadWorker": worker}
    return event(
        call, "tool.call.redispatched", n, Producer.RECOVERY, **fields, claimVersion=version
    )


def call(
    call_id: str, status: S, verification: V = V.CONFIRMED_SUCCESS, *, side_effects: bool = True
) -> CallRecord:
    return CallRecord(call_id, "t", "run-1", status, verification, f"k-{call_id}", side_effects)


def clean() -> Evidence:
    return Evidence(
        acknowledged=[("t", "a")],
        replay_mismatches=[],
        calls={("t", "a"): call("a", S.COMPLETED)},
        events=completed_log("a"),
        effects={"k-a": 1},
        reversals={},
    )


def counts(evidence: Evidence) -> dict[int, int]:
    return {n: len(v) for n, v in check(evidence).items()}


def test_a_clean_run_has_no_violations() -> None:
    assert counts(clean()) == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}


def test_lost_submission_and_replay_mismatch_violate_1() -> None:
    evidence = clean()
    evidence.acknowledged = [("t", "a"), ("t", "lost"), ("other", "a")]
    evidence.replay_mismatches = ["a answered 201 b"]
    assert counts(evidence)[1] == 3


def test_a_hostile_submission_not_refused_or_a_valid_one_refused_violates_6() -> None:
    evidence = clean()
    evidence.hostile_misanswered = ["nul_in_input b'{...}': 503 service_unavailable"]
    evidence.valid_refused = ['{"runId": ...}: 400 validation_failed']
    assert counts(evidence) == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 2, 7: 0, 8: 0, 9: 0, 10: 0}


def test_stuck_calls_violate_2() -> None:
    evidence = clean()
    evidence.calls = {("t", "a"): call("a", S.RESULT_UNKNOWN)}
    evidence.events = [*completed_log("a")[:3], event("a", "x", 9, to="result_unknown")]
    evidence.effects = {}
    assert counts(evidence) == {1: 0, 2: 1, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}


@pytest.mark.parametrize(
    ("status", "verification", "effects", "reversals"),
    [
        (S.COMPLETED, V.CONFIRMED_SUCCESS, 2, 0),  # applied twice
        (S.COMPLETED, V.CONFIRMED_SUCCESS, 0, 0),  # success that never happened
        (S.CONFIRMED, V.CONFIRMED_FAILURE, 1, 0),  # "failed" yet applied
        (S.FAILED, V.CONFIRMED_FAILURE, 1, 0),
        (S.COMPENSATED, V.CONFIRMED_SUCCESS, 1, 0),  # compensated without a reversal
        (S.COMPLETED, V.CONFIRMED_SUCCESS, 1, 1),  # reversed but not compensated
    ],
)
def test_effects_that_disagree_with_the_status_violate_3(
    status: S, verification: V, effects: int, reversals: int
) -> None:
    evidence = clean()
    evidence.calls = {("t", "a"): call("a", status, verification)}
    evidence.events = [*completed_log("a")[:3], event("a", "x", 9, to=status.value)]
    evidence.effects = {"k-a": effects}
    evidence.reversals = {"k-a": reversals}
    assert counts(evidence) == {1: 0, 2: 0, 3: 1, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}


def test_effect_under_a_key_no_call_has_violates_3() -> None:
    """What a blind retry under a fresh key leaves behind."""
    evidence = clean()
    evidence.effects = {"k-a": 1, "k-a#blind-1": 1}
    assert counts(evidence)[3] == 1


def test_read_only_calls_are_only_checked_for_duplicates() -> None:
    evidence = clean()
    evidence.calls = {("t", "a"): call("a", S.FAILED, V.NOT_OBSERVED, side_effects=False)}
    evidence.events = [*completed_log("a")[:3], event("a", "x", 9, to="failed")]
    assert counts(evidence)[3] == 0
    evidence.effects = {"k-a": 2}
    assert counts(evidence)[3] == 1


def test_status_the_log_does_not_reproduce_violates_4() -> None:
    evidence = clean()
    evidence.events = completed_log("a")[:3]
    assert counts(evidence) == {1: 0, 2: 0, 3: 0, 4: 1, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}


def test_unpublished_rows_and_dead_letters_violate_5() -> None:
    evidence = clean()
    evidence.unpublished = 3
    evidence.dead_letters = [dead_letter(9, "t", "a", error="InvalidTopicError")]
    assert counts(evidence)[5] == 2


LIMIT = 1000


def dead_letter(
    row: int,
    tenant: str,
    call_id: str,
    *,
    size: int = LIMIT + 1,
    error: str = f"{SIZE_ERROR}: The message is 1001 bytes",
    waiting: tuple[Waiting, ...] = (),
) -> DeadLetterSeen:
    key = f"{tenant}/{call_id}"
    return DeadLetterSeen(row, "escalations", key, tenant, call_id, size, error, waiting)


def with_oversized(evidence: Evidence) -> Evidence:
    """The load made call b of tenant t oversized on purpose: its escalation is dead
    letter 9, shown to t's API key and discarded by it."""
    evidence.oversized = {("t", "b")}
    evidence.max_message_bytes = LIMIT
    evidence.dead_letters = [dead_letter(9, "t", "b")]
    evidence.listed = {"t": {9}, "u": set()}
    evidence.discarded = {9: "200"}
    return evidence


def test_a_dead_letter_made_on_purpose_and_discarded_by_its_tenant_keeps_5() -> None:
    assert counts(with_oversized(clean()))[5] == 0


@pytest.mark.parametrize(
    "dead",
    [
        dead_letter(9, "t", "a"),  # about a call the load did not make oversized
        dead_letter(9, "u", "b"),  # another tenant's message about the same id
        dead_letter(9, "t", "b", size=LIMIT),  # within the limit, refused all the same
        dead_letter(9, "t", "b", error="InvalidTopicError: [Error 17]"),
    ],
)
def test_a_dead_letter_the_run_did_not_cause_violates_5(dead: DeadLetterSeen) -> None:
    evidence = with_oversized(clean())
    evidence.dead_letters = [dead]
    assert counts(evidence)[5] == 1


@pytest.mark.parametrize(
    ("listed", "discarded"),
    [({"t": set()}, {9: "200"}), ({"t": {9}}, {9: "404"}), ({"t": {9}}, {})],
)
def test_a_dead_letter_its_tenant_was_not_shown_or_could_not_discard_violates_5(
    listed: dict[str, set[int]], discarded: dict[int, str]
) -> None:
    evidence = with_oversized(clean())
    evidence.listed, evidence.discarded = listed, discarded
    assert counts(evidence)[5] == 1


def twin(tenant: str, **changed: Any) -> CallRecord:
    """Tenant's call x: the same runId, toolCallId and idempotency key as written in
    every tenant, and a provider key, a request and a result of its own."""
    record = CallRecord(
        "x",
        tenant,
        "run-1",
        S.COMPLETED,
        V.CONFIRMED_SUCCESS,
        f"{tenant}:k-x",
        idempotency_key="k-x",
        input={"orderId": "o-1", "amount": 1},
        result={"echo": {"amount": 1, "orderId": "o-1"}},
        external_request_id=f"req-{tenant}",
    )
    return replace(record, **changed)


def twins(**changed: Any) -> Evidence:
    """Tenants t and u with a call x each, kept apart (u's changed as given)."""
    return Evidence(
        acknowledged=[("t", "x"), ("u", "x")],
        replay_mismatches=[],
        calls={("t", "x"): twin("t"), ("u", "x"): twin("u", **changed)},
        events=[*completed_log("x"), *completed_log("x", "u")],
        effects={"t:k-x": 1, "u:k-x": 1},
        reversals={},
    )


def test_tenants_whose_names_meet_kept_apart_keep_8() -> None:
    assert counts(twins()) == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}


def test_one_provider_key_for_calls_of_two_tenants_violates_8() -> None:
    """What keys without their tenant give: the provider takes u's request for t's."""
    evidence = twins(provider_key="t:k-x", external_request_id="req-t")
    found = check(evidence)[8]
    assert found == [
        "provider key t:k-x is the key of calls of 2 tenants (t: x; u: x),"
        " 1 effect(s) applied under it",
        "provider request req-t is the result of calls of 2 tenants (t: x; u: x)",
    ]


def test_a_result_echoing_another_body_than_the_calls_input_violates_8() -> None:
    [found] = check(twins(input={"orderId": "o-1", "amount": 2}))[8]
    assert found.startswith("u/x: its result echoes a body that is not its input")


def test_an_act_by_another_tenants_key_violates_8() -> None:
    evidence = twins()
    by = {"name": "load of t", "tenant": "t", "via": "api"}
    evidence.events = [
        *evidence.events,
        of("u", event(None, "run.stopped", 8, Producer.OPERATOR, by=by)),
        event(None, "run.stopped", 9, Producer.OPERATOR, by=by),
        of("u", event(None, "run.stopped", 10, Producer.OPERATOR, by={**by, "tenant": None})),
    ]
    assert check(evidence)[8] == ["u/run-1: run.stopped by load of t of tenant t"]


def test_a_stop_that_reaches_another_tenants_run_of_the_same_name_violates_8() -> None:
    evidence = twins()
    requested = event("x", "tool.call.compensation_requested", 9)
    evidence.events = [
        *evidence.events,
        event(None, "run.stopped", 8, Producer.OPERATOR),
        requested,
        of("u", requested),
    ]
    assert check(evidence)[8] == [
        "u/x: tool.call.compensation_requested, and u never stopped run run-1"
    ]
    evidence.foreign_refusals = ["u: a submission to run run-1 refused as stopped"]
    assert len(check(evidence)[8]) == 2


def test_a_row_waiting_behind_another_tenants_dead_letter_violates_8() -> None:
    evidence = with_oversized(twins())
    waiting = (Waiting(11, "t"), Waiting(12, "u"))
    evidence.dead_letters = [dead_letter(9, "t", "b", waiting=waiting)]
    assert check(evidence)[8] == [
        "row 12 of tenant u waited behind dead letter 9 of tenant t (key t/b)"
    ]


def test_another_tenants_dead_letter_shown_to_a_key_violates_8() -> None:
    evidence = with_oversized(twins())
    evidence.listed = {"t": {9}, "u": {9}}
    assert check(evidence)[8] == ["tenant u's API key was shown dead letter 9 of tenant t"]


def test_the_shared_keys_plant_refuses_to_arm_once_the_key_functions_were_taken() -> None:
    """Rebound after a module took the real functions, it would be a partial plant."""
    armed_late = (
        "import dispatcher.ledger.events\nfrom devtools.chaos import shared_keys\nshared_keys.arm()"
    )
    done = subprocess.run(
        [sys.executable, "-c", armed_late], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "loaded before the keys were rebound: " in done.stderr
    assert "dispatcher.ledger.events" in done.stderr


def test_a_claim_taken_over_and_ended_by_its_new_holder_keeps_7() -> None:
    log = [
        *completed_log("a")[:3],
        taken_over("a", 3, "w-1", 3),
        claimed("a", 4, "w-2", 5),
        ended("a", 5, "w-2", 5),
        event("a", "tool.call.completed", 6, **{"from": ["accepted"]}, to="completed"),
    ]
    assert unfenced(log) == []
    evidence = clean()
    evidence.events = log
    assert counts(evidence) == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}


def test_a_stale_write_after_another_workers_claim_violates_7() -> None:
    """A zombie's outcome recorded over the claim that took its call over: its fence
    was reduced to the status check, and the call was ``dispatching`` again."""
    evidence = clean()
    evidence.events = [
        *completed_log("a")[:3],
        taken_over("a", 3, "w-1", 3),
        claimed("a", 4, "w-2", 5),
        ended("a", 5, "w-1", 3),  # w-1 woke up; w-2's own answer is fenced out after it
        event("a", "tool.call.completed", 6, **{"from": ["accepted"]}, to="completed"),
    ]
    assert counts(evidence) == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 1, 8: 0, 9: 0, 10: 0}
    [found] = check(evidence)[7]
    assert "by w-1 for its claim at version 3" in found and "held by w-2 at version 5" in found


def test_a_stale_write_over_a_reconcilers_resend_violates_7() -> None:
    log = [
        *completed_log("a")[:3],
        event(
            "a", "tool.call.result_unknown", 3, Producer.RECOVERY,
            **{"from": ["dispatching"]}, to="result_unknown", deadWorker="w-1", claimVersion=3,
        ),
        event(
            "a", "tool.call.redispatched", 4, Producer.RECONCILER,
            **{"from": ["result_unknown"]}, to="dispatching", worker="rec", claimVersion=6,
        ),
        ended("a", 5, "w-1", 3, to="result_unknown"),
    ]  # fmt: skip
    assert len(unfenced(log)) == 1


@pytest.mark.parametrize(
    ("worker", "version"),
    [("w-2", 3), ("w-1", 2)],  # another worker; the right worker, an older claim
)
def test_an_outcome_not_by_the_claims_holder_at_its_version_violates_7(
    worker: str, version: int
) -> None:
    evidence = clean()
    evidence.events = [*completed_log("a")[:3], ended("a", 3, worker, version)]
    evidence.calls = {("t", "a"): call("a", S.ACCEPTED, V.PENDING)}
    assert counts(evidence)[7] == 1


def test_an_outcome_with_no_claim_or_a_takeover_of_none_violates_7() -> None:
    log = [
        *completed_log("a")[:3],
        taken_over("a", 3, "w-1", 3),
        ended("a", 4, "w-1", 3),  # the sweep ended w-1's claim: nothing left to end
    ]
    assert unfenced(log) == ["a: tool.call.accepted by w-1 for its claim at version 3, "
                             "while the call was held by no claim"]  # fmt: skip
    assert len(unfenced([*completed_log("b")[:2], taken_over("b", 2, "w-1", 3)])) == 1


def answer(event_id: str, call_id: str | None = "a", code: str | None = None) -> BusAnswer:
    if code is not None:
        return BusAnswer(event_id, "t", "refused", None, code)
    return BusAnswer(event_id, "t", "accepted", call_id)


def bus_clean() -> Evidence:
    """Call ``a`` submitted over the bus, its event sent twice (two records, both
    answered with it), and a hostile record refused."""
    evidence = clean()
    evidence.bus_kept = {"e-1": 2, "e-h": 1}
    evidence.bus_sent_acked = {"e-1": 2, "e-h": 1}
    evidence.bus_answers = [answer("e-1"), answer("e-1"), answer("e-h", code="validation_failed")]
    evidence.bus_hostile = {"e-h"}
    return evidence


def test_request_records_each_answered_once_keep_10() -> None:
    assert counts(bus_clean()) == {1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 0, 9: 0, 10: 0}
    # A record the broker forgot in a restart after it was answered, or a send that
    # failed without knowing: answered, not kept, within what was sent.
    evidence = bus_clean()
    evidence.bus_kept = {"e-h": 1}
    evidence.bus_sent_acked = {"e-1": 1, "e-h": 1}
    evidence.bus_sent_maybe = {"e-1": 1}
    assert check(evidence)[10] == []
    # One send that made two records (a producer's retry of its batch): both answered.
    evidence = bus_clean()
    evidence.bus_sent_acked = {"e-1": 1, "e-h": 1}
    assert check(evidence)[10] == []


def test_a_kept_record_never_answered_violates_10() -> None:
    evidence = bus_clean()
    evidence.bus_kept = {"e-1": 2, "e-h": 1, "e-lost": 1}
    evidence.bus_sent_acked = {**evidence.bus_sent_acked, "e-lost": 1}
    evidence.bus_answers = [*evidence.bus_answers[1:]]
    assert check(evidence)[10] == [
        "event e-1: 2 record(s) kept, 1 answered: a record never answered",
        "event e-lost: 1 record(s) kept, 0 answered: a record never answered",
    ]


def test_a_record_answered_twice_violates_10() -> None:
    evidence = bus_clean()
    evidence.bus_answers = [*evidence.bus_answers, answer("e-1"), answer("e-stray")]
    assert check(evidence)[10] == [
        "event e-1: 2 record(s) kept, 3 answered, 2 sent: a record answered twice",
        "event e-stray: 0 record(s) kept, 1 answered, 0 sent: a record answered twice",
    ]


def test_one_event_accepted_as_two_calls_or_as_no_call_violates_10() -> None:
    evidence = bus_clean()
    evidence.calls = {**evidence.calls, ("t", "b"): call("b", S.COMPLETED)}
    evidence.bus_answers = [answer("e-1"), answer("e-1", "b"), *evidence.bus_answers[2:]]
    assert check(evidence)[10] == [
        "event e-1: 2 record(s) kept, 2 answered: accepted as 2 calls (a, b)"
    ]
    evidence.bus_answers = [
        answer("e-1"),
        answer("e-1"),
        answer("e-h", code="x"),
        answer("e-2", "gone"),
    ]
    evidence.bus_kept = {**evidence.bus_kept, "e-2": 1}
    assert check(evidence)[10] == [
        "event e-2: 1 record(s) kept, 1 answered: accepted as t/gone, which is no call of the run"
    ]


def test_a_hostile_record_accepted_violates_10() -> None:
    evidence = bus_clean()
    evidence.bus_answers = [*evidence.bus_answers[:2], answer("e-h")]
    assert check(evidence)[10] == [
        "event e-h: 1 record(s) kept, 1 answered: a hostile record accepted as a"
    ]


def test_request_records_at_an_offset_the_broker_gave_twice_are_counted_apart() -> None:
    kept = tally(
        [("t", 0, 0, "e-1"), ("t", 0, 1, None), ("t", 0, 2, "e-1"), ("t", 0, 2, "e-2"),
         ("t", 1, 2, "e-3")]
    )  # fmt: skip
    assert kept.by_event == {"e-1": 1, "e-3": 1}
    assert (kept.unreadable, kept.clashing) == (1, 2)


async def echo_server() -> asyncio.Server:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1024):
            writer.write(data)
            await writer.drain()
        writer.close()

    return await asyncio.start_server(echo, "127.0.0.1", 0)


async def test_proxy_passes_stalls_and_cuts() -> None:
    server = await echo_server()
    proxy = TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    await proxy.start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"ping")
        assert await reader.readexactly(4) == b"ping"

        proxy.set_mode(ProxyMode.STALL)
        writer.write(b"held")
        read = asyncio.ensure_future(reader.readexactly(4))
        done, _ = await asyncio.wait([read], timeout=0.3)
        assert not done  # nothing gets through while stalled
        proxy.set_mode(ProxyMode.PASS)
        assert await read == b"held"  # ... and it arrives once the stall ends

        proxy.set_mode(ProxyMode.CUT)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await reader.readexactly(1)
        writer.close()
        new_reader, new_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
            await new_reader.readexactly(1)  # refused while cut
        new_writer.close()
    finally:
        await proxy.stop()
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "args",
    [
        ["--duration", "-1", "--seed", "1"],
        ["--duration", "10"],
        ["--duration", "10", "--seed", "x"],
        ["--duration", "10", "--seed", "1", "--plant", "nonsense"],
    ],
)
def test_bad_arguments_exit_2_with_one_line(args: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devtools", "chaos", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
