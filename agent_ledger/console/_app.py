"""The approval console: a Starlette application over a ledger's store."""

from __future__ import annotations

import hashlib
import hmac
import inspect
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final
from urllib.parse import parse_qs

import jinja2
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route

from agent_ledger.approvals import ApprovalRequest, Channel, DecisionAction, NewDecisionAttempt
from agent_ledger.codes import DecisionCode
from agent_ledger.console._identity import Authenticate, Authorize, may_decide
from agent_ledger.console._links import BadLink, verify_link
from agent_ledger.console._slack import SlackInteractivity, SlackSettings
from agent_ledger.console._slack_messages import pretty_json
from agent_ledger.console._templates import TEMPLATES
from agent_ledger.deciding import (
    approval_store,
    decide,
    earlier_round,
    effect_intent,
    expire_overdue,
    refuse,
)
from agent_ledger.decisions import NO_RESULT
from agent_ledger.effects import Effect, JSONValue
from agent_ledger.errors import EffectLedgerPermissionError
from agent_ledger.status import EffectStatus
from agent_ledger.stores.base import EffectQuery, Store
from agent_ledger.stores.saga_base import SagaRecord, SagaStep, SagaStore

__all__ = ["create_app"]

_SAFE_SITES: Final = frozenset({"same-origin", "none"})
_ACTIONS: Final = {a.value: a for a in DecisionAction}
#: At most this many pending effects on the list page.
_PAGE: Final = 200
#: The largest form body a POST may carry (bytes); a larger one gets 413.
MAX_BODY_BYTES: Final = 64 * 1024


class _TooLarge(Exception):
    """A request body over MAX_BODY_BYTES."""


def _store_of(source: object) -> Store:
    store = getattr(source, "store", source)
    if not isinstance(store, Store):
        raise TypeError(f"create_app() takes an EffectLedger or a store, not {source!r}")
    approval_store(store)  # a clear error now rather than on the first click
    return store


def create_app(
    ledger: object,
    *,
    authenticate: Authenticate,
    authorize: Authorize,
    secret: bytes,
    separation_of_duty: bool = False,
    allowed_origins: Iterable[str] = (),
    root_path: str = "",
    slack: SlackSettings | None = None,
) -> Starlette:
    """The console as an ASGI app: mount it (``app.mount("/approvals", console)``,
    passing ``root_path="/approvals"``) or serve it alone (``agent-ledger console``).

    ``ledger``: an ``EffectLedger`` (or its store). ``authenticate``: request ->
    principal (``ProxyHeaderAuth``, ``StaticUsers`` or yours); ``authorize``:
    (principal, tool) -> may decide (``ToolPatterns`` or yours). ``secret``
    (32 bytes or more) signs CSRF tokens and links. ``allowed_origins``: other
    origins whose POSTs are accepted (the console's own always are), e.g. the
    public origin in front of a proxy that rewrites the Host. ``slack``: take
    Slack's button clicks at ``POST /slack/interactivity`` (docs/console.md, Slack).
    """
    if len(secret) < 32:
        raise ValueError("secret must be at least 32 bytes (secrets.token_bytes(32))")
    console = _Console(
        _store_of(ledger),
        authenticate,
        authorize,
        secret,
        separation_of_duty,
        frozenset(allowed_origins),
        root_path.rstrip("/"),
    )
    routes = [
        Route("/", console.pending, methods=["GET", "HEAD"]),
        Route("/effects/{key}", console.receipt, methods=["GET", "HEAD"]),
        Route("/effects/{key}/decide", console.decide, methods=["POST"]),
        Route("/workflows/{workflow_id:path}", console.workflow, methods=["GET", "HEAD"]),
        Route("/links/{token}", console.link, methods=["GET", "HEAD", "POST"]),
    ]
    if slack is not None:
        # Slack's signature authenticates these requests, not `authenticate`.
        clicks = SlackInteractivity(console.store, authorize, slack, separation_of_duty)
        routes.append(Route("/slack/interactivity", clicks.handle, methods=["POST"]))
    return Starlette(routes=routes)


class _Console:
    def __init__(
        self,
        store: Store,
        authenticate: Authenticate,
        authorize: Authorize,
        secret: bytes,
        separation_of_duty: bool,
        allowed_origins: frozenset[str],
        root: str,
    ) -> None:
        self.store = store
        self.approvals = approval_store(store)
        self._authenticate = authenticate
        self._authorize = authorize
        self._secret = secret
        self._separation = separation_of_duty
        self._origins = allowed_origins
        self._root = root
        self._env = jinja2.Environment(
            loader=jinja2.DictLoader(TEMPLATES), autoescape=True, undefined=jinja2.StrictUndefined
        )

    # -- helpers ----------------------------------------------------------------

    def _page(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        context.setdefault("principal", None)
        html = self._env.get_template(name).render(root=self._root, **context)
        return HTMLResponse(html, status_code=status, headers=_NO_STORE)

    def _message(
        self, title: str, message: str, status: int, principal: str | None = None
    ) -> HTMLResponse:
        css = "accepted" if status < 300 else "refused"
        return self._page(
            "message", status, title=title, message=message, css=css, principal=principal
        )

    async def _principal(self, request: Request) -> str | None:
        found = self._authenticate(request)
        if inspect.isawaitable(found):
            found = await found
        return found if isinstance(found, str) and found else None

    def _unauthenticated(self) -> Response:
        response = self._message("Sign in", "You are not signed in.", 401)
        response.headers["WWW-Authenticate"] = 'Basic realm="agent-ledger", charset="UTF-8"'
        return response

    def _csrf(self, scope: str) -> str:
        return hmac.new(self._secret, b"csrf\n" + scope.encode(), hashlib.sha256).hexdigest()

    def _csrf_ok(self, given: str, scope: str) -> bool:
        """The form's token against the expected one, as bytes: any text (non-ASCII
        included) is simply a wrong token, never an error."""
        return hmac.compare_digest(
            given.encode("utf-8", "replace"), self._csrf(scope).encode("ascii")
        )

    async def _allowed(self, principal: str, tool: str) -> bool:
        return await may_decide(self._authorize, principal, tool)

    def _same_origin(self, request: Request) -> bool:
        """A POST from another site is refused: Sec-Fetch-Site where the browser sends
        it, and the Origin header (checked against this console's own origin)."""
        site = request.headers.get("sec-fetch-site")
        if site is not None and site not in _SAFE_SITES:
            return False
        origin = request.headers.get("origin")
        if origin is None:
            return True  # a browser that sends neither header: the CSRF token decides
        own = f"{request.url.scheme}://{request.url.netloc}"
        return origin == own or origin in self._origins

    async def _form(self, request: Request) -> dict[str, str]:
        """The urlencoded form; ``_TooLarge`` past MAX_BODY_BYTES (read no further)."""
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
            raise _TooLarge
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                raise _TooLarge
            chunks.append(chunk)
        body = b"".join(chunks).decode("utf-8", errors="replace")
        return {k: v[0] for k, v in parse_qs(body, keep_blank_values=True).items()}

    async def _effect(self, key: str) -> tuple[Effect | None, ApprovalRequest | None]:
        effect = await self.store.find(key)
        if effect is None:
            return None, None
        request = await self.approvals.approval_request(key)
        if effect.status is EffectStatus.REQUIRES_APPROVAL and _overdue(request):
            # The console denies an expired approval as it reads it.
            await expire_overdue(self.store, only=key)
            effect = await self.store.find(key) or effect
        return effect, request

    # -- pages ------------------------------------------------------------------

    async def pending(self, request: Request) -> Response:
        principal = await self._principal(request)
        if principal is None:
            return self._unauthenticated()
        await expire_overdue(self.store)
        waiting = await self.store.list_effects(
            EffectQuery(status=EffectStatus.REQUIRES_APPROVAL, limit=_PAGE)
        )
        now = datetime.now(UTC)
        rows = []
        for effect in reversed(waiting):  # the longest waiting first
            asked = await self.approvals.approval_request(effect.idem_key)
            rows.append(
                {
                    "effect": effect,
                    "reason": _reason(effect),
                    "waiting": _duration(now - effect.updated_at),
                    "asked_by": _asked_by(effect, asked),
                }
            )
        return self._page("pending", rows=rows, principal=principal)

    async def receipt(
        self,
        request: Request,
        *,
        message: str | None = None,
        accepted: bool = False,
        status: int = 200,
    ) -> Response:
        principal = await self._principal(request)
        if principal is None:
            return self._unauthenticated()
        key = request.path_params["key"]
        effect, asked = await self._effect(key)
        if effect is None:
            return self._message("Not found", "No effect has this key.", 404, principal)
        attempts = await self.approvals.decision_attempts(key)
        return self._page(
            "receipt",
            status,
            principal=principal,
            effect=effect,
            request=asked,
            reason=_reason(effect),
            asked_by=_asked_by(effect, asked),
            intent=effect_intent(effect, asked),
            args=pretty_json(effect.args_canonical),
            history=_history(effect),
            attempts=attempts,
            can_decide=effect.status is EffectStatus.REQUIRES_APPROVAL
            and await self._allowed(principal, effect.tool),
            csrf=self._csrf(principal),
            message=message,
            accepted=accepted,
        )

    async def decide(self, request: Request) -> Response:
        # Another site's form is refused before anything else, signed in or not.
        if not self._same_origin(request):
            return self._message("Refused", "A form from another site may not decide.", 403)
        principal = await self._principal(request)
        if principal is None:
            return self._unauthenticated()
        try:
            form = await self._form(request)
        except _TooLarge:
            return self._too_large(principal)
        if not self._csrf_ok(form.get("csrf", ""), principal):
            return self._message("Refused", "This form has expired: reload the page.", 403)
        key = request.path_params["key"]
        action = _ACTIONS.get(form.get("action", ""))
        if action is None:
            return self._message("Refused", "Choose approve, deny or resolve.", 400, principal)
        effect = await self.store.find(key)
        if effect is None:
            return self._message("Not found", "No effect has this key.", 404, principal)
        note = form.get("note", "").strip() or None
        shown = form.get("intent") or None
        if not await self._allowed(principal, effect.tool):
            attempt = NewDecisionAttempt(key, principal, Channel.CONSOLE, action, shown, note)
            await refuse(self.store, attempt, DecisionCode.NOT_ALLOWED, "not allowed")
            return self._message(
                "Not allowed", f"{principal} may not decide {effect.tool}.", 403, principal
            )
        result: JSONValue = NO_RESULT
        if action is DecisionAction.RESOLVE:
            try:
                result = orjson.loads(form.get("result", ""))
            except orjson.JSONDecodeError:
                return self._message("Refused", "The outcome must be JSON.", 400, principal)
        try:
            outcome = await decide(
                self.store,
                key,
                action=action,
                principal=principal,
                channel=Channel.CONSOLE,
                shown_intent=shown,
                note=note,
                result=result,
                separation_of_duty=self._separation,
            )
        except EffectLedgerPermissionError as refused:
            return self._message("Refused", _database_refused(refused), 403, principal)
        if outcome.accepted:
            # Post/redirect/get: a reload never posts again.
            return RedirectResponse(f"{self._root}/effects/{key}", status_code=303)
        status = 400 if outcome.reason is DecisionCode.NOTE_TOO_LONG else 409
        return await self.receipt(request, message=outcome.message, status=status)

    async def workflow(self, request: Request) -> Response:
        principal = await self._principal(request)
        if principal is None:
            return self._unauthenticated()
        workflow_id = request.path_params["workflow_id"]
        effects = await self.store.list_effects(EffectQuery(workflow_id=workflow_id, limit=1000))
        saga, steps = None, []
        if isinstance(self.store, SagaStore):
            # A saga's id is its block's workflow id (ledger.saga).
            saga = await self.store.get_saga(workflow_id)
            if saga is not None:
                steps = await self.store.saga_steps(workflow_id)
        entries = timeline(effects, saga, steps)
        return self._page(
            "workflow", principal=principal, workflow_id=workflow_id, entries=entries, saga=saga
        )

    async def link(self, request: Request) -> Response:
        token = request.path_params["token"]
        try:
            link = verify_link(self._secret, token)
        except BadLink as bad:
            return self._message("Refused", str(bad), bad.status)
        effect, asked = await self._effect(link.idem_key)
        if effect is None:
            return self._message("Refused", "this link is not valid", 403)
        if request.method != "POST":
            if effect.status is not EffectStatus.REQUIRES_APPROVAL:
                return self._message("Already decided", _decided(effect), 410)
            if earlier_round(effect, asked, link.intent_hash):
                return self._message("Refused", _EARLIER, 410)
            return self._page(
                "link",
                link=link,
                effect=effect,
                args=pretty_json(effect.args_canonical),
                csrf=self._csrf("link\n" + link.nonce),
            )
        if not self._same_origin(request):
            return self._message("Refused", "A form from another site may not decide.", 403)
        try:
            form = await self._form(request)
        except _TooLarge:
            return self._too_large(None)
        if not self._csrf_ok(form.get("csrf", ""), "link\n" + link.nonce):
            return self._message("Refused", "This form has expired: open the link again.", 403)
        note = form.get("note", "").strip() or None
        if not await self._allowed(link.principal, effect.tool):
            attempt = NewDecisionAttempt(
                link.idem_key, link.principal, Channel.LINK, link.action, link.intent_hash, note
            )
            await refuse(self.store, attempt, DecisionCode.NOT_ALLOWED, "not allowed")
            return self._message("Not allowed", "You may not decide this tool.", 403)
        try:
            outcome = await decide(
                self.store,
                link.idem_key,
                action=link.action,
                principal=link.principal,
                channel=Channel.LINK,
                shown_intent=link.intent_hash,
                note=note,
                link=link.used(),
                separation_of_duty=self._separation,
            )
        except EffectLedgerPermissionError as refused:
            return self._message("Refused", _database_refused(refused), 403)
        if outcome.accepted:
            return self._message("Done", f"{link.action.value}d by {link.principal}", 200)
        status = 410 if outcome.reason in _GONE else 403
        if outcome.reason is DecisionCode.NOTE_TOO_LONG:
            status = 400
        return self._message("Refused", outcome.message, status)

    def _too_large(self, principal: str | None) -> Response:
        return self._message(
            "Too large",
            f"A form may carry at most {MAX_BODY_BYTES // 1024} KiB: nothing changed.",
            413,
            principal,
        )


_DATABASE_REFUSALS: Final = {
    "not_an_approver": "the console's database login is not an approver",
    "self_decision": "the database recorded you as the one who asked for this approval",
    "unknown_requester": "nobody is recorded as having asked for this approval, "
    "and separation of duty needs an asker other than the decider",
}


def _database_refused(refused: EffectLedgerPermissionError) -> str:
    """A page's words for a decision the database refused (the PostgreSQL role set)."""
    why = _DATABASE_REFUSALS.get(refused.code or "", "the console's database login may not do this")
    return f"The database refused this decision ({why}): nothing changed."


_GONE: Final = frozenset(
    {
        DecisionCode.LINK_USED,
        DecisionCode.ALREADY_DECIDED,
        DecisionCode.EXPIRED,
        DecisionCode.EARLIER_ATTEMPT,
    }
)
_EARLIER: Final = (
    "this approval was for an earlier attempt: the effect has run since and waits for "
    "a person again. Open the console to read its receipt."
)
_NO_STORE: Final = {"Cache-Control": "no-store", "X-Frame-Options": "DENY"}


def _decided(effect: Effect) -> str:
    from agent_ledger.deciding import already_decided

    return already_decided(effect)


def _overdue(request: ApprovalRequest | None) -> bool:
    return (
        request is not None
        and request.deadline_at is not None
        and request.deadline_at <= datetime.now(UTC)
    )


def _reason(effect: Effect) -> str:
    return "ambiguous attempt" if effect.parked else "policy"


def _asked_by(effect: Effect, request: ApprovalRequest | None) -> str:
    if request is not None and request.requested_by:
        return request.requested_by
    return effect.worker or "—"


def _duration(span: timedelta) -> str:
    seconds = max(int(span.total_seconds()), 0)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    if seconds < 172800:
        return f"{seconds // 3600} h"
    return f"{seconds // 86400} d"


def _history(effect: Effect) -> str:
    return "\n".join(repr(event) for event in effect.history)


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class TimelineEntry:
    """One line of a workflow's timeline: an effect, a model call or a saga step."""

    at: datetime
    #: "effect", "model call" or "saga step".
    kind: str
    effect: Effect | None
    step: SagaStep | None = None
    #: A saga step's compensation effect, once it was recorded.
    undo: Effect | None = None


def timeline(
    effects: Iterable[Effect], saga: SagaRecord | None, steps: Iterable[SagaStep]
) -> list[TimelineEntry]:
    """A workflow's effects (model calls: those with usage) and its saga's steps, in the
    order they were recorded; a step's line shows its effect and its compensation's."""
    by_key = {e.idem_key: e for e in effects}
    steps = list(steps) if saga is not None else []
    # A step's effect and its compensation's are shown on the step's line.
    on_steps = {s.idem_key for s in steps} | {s.compensation_key for s in steps}
    entries = [
        TimelineEntry(e.created_at, "effect" if e.usage is None else "model call", e)
        for e in by_key.values()
        if e.idem_key not in on_steps
    ]
    if saga is not None:
        entries.extend(
            TimelineEntry(
                step.created_at,
                "saga step",
                by_key.get(step.idem_key),
                step,
                None if step.compensation_key is None else by_key.get(step.compensation_key),
            )
            for step in steps
        )
    # A step is recorded before its effect: at equal times it comes first.
    entries.sort(key=lambda e: (e.at, e.kind != "saga step", e.step.position if e.step else 0))
    return entries
