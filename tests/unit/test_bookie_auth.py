"""The bookie's authentication gate on the REAL bookie server (bookie/server.py over a real
BookieStore and a real TCP listener) and the real BookieClient: with ``bookie_auth_enabled``
every connection must first send an AuthRequest whose token verifies and names an allowed role;
anything else is refused (the reason named, never the token), the connection closed and nothing
changed. With it off an AuthRequest is answered OK and clients that send none are served.
Config validation: auth off on a non-loopback host refuses to start unless explicitly allowed."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import contextlib
import time

import pytest

from bookie._proto import bookie_rpc_pb2 as pb
from bookie.client.bookie_client import BookieClientPool, bookie_credential
from bookie.server import CLOSE_AUTH, BookieServer, BookieService
from bookie.transport import HEADER, RESPONSE_TYPES, FrameDecoder, encode_add_entry, encode_message
from pulsarlite.checksum import entry_checksum
from pulsarlite.config import BookieConfig, LedgerClientConfig, from_mapping
from pulsarlite.errors import BookieUnavailableError, ConfigError
from pulsarlite.tokens import create_token
from test_bookie_fencing import add, free_port
from test_bookie_store import config, started

SECRET = b"k" * 32
OTHER_SECRET = b"o" * 32
SECRET_SETTING = "data:;base64," + base64.b64encode(SECRET).decode()
LEDGER = 21


def token(role: str = "broker", *, key: bytes = SECRET, expiry_s: int | None = None, now_s: float | None = None) -> str:
    return create_token(subject=role, now_s=time.time() if now_s is None else now_s, secret_key=key,
                        expiry_s=expiry_s)


@contextlib.asynccontextmanager
async def bookie(tmp_path, *, auth: bool = True):
    cfg = config(tmp_path / "bookie", host="127.0.0.1", port=free_port(), bookie_auth_enabled=auth,
                 bookie_auth_roles="broker,autorecovery", bookie_auth_token_secret_key=SECRET_SETTING if auth else "")
    store = await started(cfg.validate())
    server = BookieServer(BookieService(store, cfg), cfg)
    await server.start()
    try:
        yield cfg, store, server
    finally:
        await server.stop(1.0)
        await store.close()


def pool_with(token_text: str = "", **kw) -> BookieClientPool:
    return BookieClientPool(LedgerClientConfig(bookie_auth_token=token_text, rpc_timeout_ms=10_000,
                                               read_timeout_ms=10_000, connect_timeout_ms=10_000, **kw))


async def raw_exchange(port: int, frames: list[bytes]) -> list[tuple[int, int, bytes]]:
    """Send ``frames`` in one write on a fresh socket; every frame answered until the bookie closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(frames))
    await writer.drain()
    decoder = FrameDecoder(1 << 24, RESPONSE_TYPES)
    got = []
    try:
        while True:
            data = await asyncio.wait_for(reader.read(65536), 10)
            if not data:
                break
            got += list(decoder.feed(data))
    except ConnectionResetError:
        pass
    writer.close()
    return got


def entry_frame(request_id: int, ledger_id: int, entry_id: int, payload: bytes) -> bytes:
    lac = entry_id - 1
    body = encode_add_entry(ledger_id, entry_id, lac, 0, payload, entry_checksum(ledger_id, entry_id, lac, 0, payload))
    body += pb.AddRequest(request_id=request_id).SerializeToString()
    return HEADER.pack(9 + len(body), pb.FRAME_ADD_REQUEST, request_id) + body


async def test_requests_without_auth_are_refused_and_change_nothing(tmp_path):
    async with bookie(tmp_path) as (cfg, store, server):
        pool = pool_with(token("broker"))
        try:
            client = pool.get(cfg.effective_bookie_id)
            assert await add(client, LEDGER, 0, payload=b"acknowledged") == pb.OK
            # an attacker on the network: overwrite entry 0, delete the ledger, in one write
            got = await raw_exchange(cfg.port, [
                entry_frame(7, LEDGER, 0, b"forged"),
                encode_message(pb.FRAME_DELETE_LEDGER_REQUEST, 8, pb.DeleteLedgerRequest(ledger_id=LEDGER))])
            assert len(got) == 1, got                       # one refusal, then closed
            frame_type, request_id, body = got[0]
            error = pb.ErrorResponse.FromString(body)
            assert (frame_type, request_id, error.code) == (pb.FRAME_ERROR_RESPONSE, 7, pb.AUTHENTICATION_ERROR)
            assert "authentication required" in error.message and "FRAME_ADD_REQUEST" in error.message
            # a delete alone: refused the same way
            got = await raw_exchange(cfg.port, [
                encode_message(pb.FRAME_DELETE_LEDGER_REQUEST, 9, pb.DeleteLedgerRequest(ledger_id=LEDGER))])
            assert [(t, pb.ErrorResponse.FromString(b).code) for t, _, b in got] == \
                [(pb.FRAME_ERROR_RESPONSE, pb.AUTHENTICATION_ERROR)]
            assert server.closes_of(CLOSE_AUTH) == 2
            # nothing changed: the entry as acknowledged, the ledger still there
            r = await client.read(LEDGER, 0, 0)
            assert r.code == pb.OK and [e.payload for e in r.entries] == [b"acknowledged"]
            assert store.ledger_info(LEDGER).exists
        finally:
            await pool.close()


@pytest.mark.parametrize("case", ["wrong key", "expired", "role not allowed", "no credential", "garbage"])
async def test_bad_credentials_are_refused(tmp_path, case, caplog):
    bad = {"wrong key": token(key=OTHER_SECRET), "expired": token(expiry_s=60, now_s=time.time() - 3600),
           "role not allowed": token("somebody"), "no credential": "", "garbage": "not-a-jwt"}[case]
    reason = {"wrong key": "signature does not verify", "expired": "expired", "role not allowed": "not allowed",
              "no credential": "no credential presented", "garbage": "malformed"}[case]
    async with bookie(tmp_path) as (cfg, store, server):
        pool = pool_with(bad)
        try:
            client = pool.get(cfg.effective_bookie_id)
            with pytest.raises(BookieUnavailableError, match="authentication refused") as err:
                await client.read_lac(LEDGER)
            assert reason in str(err.value)
            if bad:
                assert bad not in str(err.value) and bad not in caplog.text
            # a raw AuthRequest gets the AuthResponse with the reason, then the close
            got = await raw_exchange(cfg.port, [
                encode_message(pb.FRAME_AUTH_REQUEST, 1, pb.AuthRequest(method="token" if bad else "",
                                                                         data=bad.encode())),
                encode_message(pb.FRAME_DELETE_LEDGER_REQUEST, 2, pb.DeleteLedgerRequest(ledger_id=LEDGER))])
            assert len(got) == 1 and got[0][0] == pb.FRAME_AUTH_RESPONSE
            answer = pb.AuthResponse.FromString(got[0][2])
            assert answer.code == pb.AUTHENTICATION_ERROR and reason in answer.message
            assert server.closes_of(CLOSE_AUTH) == 2
        finally:
            await pool.close()


async def test_right_token_is_served_once_per_connection(tmp_path, caplog):
    good = token("autorecovery")
    async with bookie(tmp_path) as (cfg, store, server):
        pool = pool_with(good)
        try:
            client = pool.get(cfg.effective_bookie_id)
            for i in range(5):
                assert await add(client, LEDGER, i) == pb.OK
            r = await client.read(LEDGER, 0, 4)
            assert r.code == pb.OK and len(r.entries) == 5
            assert (await client.delete_ledger(LEDGER)).code == pb.OK
            assert server.closes_of(CLOSE_AUTH) == 0
            assert [c.role for c in server._connections] == ["autorecovery"]
            assert good not in caplog.text
            # a second AuthRequest on a connection is a BAD_REQUEST (the first one stands)
            got = await raw_exchange_half(cfg.port, [
                encode_message(pb.FRAME_AUTH_REQUEST, 1, pb.AuthRequest(method="token", data=good.encode())),
                encode_message(pb.FRAME_AUTH_REQUEST, 2, pb.AuthRequest(method="token", data=good.encode())),
                encode_message(pb.FRAME_BOOKIE_INFO_REQUEST, 3, pb.BookieInfoRequest())])
            answers = {rid: (t, b) for t, rid, b in got}
            assert pb.AuthResponse.FromString(answers[1][1]).code == pb.OK
            assert pb.AuthResponse.FromString(answers[2][1]).code == pb.BAD_REQUEST
            assert answers[3][0] == pb.FRAME_BOOKIE_INFO_RESPONSE
        finally:
            await pool.close()


async def test_token_file_is_read_at_each_connection(tmp_path):
    path = tmp_path / "token"
    path.write_text(token(key=OTHER_SECRET) + "\n")
    async with bookie(tmp_path) as (cfg, store, server):
        pool = BookieClientPool(LedgerClientConfig(bookie_auth_token_file=str(path)))
        try:
            client = pool.get(cfg.effective_bookie_id)
            with pytest.raises(BookieUnavailableError, match="signature does not verify"):
                await client.read_lac(LEDGER)
            path.write_text(token("broker") + "\n")              # rotated: the next connection takes it
            assert (await client.read_lac(LEDGER)).code == pb.NO_SUCH_LEDGER
        finally:
            await pool.close()


async def test_auth_off_answers_auth_ok_and_serves_clients_without_it(tmp_path):
    async with bookie(tmp_path, auth=False) as (cfg, store, server):
        pool = pool_with(token("anyone"))
        try:
            assert await add(pool.get(cfg.effective_bookie_id), LEDGER, 0) == pb.OK
        finally:
            await pool.close()
        got = await raw_exchange_half(cfg.port, [
            encode_message(pb.FRAME_READ_LAC_REQUEST, 4, pb.ReadLacRequest(ledger_id=LEDGER))])
        assert got[0][0] == pb.FRAME_READ_LAC_RESPONSE and pb.ReadLacResponse.FromString(got[0][2]).code == pb.OK


async def raw_exchange_half(port: int, frames: list[bytes]) -> list[tuple[int, int, bytes]]:
    """As raw_exchange, half-closing after the frames (the bookie then closes after answering)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(frames))
    writer.write_eof()
    decoder = FrameDecoder(1 << 24, RESPONSE_TYPES)
    got = []
    while data := await asyncio.wait_for(reader.read(65536), 10):
        got += list(decoder.feed(data))
    writer.close()
    return got


# -- configuration ---------------------------------------------------------------------------------
def test_auth_off_on_a_public_host_refuses_to_start(tmp_path):
    base = {"journal_dir": str(tmp_path / "j"), "ledger_dir": str(tmp_path / "l")}
    with pytest.raises(ConfigError, match="not a loopback address and bookie_auth_enabled is false"):
        from_mapping(BookieConfig, {**base, "host": "0.0.0.0"})
    with pytest.raises(ConfigError, match="bookie_auth_insecure_allow"):
        from_mapping(BookieConfig, {**base, "host": "10.1.2.3"})
    assert from_mapping(BookieConfig, {**base, "host": "0.0.0.0", "bookie_auth_insecure_allow": True})
    for host in ("127.0.0.1", "127.0.0.5", "localhost", "::1"):
        assert from_mapping(BookieConfig, {**base, "host": host}).host == host
    with pytest.raises(ConfigError, match="exactly one of bookie_auth_token_secret_key"):
        from_mapping(BookieConfig, {**base, "host": "0.0.0.0", "bookie_auth_enabled": True})
    cfg = from_mapping(BookieConfig, {**base, "host": "0.0.0.0", "bookie_auth_enabled": True,
                                      "bookie_auth_token_secret_key": SECRET_SETTING,
                                      "bookie_auth_token": "tok-secret-xyz"})
    assert SECRET_SETTING not in repr(cfg) and "tok-secret-xyz" not in repr(cfg)
    assert "tok-secret-xyz" not in repr(cfg.ledger_client_config())
    assert bookie_credential(cfg.ledger_client_config()) == ("token", b"tok-secret-xyz")
    with pytest.raises(ConfigError, match="bookie_auth_token_secret_key: neither"):
        BookieServer(None, BookieConfig(bookie_auth_enabled=True, bookie_auth_token_secret_key="!! not a key"))


def test_client_credential_forms(tmp_path):
    assert bookie_credential(LedgerClientConfig()) == ("", b"")
    (tmp_path / "t").write_text(" abc.def.ghi \n")
    assert bookie_credential(LedgerClientConfig(bookie_auth_token_file=str(tmp_path / "t"))) == ("token", b"abc.def.ghi")
    with pytest.raises(BookieUnavailableError, match="cannot read"):
        bookie_credential(LedgerClientConfig(bookie_auth_token_file=str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="at most one"):
        LedgerClientConfig(bookie_auth_token="a", bookie_auth_token_file="b").validate()


async def test_a_read_only_role_reads_but_cannot_write_delete_or_fence(tmp_path):
    async with bookie(tmp_path) as (cfg, store, server):
        writer = pool_with(token("broker"))
        reader_cfg = dataclasses.replace(cfg, bookie_auth_roles="broker,spark", bookie_auth_read_only_roles="spark")
        read_only_server = BookieServer(server.service, dataclasses.replace(reader_cfg, port=free_port()))
        await read_only_server.start()
        reader = BookieClientPool(LedgerClientConfig(bookie_auth_token=token("spark")))
        try:
            assert await add(writer.get(cfg.effective_bookie_id), LEDGER, 0, payload=b"acknowledged") == pb.OK
            client = reader.get(f"127.0.0.1:{read_only_server._config.port}")
            r = await client.read(LEDGER, 0, 0)
            assert r.code == pb.OK and r.entries[0].payload == b"acknowledged" and not r.fenced
            assert (await client.read_lac(LEDGER)).code == pb.OK
            assert await add(client, LEDGER, 0, payload=b"forged") == pb.NOT_AUTHORIZED
            assert await add(client, LEDGER, 1) == pb.NOT_AUTHORIZED
            assert (await client.delete_ledger(LEDGER)).code == pb.NOT_AUTHORIZED
            assert (await client.read(LEDGER, 0, 0, fence=True)).code == pb.NOT_AUTHORIZED
            assert (await client.read_lac(LEDGER, fence=True)).code == pb.NOT_AUTHORIZED
            assert read_only_server.closes_of("read-only role") == 5
            info = store.ledger_info(LEDGER)
            assert info.exists and not info.fenced and info.last_entry_id == 0
            r = await client.read(LEDGER, 0, 0)
            assert r.entries[0].payload == b"acknowledged"
            # an AuthRequest and an add in one write: the add is refused too (not served by the
            # handlers the connection had before it authenticated)
            frames = [encode_message(pb.FRAME_AUTH_REQUEST, 1, pb.AuthRequest(method="token", data=token("spark").encode())),
                      entry_frame(2, LEDGER, 5, b"x")]
            got = await raw_exchange_half(read_only_server._config.port, frames)
            answers = {rid: (t, b) for t, rid, b in got}
            assert [r.code for r in pb.AddResponse.FromString(answers[2][1]).results] == [pb.NOT_AUTHORIZED]
            assert store.ledger_info(LEDGER).last_entry_id == 0
        finally:
            await reader.close()
            await writer.close()
            await read_only_server.stop(1.0)
