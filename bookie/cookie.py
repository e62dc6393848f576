"""Bookie cookies: the bookie's identity, kept both in ZooKeeper (/ledgers/cookies/<bookie-id>)
and in a COOKIE file on each of its disks (journal dir, ledger dir).

At start the two must agree. A bookie whose disks were wiped or swapped would otherwise come
back empty under an id that ledger metadata says holds entries, silently losing replicas; so
it refuses to start, with a message that says what is wrong. Pure decision function plus a
small I/O shell.
"""

from __future__ import annotations

import enum
import json
import os
import pathlib
import uuid
from dataclasses import dataclass

from pulsarlite.errors import BookieError
from pulsarlite.metadata_layout import COOKIES_PATH, cookie_path

COOKIE_FILE = "COOKIE"


class CookieError(BookieError):
    """The bookie's disks and ZooKeeper disagree about who it is; it must not start."""


@dataclass(frozen=True)
class Cookie:
    bookie_id: str
    instance_id: str
    journal_dir: str
    ledger_dir: str

    def to_json(self) -> bytes:
        return json.dumps(self.__dict__, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, source: str) -> "Cookie":
        try:
            raw = json.loads(data)
            return cls(**{k: str(raw[k]) for k in ("bookie_id", "instance_id", "journal_dir", "ledger_dir")})
        except (ValueError, KeyError, TypeError) as e:
            raise CookieError(f"cookie at {source} is unreadable ({e}); refusing to start") from None


class CookieVerdict(enum.Enum):
    NEW = "new"            # no cookie anywhere: first start, write them
    OK = "ok"              # everything agrees


def judge_cookies(bookie_id: str, in_zookeeper: Cookie | None, on_disks: dict[str, Cookie | None]) -> CookieVerdict:
    """Decide from the cookies found; raises CookieError with the reason when the bookie must
    not start. ``on_disks`` maps a directory to the cookie found there (None: no file)."""
    found = {d: c for d, c in on_disks.items() if c is not None}
    missing = [d for d, c in on_disks.items() if c is None]
    if in_zookeeper is None and not found:
        return CookieVerdict.NEW
    if in_zookeeper is None:
        raise CookieError(
            f"bookie {bookie_id}: its disks carry a cookie but ZooKeeper has none at "
            f"{COOKIES_PATH}/{bookie_id}: wrong ZooKeeper, or the cluster metadata was wiped; refusing to start")
    if missing:
        raise CookieError(
            f"bookie {bookie_id}: ZooKeeper has its cookie but {', '.join(missing)} has none: "
            f"the disk was wiped or swapped, so this bookie would come back without the entries it "
            f"acknowledged; refusing to start (to re-use the id on a new disk, decommission the bookie "
            f"first: delete {COOKIES_PATH}/{bookie_id} once its ledgers are re-replicated)")
    for directory, cookie in found.items():
        if cookie.instance_id != in_zookeeper.instance_id or cookie.bookie_id != bookie_id:
            raise CookieError(
                f"bookie {bookie_id}: the cookie in {directory} belongs to bookie {cookie.bookie_id} "
                f"(instance {cookie.instance_id}), ZooKeeper's to instance {in_zookeeper.instance_id}: "
                f"disks swapped between bookies? refusing to start")
    return CookieVerdict.OK


def read_disk_cookie(directory: str) -> Cookie | None:
    path = pathlib.Path(directory) / COOKIE_FILE
    try:
        return Cookie.from_json(path.read_bytes(), str(path))
    except FileNotFoundError:
        return None


def write_disk_cookie(directory: str, cookie: Cookie) -> None:
    path = pathlib.Path(directory) / COOKIE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        f.write(cookie.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


async def check_and_write_cookies(store, bookie_id: str, journal_dir: str, ledger_dir: str) -> Cookie:
    """Check the cookies (ZooKeeper vs disks) and write them on first start. Disk cookies are
    written before the znode, so a crash in between is refused loudly rather than silently."""
    znode = cookie_path(bookie_id)
    found = await store.get_or_none(znode)
    in_zk = Cookie.from_json(found[0], znode) if found is not None else None
    disks = {journal_dir: read_disk_cookie(journal_dir), ledger_dir: read_disk_cookie(ledger_dir)}
    verdict = judge_cookies(bookie_id, in_zk, disks)
    if verdict is CookieVerdict.OK:
        return in_zk  # type: ignore[return-value]
    cookie = Cookie(bookie_id=bookie_id, instance_id=uuid.uuid4().hex,
                    journal_dir=os.path.abspath(journal_dir), ledger_dir=os.path.abspath(ledger_dir))
    for directory in disks:
        write_disk_cookie(directory, cookie)
    await store.create(znode, cookie.to_json(), make_parents=True)
    return cookie
