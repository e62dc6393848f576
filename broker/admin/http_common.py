"""What every admin route module (``broker/admin/*_http.py``) shares: reading a request (JSON
body, query flags, integers, names from the path), writing an answer (JSON, 204), and the
redirect of a topic call to the topic's owner.

Every parser raises the errors of :mod:`broker.admin.policies` (BadRequestError 400 for
malformed input, PreconditionFailedError 412 for a value out of range) before anything is
called, so a refused request changed nothing; http.py's error middleware turns them into
``{"reason": "..."}`` answers. Names in paths arrive percent-decoded (aiohttp).
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

from aiohttp import web

from broker.admin.policies import BadRequestError, PreconditionFailedError, check_name
from pulsarlite.topic_name import InvalidTopicNameError, TopicDomain, TopicName, subscription_name_problem

INT64_MAX = 2 ** 63 - 1

# the persistent topic paths, shared by topics_http, subscriptions_http, offload_http, compaction_http
PERSISTENT_NAMESPACE_PATH = "/admin/v2/persistent/{tenant}/{namespace}"
PERSISTENT_TOPIC_PATH = PERSISTENT_NAMESPACE_PATH + "/{topic}"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


# -- reading a request -----------------------------------------------------------------------
async def json_body(request: web.Request, *, required: bool = True) -> Any:
    """The request's JSON body; BadRequestError (400) for anything a client got wrong: an
    unreadable body (a bad Content-Encoding such as broken gzip), an unknown charset, bytes that
    are not in the charset, malformed or too deeply nested JSON."""
    try:
        raw = await request.read()
    except web.HTTPException:
        raise                              # 413: too large (client_max_size)
    except Exception as e:
        raise BadRequestError(f"request body unreadable: {type(e).__name__}: {e}") from None
    charset = request.charset or "utf-8"
    try:
        text = raw.decode(charset)
    except LookupError:
        raise BadRequestError(f"unknown charset {charset!r}") from None
    except UnicodeDecodeError as e:
        raise BadRequestError(f"request body is not valid {charset}: {e.reason} at byte {e.start}") from None
    if not text.strip():
        if required:
            raise BadRequestError("request body is empty: a JSON value is required")
        return None
    try:
        return json.loads(text)
    except RecursionError:
        raise BadRequestError("JSON body nested too deeply") from None
    except ValueError as e:
        raise BadRequestError(f"malformed JSON body: {e}") from None


def bool_query(request: web.Request, name: str, default: bool = False) -> bool:
    """The query parameter ``name`` as true/false (also 1/0); absent or empty: ``default``."""
    value = request.query.get(name)
    if value is None or value == "":
        return default
    lowered = value.lower()
    if lowered in ("true", "1"):
        return True
    if lowered in ("false", "0"):
        return False
    raise BadRequestError(f"query parameter {name} must be true or false, got {value!r}")


def int_value(what: str, value: Any, *, minimum: int, maximum: int = INT64_MAX) -> int:
    """An integer (or a string of one) in [minimum, maximum]: 400 if not an integer, 412 if out
    of range."""
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise BadRequestError(f"{what} must be an integer, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{what} must be an integer, got {value!r}")
    if not minimum <= value <= maximum:
        raise PreconditionFailedError(f"invalid value for {what}: {value} (must be in [{minimum}, {maximum}])")
    return value


def namespace_of(request: web.Request) -> str:
    """``tenant/ns`` from the path's ``{tenant}`` and ``{namespace}``."""
    tenant = check_name("tenant", request.match_info["tenant"])
    ns = check_name("namespace", request.match_info["namespace"])
    return f"{tenant}/{ns}"


def topic_of(request: web.Request, domain: TopicDomain = TopicDomain.PERSISTENT) -> str:
    """The full topic name from the path's ``{tenant}``, ``{namespace}`` and ``{topic}``."""
    try:
        name = TopicName(domain, request.match_info["tenant"], request.match_info["namespace"],
                         request.match_info["topic"])
    except InvalidTopicNameError as e:
        raise BadRequestError(str(e)) from None
    return str(name)


def subscription_of(request: web.Request) -> str:
    """The path's ``{subscription}``, checked as Pulsar checks subscription names."""
    name = request.match_info["subscription"]
    problem = subscription_name_problem(name)
    if problem is not None:
        raise BadRequestError(f"invalid subscription name: {problem}")
    return name


# -- writing an answer -----------------------------------------------------------------------
def json_response(value: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(value), content_type="application/json")


def no_content() -> web.Response:
    return web.Response(status=204)


# -- the topic's owner -----------------------------------------------------------------------
def owner_redirect(backend: Any) -> Callable[[Handler], Handler]:
    """``at_owner(handler)``: like Pulsar's topic-ownership check, a call about a topic another
    broker owns is answered 307 with that broker's admin URL (``backend.admin_redirect_url``,
    read at request time), ``authoritative=true`` added so the owner serves it rather than
    redirecting again; a call with ``authoritative=true`` is served here."""

    async def redirect_to_owner(request: web.Request) -> None:
        if bool_query(request, "authoritative"):
            return
        non_persistent = request.path.startswith("/admin/v2/non-persistent/")
        url = await backend.admin_redirect_url(
            topic_of(request, TopicDomain.NON_PERSISTENT if non_persistent else TopicDomain.PERSISTENT))
        if url is not None:
            raise web.HTTPTemporaryRedirect(url + str(request.rel_url.update_query(authoritative="true")))

    def at_owner(handler: Handler) -> Handler:
        async def wrapped(request: web.Request) -> web.StreamResponse:
            await redirect_to_owner(request)
            return await handler(request)
        return wrapped

    return at_owner


__all__ = ["INT64_MAX", "PERSISTENT_NAMESPACE_PATH", "PERSISTENT_TOPIC_PATH", "Handler", "bool_query", "int_value",
           "json_body", "json_response", "namespace_of", "no_content", "owner_redirect", "subscription_of", "topic_of"]
