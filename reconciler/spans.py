"""The reconciler's spans, each in its call's trace (the parent is the call's stored
context, ``tool_calls.traceparent``): ``reconcile lookup``, ``reconcile compensate``
and ``reconcile redispatch``. The provider requests inside them are the transport's
CLIENT spans (:mod:`dispatcher.provider.spans`), children of these.

Manual spans: no instrumentation knows what a reconciler step is, and each must start
in the context stored with its call, not in the pass's (a pass covers many calls of
many traces).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from dispatcher.tracing import call_attributes, tracer
from kit import telemetry
from reconciler.due import DueCall, about
from reconciler.rulings import Compensated, Escalation, Retry

T = TypeVar("T")


async def in_call_span(
    step: str, work: Callable[..., Awaitable[T]], call: DueCall, *args: Any
) -> T:
    """``work(call, *args)`` inside a ``reconcile <step>`` span of ``call``'s trace;
    just ``work(call, *args)`` when this process exports no traces."""
    if not telemetry.enabled():
        return await work(call, *args)
    attributes = call_attributes(
        {
            "tool_call_id": call.tool_call_id,
            "run_id": call.run_id,
            "capability_id": call.capability_id,
            "status": call.status.value,
        }
    )
    attributes["tool_dispatcher.reconcile_attempt"] = call.reconcile_attempts + 1
    with tracer.start_as_current_span(
        f"reconcile {step}",
        context=telemetry.context_of(call.traceparent),
        attributes=attributes,
    ) as span:
        result = await work(call, *args)
        found = _found(result)
        if found is not None:
            span.set_attribute("tool_dispatcher.reconcile_result", found)
        return result


def _found(result: object) -> str | None:
    """What a step found: a lookup's observation, a compensation's next step, or a
    re-send's ``taken_over`` (another owner had the call)."""
    match result:
        case False:
            return "taken_over"
        case Compensated():
            return "compensated"
        case Retry():
            return "retry"
        case Escalation():
            return "escalate"
        case tuple((_, answer)):
            observation = getattr(answer, "observation", None)
            if observation is not None:
                return str(observation.value)
    return None


async def for_call(step: str, work: Callable[..., Awaitable[T]], call: DueCall, *args: Any) -> T:
    """``work(call, *args)`` in its call's span (:func:`in_call_span`), with the call's
    ids on every log line it writes (:func:`reconciler.due.about`)."""
    return await about(call, in_call_span(step, work, call, *args))
