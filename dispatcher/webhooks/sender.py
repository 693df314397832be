"""The sender: fans notifications out, then POSTs each due delivery, signed.

One pass (:meth:`Sender.step`) reports new outbox dead letters, removes the dead
deliveries kept long enough (every few minutes), fans notifications out to the
subscriptions this process loaded, then claims as many due deliveries as it has
free slots and starts a POST for each; it does not wait for them. So a receiver that
is slow holds its own slots only (at most ``per_subscription`` of them, and only its
subscription backs off when it fails), never another subscription's deliveries. Each
POST has a total timeout, follows no redirect (the URL is the operator's, not the
receiver's choice), and its result is recorded in its own transaction, fenced by the
claim. A sender killed mid-POST leaves its claims to lapse: they are sent again (at
least once; the ``webhook-id`` lets the receiver drop the copy).

Nothing here logs a body, a URL (it may carry a token) or a secret: a line names the
delivery id, the subscription id and the answer's status or the exception's type.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from dispatcher.metrics import WEBHOOK_ATTEMPTS, WEBHOOK_NOTIFICATIONS
from dispatcher.webhook_settings import WebhookSettings, WebhookSubscription
from dispatcher.webhooks import deliveries, signing, sweeps
from dispatcher.webhooks.backoff import delay
from dispatcher.webhooks.deliveries import Claimed

log = logging.getLogger(__name__)

FAN_OUT_BATCH = 200
PURGE_BATCH = 500
PURGE_EVERY_SECONDS = 300.0
"""How often a sender removes the dead deliveries kept long enough: they expire by the
day, and a pass every second would read the index for nothing."""


@dataclass(slots=True)
class Sender:
    """One process's sender: its subscriptions and secrets as loaded at its start."""

    sessions: async_sessionmaker[AsyncSession]
    settings: WebhookSettings
    owner: str
    http: aiohttp.ClientSession
    subscriptions: dict[str, WebhookSubscription] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    _in_flight: set[asyncio.Task[None]] = field(default_factory=set)
    _per_subscription: Counter[str] = field(default_factory=Counter)
    # When (time.monotonic()) this process last removed expired dead deliveries.
    _purged_at: float | None = None

    @classmethod
    def start(
        cls,
        sessions: async_sessionmaker[AsyncSession],
        settings: WebhookSettings,
        *,
        owner: str,
        http: aiohttp.ClientSession,
    ) -> Sender:
        subs = {s.id: s for s in settings.all_subscriptions()}
        secrets = settings.signing_secrets()
        for missing in sorted(set(subs) - set(secrets)):
            # Its deliveries fail (and end dead) until the secret file appears and the
            # sender restarts: visible, rather than sent unsigned.
            log.error("webhook subscription %s has no signing secret", missing)
        return cls(sessions, settings, owner, http, subs, secrets)

    async def settle_unconfigured(self) -> None:
        """Once, at start: the pending deliveries of subscriptions removed from the
        settings are dead (this process's subscriptions are fixed until it restarts)."""
        async with self.sessions() as session, session.begin():
            killed = await deliveries.kill_unconfigured(session, list(self.subscriptions))
        if killed:
            log.warning("%d pending webhook deliveries of removed subscriptions are dead", killed)

    async def step(self) -> None:
        """One pass: report dead letters, remove expired dead deliveries (now and then),
        fan out, start the due POSTs."""
        async with self.sessions() as session, session.begin():
            await sweeps.report_dead_letters(session)
            await sweeps.forget_gone_dead_letters(session)
        now = time.monotonic()
        if self._purged_at is None or now - self._purged_at >= PURGE_EVERY_SECONDS:
            self._purged_at = now
            await self._purge_dead()
        while await self._fan_out() == FAN_OUT_BATCH:
            pass
        await self._start_due()

    async def _purge_dead(self) -> None:
        """The dead deliveries kept ``dead_kept_days``, removed a batch a transaction."""
        kept = self.settings.dead_kept_days * 86_400
        removed = PURGE_BATCH
        total = 0
        while removed == PURGE_BATCH:
            async with self.sessions() as session, session.begin():
                removed = await deliveries.purge_dead(session, kept_seconds=kept, limit=PURGE_BATCH)
            total += removed
        if total:
            log.info(
                "%d dead webhook deliveries removed, dead for over %g days",
                total,
                self.settings.dead_kept_days,
            )

    async def _fan_out(self) -> int:
        subs = list(self.subscriptions.values())
        async with self.sessions() as session, session.begin():
            read = await deliveries.fan_out(session, subs, limit=FAN_OUT_BATCH)
        for event_type in read:
            WEBHOOK_NOTIFICATIONS.labels(event_type).inc()
        return len(read)

    async def _start_due(self) -> None:
        free = self.settings.concurrency - len(self._in_flight)
        room = {
            sub: self.settings.per_subscription - self._per_subscription[sub]
            for sub in self.subscriptions
        }
        async with self.sessions() as session, session.begin():
            claimed = await deliveries.claim_due(
                session,
                owner=self.owner,
                limit=free,
                lease_seconds=self.settings.lease_seconds,
                room=room,
            )
        for claim in claimed:
            self._per_subscription[claim.subscription_id] += 1
            task = asyncio.create_task(self._deliver(claim), name=f"webhook {claim.delivery_id}")
            self._in_flight.add(task)
            task.add_done_callback(self._in_flight.discard)

    async def drain(self) -> None:
        """Wait for the POSTs in flight (each bounded by its timeout) and their records."""
        if self._in_flight:
            await asyncio.gather(*self._in_flight, return_exceptions=True)

    async def _deliver(self, claim: Claimed) -> None:
        try:
            error = await self._post(claim)
            await self._record(claim, error)
        except Exception:  # one delivery's fault ends neither the loop nor the others
            log.exception("webhook delivery %s: recording failed", claim.delivery_id)
        finally:
            self._per_subscription[claim.subscription_id] -= 1

    async def _post(self, claim: Claimed) -> str | None:
        """None when the receiver took it (2xx), else why not (no secret, no body)."""
        sub = self.subscriptions.get(claim.subscription_id)
        secret = self.secrets.get(claim.subscription_id)
        if sub is None:
            return "subscription no longer configured"
        if secret is None:
            return "subscription has no signing secret"
        headers = signing.headers(secret, webhook_id=claim.delivery_id, body=claim.body)
        timeout = aiohttp.ClientTimeout(total=self.settings.timeout_seconds)
        try:
            async with self.http.post(
                sub.url,
                data=claim.body.encode(),
                headers=headers,
                timeout=timeout,
                allow_redirects=False,
            ) as response:
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            return type(exc).__name__
        return None if 200 <= status < 300 else f"HTTP {status}"

    def _backoff(self, failures: int) -> float:
        s = self.settings
        return delay(failures, initial=s.backoff_initial_seconds, cap=s.backoff_max_seconds)

    async def _record(self, claim: Claimed, error: str | None) -> None:
        s = self.settings
        async with self.sessions() as session, session.begin():
            if error is None:
                await deliveries.record_delivered(session, claim, owner=self.owner)
                result = "delivered"
            else:
                dead = claim.attempts >= s.max_attempts
                await deliveries.record_failed(
                    session,
                    claim,
                    owner=self.owner,
                    error=error,
                    retry_in=self._backoff(claim.attempts),
                    dead=dead,
                )
                await deliveries.back_off_subscription(
                    session, claim.subscription_id, delay_for=self._backoff
                )
                result = "dead" if dead else "failed"
        WEBHOOK_ATTEMPTS.labels(claim.event_type, result).inc()
        level = logging.WARNING if result == "dead" else logging.INFO
        log.log(
            level,
            "webhook delivery %s (subscription %s, attempt %d): %s%s",
            claim.delivery_id,
            claim.subscription_id,
            claim.attempts,
            result,
            f" ({error})" if error else "",
        )
