"""The ZooKeeper metadata store: an asyncio bridge over kazoo (docs/protocol.md#zookeeper-layout,
docs/architecture.md#style).

kazoo is threaded. Every operation uses kazoo's ``*_async`` call; its completion is hopped into
the event loop with ``loop.call_soon_threadsafe`` (no thread per call, nothing blocks the loop),
and every wait is bounded by ``operation_timeout_s``. kazoo errors map to the
:mod:`pulsarlite.errors` hierarchy:

- no node -> :class:`MetadataNotFoundError`; node exists -> :class:`MetadataExistsError`;
  bad version -> :class:`MetadataVersionConflict`; node has children -> :class:`MetadataNotEmptyError`;
- connection loss, session expiry, closed client, timeouts -> :class:`MetadataError` (retriable).

Session states reach listeners in the loop as :class:`SessionState`: SUSPENDED means "connection
lost, do not trust ownership" (the session and its ephemeral nodes may still be alive); LOST
means "session expired: ownership and ephemeral nodes are gone". After LOST the store keeps
reconnecting with a new session (CONNECTED follows); owners must re-create their ephemerals.

Every update of shared metadata is a compare-and-set: :meth:`MetadataStore.update` runs a pure
transform in a bounded retry loop.

ZooKeeper authentication (docs/security.md "ZooKeeper"): with a :class:`ZkAuth` digest credential
the session authenticates (``addauth digest user:password``) and every znode it creates gets the
ACL "this credential may do everything; anyone may read" (or "nobody else may even read" with
``read_restricted``). ZooKeeper accepts any digest credential at ``addauth`` (a wrong password is
only refused when used), so :meth:`MetadataStore.connect` checks the credential against the ACL of
pulsarlite's top-level znodes and refuses a credential that is not the one they name; it also
creates those top-level znodes (with the ACL) so nobody else can create them first.
"""

from __future__ import annotations

import asyncio
import base64
import enum
import hashlib
import logging
import random
from dataclasses import dataclass, field
from typing import Any, Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (BadVersionError, ConnectionClosedError, ConnectionLoss,
                              KazooException, NoAuthError, NoChildrenForEphemeralsError,
                              NodeExistsError, NoNodeError, NotEmptyError, OperationTimeoutError,
                              SessionExpiredError, ZookeeperError)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.security import ACL, Id, Permissions

from pulsarlite.errors import ConfigError, MetadataError, MetadataNotFoundError, MetadataVersionConflict
from pulsarlite.metadata_layout import PULSARLITE_ROOTS

log = logging.getLogger(__name__)


class MetadataExistsError(MetadataError):
    """The znode already exists (create without sequence)."""

    retriable = False


class MetadataNotEmptyError(MetadataError):
    """Delete of a znode that has children (use ``recursive=True``)."""

    retriable = False


class MetadataAuthError(MetadataError):
    """ZooKeeper refused the operation (ACL) or the configured credential is not the one the
    cluster's znodes name. Not retriable: the configuration must change."""

    retriable = False


# PULSARLITE_ROOTS (pulsarlite/metadata_layout.py): with a credential they are created at connect
# with its ACL, and the credential is checked against theirs
ZK_DIGEST_BYTES_MAX = 1024


@dataclass(frozen=True)
class ZkAuth:
    """A ZooKeeper digest credential (ZooKeeper's built-in ``digest`` scheme) and the ACL it puts on
    the znodes it creates: ALL for this credential; READ for anyone unless ``read_restricted``.
    The password is kept out of the repr and never logged."""

    user: str
    password: str = field(repr=False)
    read_restricted: bool = False

    @classmethod
    def parse(cls, digest: str, *, read_restricted: bool = False, source: str) -> "ZkAuth":
        """``user:password`` (one line; surrounding whitespace ignored). ConfigError naming
        ``source`` (never the password) when malformed."""
        text = digest.strip()
        user, sep, password = text.partition(":")
        if (not sep or not user or not password or len(text.encode()) > ZK_DIGEST_BYTES_MAX
                or any(c.isspace() for c in user) or "\n" in text):
            raise ConfigError(f"{source}: expected 'user:password' (a non-empty user without ':' or "
                              f"spaces, a non-empty password, one line, at most {ZK_DIGEST_BYTES_MAX} bytes)")
        return cls(user=user, password=password, read_restricted=read_restricted)

    @classmethod
    def from_settings(cls, digest: str, digest_file: str, read_restricted: bool, *,
                      owner: str) -> "ZkAuth | None":
        """The credential of a config's ``zookeeper_auth_digest`` / ``zookeeper_auth_digest_file``
        (the file is read now); None when neither is set. ConfigError on a bad or unreadable value."""
        if digest and digest_file:
            raise ConfigError(f"{owner}: set at most one of zookeeper_auth_digest and zookeeper_auth_digest_file")
        if digest_file:
            try:
                with open(digest_file, "rb") as f:
                    raw = f.read(ZK_DIGEST_BYTES_MAX + 1)
            except OSError as e:
                raise ConfigError(f"{owner}.zookeeper_auth_digest_file: cannot read {digest_file}: {e.strerror}") from None
            try:
                digest = raw.decode()
            except UnicodeDecodeError:
                raise ConfigError(f"{owner}.zookeeper_auth_digest_file {digest_file}: not UTF-8 text") from None
            return cls.parse(digest, read_restricted=read_restricted,
                             source=f"{owner}.zookeeper_auth_digest_file {digest_file}")
        if digest:
            return cls.parse(digest, read_restricted=read_restricted, source=f"{owner}.zookeeper_auth_digest")
        if read_restricted:
            raise ConfigError(f"{owner}: zookeeper_acl_read_restricted needs a credential "
                              f"(zookeeper_auth_digest or zookeeper_auth_digest_file)")
        return None

    @property
    def digest_id(self) -> str:
        """ZooKeeper's id for this credential: ``user:base64(sha1(user:password))``."""
        sha = hashlib.sha1(f"{self.user}:{self.password}".encode()).digest()
        return f"{self.user}:{base64.b64encode(sha).decode()}"

    def auth_data(self) -> list[tuple[str, str]]:
        return [("digest", f"{self.user}:{self.password}")]

    def kazoo_kwargs(self) -> dict:
        """KazooClient arguments: authenticate, and create znodes with this credential's ACL."""
        return {"auth_data": self.auth_data(), "default_acl": self.acl()}

    def acl(self) -> list[ACL]:
        acl = [ACL(Permissions.ALL, Id("digest", self.digest_id))]
        if not self.read_restricted:
            acl.append(ACL(Permissions.READ, Id("world", "anyone")))
        return acl


class SessionState(enum.Enum):
    CONNECTED = "CONNECTED"    # connected; the session (and its ephemerals) is alive
    SUSPENDED = "SUSPENDED"    # connection lost: do not trust ownership until CONNECTED again
    LOST = "LOST"              # session expired: ownership and ephemeral nodes are gone


_FROM_KAZOO = {
    KazooState.CONNECTED: SessionState.CONNECTED,
    KazooState.SUSPENDED: SessionState.SUSPENDED,
    KazooState.LOST: SessionState.LOST,
}


@dataclass(frozen=True)
class NodeStat:
    version: int
    ephemeral_owner: int      # session id of the owner, 0 for a persistent node
    num_children: int
    data_length: int
    ctime_ms: int
    mtime_ms: int


SessionListener = Callable[[SessionState], Any]
ChildrenCallback = Callable[[list[str]], Any]


def split_chroot(hosts: str) -> tuple[str, str]:
    """'h1:1,h2:2/a/b' -> ('h1:1,h2:2', '/a/b'); no chroot -> (hosts, '')."""
    slash = hosts.find("/")
    if slash < 0:
        return hosts, ""
    chroot = "/" + hosts[slash:].strip("/")
    return hosts[:slash], "" if chroot == "/" else chroot


# kazoo (as ZooKeeper's Java client) waits session_timeout / len(hosts) for a server to answer a
# handshake: with one server, a server that accepts the connection but does not answer (a JVM
# starting on a loaded machine) holds the reconnection for the whole session, and the session
# expires although the server came back in time. Each server listed this many times makes that
# wait a fraction of the session, so a reconnection can try again within it.
HANDSHAKE_TRIES_PER_SESSION = 3


def kazoo_hosts(servers: str) -> str:
    """The host list handed to kazoo: ``servers`` ('h1:1,h2:2') repeated
    HANDSHAKE_TRIES_PER_SESSION times (kazoo tries them in turn; a repeated server is simply
    tried again)."""
    return ",".join([servers] * HANDSHAKE_TRIES_PER_SESSION)


def _map_error(exc: BaseException, what: str, path: str) -> BaseException:
    """A kazoo exception as a pulsarlite operating error (others are returned unchanged)."""
    where = f"{what} {path}"
    if isinstance(exc, NoNodeError):
        return MetadataNotFoundError(f"{where}: no such znode")
    if isinstance(exc, NodeExistsError):
        return MetadataExistsError(f"{where}: znode already exists")
    if isinstance(exc, BadVersionError):
        return MetadataVersionConflict(f"{where}: version conflict (znode changed since read)")
    if isinstance(exc, NotEmptyError):
        return MetadataNotEmptyError(f"{where}: znode has children")
    if isinstance(exc, NoAuthError):
        return MetadataAuthError(f"{where}: not authorized by the znode's ACL (set zookeeper_auth_digest "
                                 f"or zookeeper_auth_digest_file to the cluster's ZooKeeper credential; "
                                 f"docs/security.md)")
    if isinstance(exc, NoChildrenForEphemeralsError):
        err = MetadataError(f"{where}: parent is ephemeral and cannot have children")
        err.retriable = False
        return err
    if isinstance(exc, SessionExpiredError):
        return MetadataError(f"{where}: ZooKeeper session expired")
    if isinstance(exc, ConnectionClosedError):
        err = MetadataError(f"{where}: metadata store is closed")
        err.retriable = False
        return err
    if isinstance(exc, (ConnectionLoss, OperationTimeoutError, KazooTimeoutError)):
        return MetadataError(f"{where}: connection to ZooKeeper lost ({type(exc).__name__})")
    if isinstance(exc, (ZookeeperError, KazooException)):
        return MetadataError(f"{where}: ZooKeeper error {type(exc).__name__}: {exc}")
    return exc


class ChildrenWatch:
    """Handle of a :meth:`MetadataStore.watch_children` loop; ``cancel()`` stops it."""

    def __init__(self, task: asyncio.Task) -> None:
        self._task = task

    def cancel(self) -> None:
        self._task.cancel()

    @property
    def done(self) -> bool:
        return self._task.done()


class MetadataStore:
    """Async access to ZooKeeper. Create with ``await MetadataStore.connect(hosts)``; all methods
    must be called from the loop that connected."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop, *,
                 operation_timeout_s: float, hosts: str, auth: ZkAuth | None = None) -> None:
        self._client = client
        self._loop = loop
        self._operation_timeout_s = operation_timeout_s
        self.hosts = hosts
        self.auth = auth                 # the ZooKeeper credential of the session, or None
        self._listeners: list[SessionListener] = []
        self._state = SessionState.CONNECTED
        self._connected = asyncio.Event()
        self._connected.set()
        self._watch_tasks: set[asyncio.Task] = set()
        self._closed = False
        self._random = random.Random()
        client.add_listener(self._kazoo_listener)

    # -- connection ---------------------------------------------------------------------------
    @classmethod
    async def connect(cls, hosts: str, *, session_timeout_ms: int = 10_000,
                      connect_timeout_s: float = 15, operation_timeout_s: float = 30,
                      reconnect_delay_s_max: float | None = None,
                      auth: ZkAuth | None = None) -> "MetadataStore":
        """Connect to ZooKeeper (``hosts`` like ``127.0.0.1:2181`` or ``h1:1,h2:2/chroot``; the
        chroot path is created if missing). Raises MetadataError if no connection is made within
        ``connect_timeout_s``. Reconnection is retried forever, with delays capped at
        ``reconnect_delay_s_max`` (default: a quarter of the session timeout, at most 2 s).
        With ``auth``: the session authenticates with it (again after every reconnection), the
        znodes it creates get ``auth.acl()``, pulsarlite's top-level znodes are created if
        missing, and MetadataAuthError is raised if they belong to another credential."""
        if session_timeout_ms <= 0 or connect_timeout_s <= 0 or operation_timeout_s <= 0:
            raise ValueError("session_timeout_ms, connect_timeout_s and operation_timeout_s must be > 0")
        loop = asyncio.get_running_loop()
        servers, chroot = split_chroot(hosts)
        if not servers:
            raise ValueError(f"no ZooKeeper servers in {hosts!r}")
        if reconnect_delay_s_max is None:
            reconnect_delay_s_max = min(2.0, session_timeout_ms / 4000)
        retry = dict(max_tries=-1, delay=0.05, backoff=2, max_jitter=0.1,
                     max_delay=reconnect_delay_s_max)
        if chroot:
            await asyncio.to_thread(_ensure_chroot, servers, chroot, connect_timeout_s, retry, auth)
        client = KazooClient(hosts=kazoo_hosts(servers) + chroot, timeout=session_timeout_ms / 1000,
                             connection_retry=retry, command_retry=dict(retry, max_tries=3),
                             **_auth_kwargs(auth))
        try:
            await asyncio.to_thread(client.start, connect_timeout_s)
            if auth is not None:
                try:
                    await asyncio.to_thread(_secure_roots, client, auth, hosts)
                except KazooException as e:
                    raise _map_error(e, "secure", "/") from None
        except KazooTimeoutError:
            await asyncio.to_thread(_stop_quietly, client)
            raise MetadataError(f"could not connect to ZooKeeper at {hosts} within {connect_timeout_s}s") from None
        except BaseException:
            await asyncio.to_thread(_stop_quietly, client)
            raise
        return cls(client, loop, operation_timeout_s=operation_timeout_s, hosts=hosts, auth=auth)

    @property
    def session_id(self) -> int | None:
        """The current session id (changes after LOST), None when closed."""
        client_id = self._client.client_id
        return client_id[0] if client_id else None

    @property
    def state(self) -> SessionState:
        return self._state

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_connected(self, timeout_s: float | None = None) -> None:
        """Wait until the state is CONNECTED (bounded by timeout_s; raises MetadataError)."""
        try:
            async with asyncio.timeout(timeout_s if timeout_s is not None else self._operation_timeout_s):
                await self._connected.wait()
        except TimeoutError:
            raise MetadataError(f"not connected to ZooKeeper at {self.hosts} after {timeout_s}s") from None

    async def close(self) -> None:
        """Stop watches, close the session (its ephemeral nodes vanish). Idempotent. No session
        state is delivered to listeners after close begins."""
        if self._closed:
            return
        self._closed = True
        tasks = list(self._watch_tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._client.remove_listener(self._kazoo_listener)
        await asyncio.to_thread(_stop_quietly, self._client)

    async def __aenter__(self) -> "MetadataStore":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    # -- session listeners ------------------------------------------------------------------
    def add_session_listener(self, callback: SessionListener) -> None:
        """``callback(SessionState)`` runs in the loop on every state change; it must not block
        (schedule work with ``asyncio.create_task`` if needed); its exceptions are logged."""
        self._listeners.append(callback)

    def remove_session_listener(self, callback: SessionListener) -> None:
        try:
            self._listeners.remove(callback)
        except ValueError:
            pass

    def _kazoo_listener(self, state: str) -> None:
        # kazoo's connection thread: only hop into the loop, never block here
        session_state = _FROM_KAZOO.get(state)
        if session_state is None:
            return
        try:
            self._loop.call_soon_threadsafe(self._on_session_state, session_state)
        except RuntimeError:  # loop closed
            pass

    def _on_session_state(self, state: SessionState) -> None:
        if self._closed:
            return
        self._state = state
        if state is SessionState.CONNECTED:
            self._connected.set()
        else:
            self._connected.clear()
        for callback in list(self._listeners):
            try:
                callback(state)
            except Exception:
                log.exception("session listener %r failed on %s", callback, state.value)

    # -- the bridge -------------------------------------------------------------------------
    async def _call(self, what: str, path: str, start: Callable[[], Any]) -> Any:
        """Run one kazoo ``*_async`` call; await its result in the loop, bounded."""
        if self._closed:
            err = MetadataError(f"{what} {path}: metadata store is closed")
            err.retriable = False
            raise err
        future = self._loop.create_future()
        loop = self._loop

        def settle(value: Any, exc: BaseException | None) -> None:
            if future.done():
                return
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(value)

        def completion(async_result: Any) -> None:  # kazoo's callback thread
            try:
                value, exc = async_result.get(block=False), None
            except BaseException as e:  # noqa: BLE001 - handed to the loop
                value, exc = None, e
            try:
                loop.call_soon_threadsafe(settle, value, exc)
            except RuntimeError:  # loop closed
                pass

        start().rawlink(completion)
        try:
            async with asyncio.timeout(self._operation_timeout_s):
                return await future
        except TimeoutError:
            raise MetadataError(
                f"{what} {path}: no answer from ZooKeeper within {self._operation_timeout_s}s") from None
        except BaseException as e:
            mapped = _map_error(e, what, path)
            if mapped is e:
                raise
            raise mapped from None

    # -- operations -------------------------------------------------------------------------
    async def get(self, path: str) -> tuple[bytes, int]:
        """(data, version); MetadataNotFoundError if absent."""
        data, stat = await self._call("get", path, lambda: self._client.get_async(path))
        return data, stat.version

    async def get_or_none(self, path: str) -> tuple[bytes, int] | None:
        try:
            return await self.get(path)
        except MetadataNotFoundError:
            return None

    async def stat(self, path: str) -> NodeStat | None:
        """The znode's stat, or None if absent."""
        stat = await self._call("stat", path, lambda: self._client.exists_async(path))
        if stat is None:
            return None
        return NodeStat(version=stat.version, ephemeral_owner=stat.ephemeralOwner,
                        num_children=stat.numChildren, data_length=stat.dataLength,
                        ctime_ms=stat.ctime, mtime_ms=stat.mtime)

    async def exists(self, path: str) -> bool:
        return await self._call("exists", path, lambda: self._client.exists_async(path)) is not None

    async def create(self, path: str, data: bytes = b"", *, ephemeral: bool = False,
                     sequence: bool = False, make_parents: bool = True) -> str:
        """Create a znode and return its path (with the sequence suffix if ``sequence``).
        Parents are created as persistent nodes. MetadataExistsError if it exists."""
        _check_bytes(data, path)
        return await self._call("create", path, lambda: self._client.create_async(
            path, data, ephemeral=ephemeral, sequence=sequence, makepath=make_parents))

    async def set(self, path: str, data: bytes, version: int) -> int:
        """Compare-and-set: write if the znode is at ``version`` (-1: any); returns the new
        version. MetadataVersionConflict or MetadataNotFoundError otherwise."""
        _check_bytes(data, path)
        stat = await self._call("set", path, lambda: self._client.set_async(path, data, version))
        return stat.version

    async def delete(self, path: str, version: int = -1, *, recursive: bool = False) -> None:
        """Delete a znode (at ``version``, -1: any). MetadataNotFoundError if absent;
        MetadataNotEmptyError if it has children and not ``recursive``. With ``recursive``, the
        children are deleted first (whatever their versions); ``version`` applies to ``path``."""
        if recursive:
            for child in await self.children(path):
                try:
                    await self.delete(_join(path, child), recursive=True)
                except MetadataNotFoundError:
                    pass  # deleted concurrently
        await self._call("delete", path, lambda: self._client.delete_async(path, version))

    async def children(self, path: str) -> list[str]:
        """Sorted child names; [] if the znode is absent."""
        try:
            names = await self._call("children", path, lambda: self._client.get_children_async(path))
        except MetadataNotFoundError:
            return []
        return sorted(names)

    async def apply_acl_tree(self, path: str, *, znodes_max: int = 1_000_000) -> int:
        """Give ``path`` and every znode below it this store's ACL (its credential's: connect with
        ``auth``); returns how many znodes were set. For a cluster made before authentication was
        on (its znodes are open: anyone, this store included, may change their ACL). Znodes that
        vanish meanwhile are skipped; at most ``znodes_max`` are visited (MetadataError beyond)."""
        if self.auth is None:
            raise MetadataAuthError("apply_acl_tree needs a store connected with a ZooKeeper credential")
        acl = self.auth.acl()
        pending, done = [path], 0
        while pending:
            node = pending.pop()
            try:
                await self._call("set_acls", node, lambda node=node: self._client.set_acls_async(node, acl))
            except MetadataNotFoundError:
                continue
            done += 1
            if done > znodes_max:
                raise MetadataError(f"apply_acl_tree {path}: more than {znodes_max} znodes")
            pending.extend(_join(node, child) for child in await self.children(node))
        return done

    async def update(self, path: str, transform: Callable[[bytes | None], bytes], *,
                     attempts_max: int = 20) -> tuple[bytes, int]:
        """The CAS loop: read (None if absent), ``transform(current) -> new bytes``, then create
        the znode if it was absent or set it at the version read; on a conflict (or a concurrent
        create/delete) re-read and re-apply. ``transform`` must be pure (it may run several
        times); an exception from it aborts the update and propagates. Returns (new data, new
        version). MetadataVersionConflict after ``attempts_max`` lost races."""
        if attempts_max < 1:
            raise ValueError("attempts_max must be >= 1")
        for attempt in range(attempts_max):
            if attempt:
                # small jittered backoff so contending updaters spread out
                await asyncio.sleep(self._random.uniform(0, min(0.05, 0.002 * (2 ** attempt))))
            current = await self.get_or_none(path)
            new = transform(None if current is None else current[0])
            _check_bytes(new, path)
            try:
                if current is None:
                    await self.create(path, new)
                    return new, 0
                return new, await self.set(path, new, current[1])
            except (MetadataVersionConflict, MetadataExistsError, MetadataNotFoundError):
                continue
        raise MetadataVersionConflict(f"update {path}: gave up after {attempts_max} conflicting attempts")

    # -- watches ----------------------------------------------------------------------------
    async def watch_children(self, path: str, callback: ChildrenCallback) -> ChildrenWatch:
        """Call ``callback(sorted children)`` in the loop now, and again whenever the children
        change (a missing znode counts as no children; rapid changes may be coalesced into one
        call with the latest list; identical consecutive lists are not repeated). The watch is
        re-established after connection loss and session expiry, and ends at ``close()`` or
        ``cancel()`` on the returned handle. Callback exceptions are logged."""
        first = self._loop.create_future()
        task = self._loop.create_task(self._watch_children_loop(path, callback, first),
                                      name=f"watch-children {path}")
        self._watch_tasks.add(task)
        task.add_done_callback(self._watch_done)
        try:
            await asyncio.shield(first)
        except BaseException:
            task.cancel()
            raise
        return ChildrenWatch(task)

    def _watch_done(self, task: asyncio.Task) -> None:
        self._watch_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("children watch %s died", task.get_name(), exc_info=task.exception())

    async def _watch_children_loop(self, path: str, callback: ChildrenCallback,
                                   first: asyncio.Future) -> None:
        last: list[str] | None = None
        try:
            while not self._closed:
                fired = self._loop.create_future()

                def watcher(event: Any, fired: asyncio.Future = fired) -> None:  # kazoo thread
                    try:
                        self._loop.call_soon_threadsafe(_set_if_pending, fired, event)
                    except RuntimeError:
                        pass

                try:
                    names = await self._call("watch children", path,
                                             lambda: self._client.get_children_async(path, watch=watcher))
                except MetadataNotFoundError:
                    names = []
                    # watch for the creation; if it appeared meanwhile, read again at once
                    if await self._call("watch exists", path,
                                        lambda: self._client.exists_async(path, watch=watcher)) is not None:
                        _set_if_pending(fired, None)
                except MetadataError as e:
                    if not e.retriable:
                        raise
                    await asyncio.sleep(0.05)  # the state change may not have reached the loop yet
                    await self._connected.wait()
                    continue
                names = sorted(names)
                if names != last:
                    last = names
                    try:
                        callback(names)
                    except Exception:
                        log.exception("children callback for %s failed", path)
                if not first.done():
                    first.set_result(None)
                await fired
        except BaseException as e:
            if not first.done():
                first.set_exception(e if not isinstance(e, asyncio.CancelledError) else
                                    MetadataError(f"watch children {path}: cancelled"))
            raise


def _set_if_pending(future: asyncio.Future, value: Any) -> None:
    if not future.done():
        future.set_result(value)


def _join(parent: str, child: str) -> str:
    return (parent.rstrip("/") or "") + "/" + child


def _check_bytes(data: object, path: str) -> None:
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"{path}: znode data must be bytes, got {type(data).__name__}")


def _auth_kwargs(auth: ZkAuth | None) -> dict:
    return auth.kazoo_kwargs() if auth is not None else {}


def _secure_roots(client: KazooClient, auth: ZkAuth, hosts: str) -> None:
    """Create pulsarlite's top-level znodes (with ``auth``'s ACL) if missing, and check the
    credential against the ACLs of those that exist: one that names other digest credentials but
    not this one means a wrong credential (MetadataAuthError, at start, rather than NoAuth on the
    first write). Znodes created without an ACL (before authentication was turned on) are named
    in one warning: anyone can still change them."""
    open_paths = []
    for path in PULSARLITE_ROOTS:
        try:
            client.create(path, b"")
        except NodeExistsError:
            pass
        except NoAuthError:
            # the chroot (or "/") refuses: the chroot belongs to another credential
            raise MetadataAuthError(f"ZooKeeper at {hosts}: user {auth.user!r} may not create {path}: the "
                                    f"credential is not the one the cluster's znodes name (wrong "
                                    f"zookeeper_auth_digest?)") from None
        try:
            acls, _ = client.get_acls(path)
        except NoAuthError:   # ZooKeeper 3.6+: reading an ACL needs READ or ADMIN
            raise MetadataAuthError(f"ZooKeeper at {hosts}: user {auth.user!r} may not read the ACL of {path}: "
                                    f"wrong zookeeper_auth_digest (the cluster's znodes were created with "
                                    f"another credential)") from None
        digest_ids = {a.id.id for a in acls if a.id.scheme == "digest"}
        if digest_ids and auth.digest_id not in digest_ids:
            raise MetadataAuthError(f"ZooKeeper at {hosts}: the ACL of {path} does not name user {auth.user!r} "
                                    f"with this password: wrong zookeeper_auth_digest (the cluster's znodes "
                                    f"were created with another credential)")
        if any(a.id.scheme == "world" and a.perms & Permissions.WRITE for a in acls):
            open_paths.append(path)
    if open_paths:
        log.warning("znodes writable by anyone zookeeper=%s paths=%s reason=\"created before ZooKeeper "
                    "authentication was on; see docs/security.md\"", hosts, ",".join(open_paths))


def _ensure_chroot(servers: str, chroot: str, timeout_s: float, retry: dict,
                   auth: ZkAuth | None = None) -> None:
    """Create the chroot path with a short-lived client on the bare servers (kazoo cannot
    create its own chroot when a parent is missing); with ``auth``'s ACL when given."""
    client = KazooClient(hosts=servers, timeout=10.0, connection_retry=retry, **_auth_kwargs(auth))
    try:
        try:
            client.start(timeout_s)
        except KazooTimeoutError:
            raise MetadataError(f"could not connect to ZooKeeper at {servers} within {timeout_s}s") from None
        try:
            client.ensure_path(chroot)
        except KazooException as e:
            raise _map_error(e, "create chroot", chroot) from None
    finally:
        _stop_quietly(client)


def _stop_quietly(client: KazooClient) -> None:
    try:
        client.stop()
    finally:
        client.close()


__all__ = ["MetadataStore", "MetadataExistsError", "MetadataNotEmptyError", "MetadataAuthError",
           "ZkAuth", "SessionState",
           "NodeStat", "ChildrenWatch", "split_chroot"]
