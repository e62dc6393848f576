"""Client connection defaults (pulsarlite/client_config.py) and the pure parts of
`pulsarlite admin` (size/time arguments, offload-by-size, output formats)."""

from __future__ import annotations

import argparse
import json

import pytest

from faces import cli_admin
from pulsarlite.client_config import (DEFAULT_ADMIN_URL, DEFAULT_SERVICE_URL, ClientConfig, add_connection_flags,
                                      load_client_config, parse_client_conf, resolve_connection)
from pulsarlite.errors import ConfigError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_connection_flags(p)
    return p


def _write(tmp_path, text: str, name: str = "client.conf") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- client.conf -------------------------------------------------------------------------------
def test_defaults_when_nothing_is_set(tmp_path):
    cfg = load_client_config(env={"HOME": str(tmp_path)})
    assert cfg == ClientConfig(DEFAULT_SERVICE_URL, DEFAULT_ADMIN_URL)
    assert cfg.source == "default"


def test_parse_pulsar_style_file(tmp_path):
    path = _write(tmp_path, """
# Pulsar's client.conf keys
webServiceUrl=http://10.0.0.5:8080/
brokerServiceUrl = pulsar://10.0.0.5:6650
authPlugin=
tlsAllowInsecureConnection=false
""")
    cfg = load_client_config(path, env={"HOME": str(tmp_path)})
    assert cfg.service_url == "pulsar://10.0.0.5:6650"
    assert cfg.admin_url == "http://10.0.0.5:8080"  # trailing slash dropped
    assert cfg.source == path
    # [security] keys are read into their fields (an empty value: not set)
    assert cfg.properties == {}
    assert cfg.auth_plugin == "" and cfg.tls_allow_insecure_connection is False


def test_multi_host_service_url(tmp_path):
    cfg = load_client_config(_write(tmp_path, "brokerServiceUrl=pulsar://a:6650,b:6651\n"), env={})
    assert cfg.service_url == "pulsar://a:6650,b:6651"
    assert cfg.admin_url == DEFAULT_ADMIN_URL  # unset keys keep the default


def test_precedence_flag_over_file_over_env_over_default(tmp_path):
    path = _write(tmp_path, "webServiceUrl=http://file:1\n")
    env = {"PULSARLITE_ADMIN_URL": "http://env:2", "PULSARLITE_SERVICE_URL": "pulsar://env:3"}
    p = _parser()
    # flag wins over everything
    cfg = resolve_connection(p.parse_args(["--client-conf", path, "--admin-url", "http://flag:4"]), env=env)
    assert cfg.admin_url == "http://flag:4"
    # file wins over env; env fills what the file leaves out
    cfg = resolve_connection(p.parse_args(["--client-conf", path]), env=env)
    assert (cfg.admin_url, cfg.service_url) == ("http://file:1", "pulsar://env:3")
    # env wins over default
    cfg = resolve_connection(p.parse_args([]), env={**env, "HOME": str(tmp_path)})
    assert (cfg.admin_url, cfg.service_url) == ("http://env:2", "pulsar://env:3")
    # --service-url flag
    cfg = resolve_connection(p.parse_args(["--service-url", "pulsar://flag:5"]), env={"HOME": str(tmp_path)})
    assert cfg.service_url == "pulsar://flag:5"


def test_conf_path_from_env_variable(tmp_path):
    path = _write(tmp_path, "brokerServiceUrl=pulsar://viaenv:6650\n")
    cfg = resolve_connection(_parser().parse_args([]), env={"PULSARLITE_CLIENT_CONF": path})
    assert cfg.service_url == "pulsar://viaenv:6650"
    assert cfg.source == path


def test_default_path_file_is_read(tmp_path):
    (tmp_path / ".config" / "pulsarlite").mkdir(parents=True)
    (tmp_path / ".config" / "pulsarlite" / "client.conf").write_text("webServiceUrl=http://home:9\n")
    assert load_client_config(env={"HOME": str(tmp_path)}).admin_url == "http://home:9"


def test_explicit_missing_file_is_an_error(tmp_path):
    missing = str(tmp_path / "nope.conf")
    with pytest.raises(ConfigError, match="does not exist"):
        load_client_config(missing, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_client_config(env={"PULSARLITE_CLIENT_CONF": missing})


@pytest.mark.parametrize("text, match", [
    ("webServiceUrl http://x:1\n", r":1: expected key=value"),
    ("=value\n", r":1: expected key=value"),
    ("brokerServiceUrl=http://x:6650\n", "brokerServiceUrl.*not a pulsar://"),
    ("webServiceUrl=pulsar://x:8080\n", "webServiceUrl.*not an http://"),
    ("webServiceUrl=http://x:99999\n", "bad port"),
    ("brokerServiceUrl=pulsar://:6650\n", "no host"),
    ("webServiceUrl=\n# ok\nbrokerServiceUrl=pulsar://h:abc\n", "bad port"),
])
def test_bad_file_gives_a_clear_error(tmp_path, text, match):
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=match):
        load_client_config(path, env={})


def test_binary_file_is_a_clear_error(tmp_path):
    path = tmp_path / "bin.conf"
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot be read"):
        load_client_config(str(path), env={})


def test_bad_flag_and_bad_env_are_errors(tmp_path):
    with pytest.raises(ConfigError, match="--admin-url"):
        resolve_connection(_parser().parse_args(["--admin-url", "localhost:8080"]), env={"HOME": str(tmp_path)})
    with pytest.raises(ConfigError, match="PULSARLITE_SERVICE_URL"):
        load_client_config(env={"PULSARLITE_SERVICE_URL": "tcp://x:1"})


def test_parse_client_conf_skips_comments_and_blank_lines():
    assert parse_client_conf("\n# c\n  a = b=c \n\n") == {"a": "b=c"}


# -- admin argument values ---------------------------------------------------------------------
@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("4096", 4096), ("10k", 10 * 1024), ("10K", 10 * 1024), ("10M", 10 * 1024 ** 2),
    ("10m", 10 * 1024 ** 2), ("16G", 16 * 1024 ** 3), ("3T", 3 * 1024 ** 4), ("-1", -1),
])
def test_parse_size(text, expected):
    assert cli_admin.parse_size_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "M", "10X", "1.5G", "-2", "10 M", "ten"])
def test_parse_size_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="invalid size"):
        cli_admin.parse_size_bytes(text)


@pytest.mark.parametrize("text, expected", [
    ("30", 30), ("30s", 30), ("10m", 600), ("3h", 3 * 3600), ("2d", 2 * 86400), ("1w", 7 * 86400),
    ("1y", 365 * 86400), ("-1", -1), ("0", 0),
])
def test_parse_time(text, expected):
    assert cli_admin.parse_time_s(text) == expected


@pytest.mark.parametrize("text", ["", "h", "3H", "1.5h", "-5", "3 h", "3hours"])
def test_parse_time_rejects(text):
    with pytest.raises(argparse.ArgumentTypeError, match="invalid time"):
        cli_admin.parse_time_s(text)


def test_retention_body_converts_like_pulsar_admin():
    body = cli_admin._retention_body(argparse.Namespace(size=cli_admin.parse_size_bytes("10M"),
                                                        time=cli_admin.parse_time_s("3h")))
    assert body == {"retentionTimeInMinutes": 180, "retentionSizeInMB": 10}
    body = cli_admin._retention_body(argparse.Namespace(size=-1, time=-1))
    assert body == {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1}


def test_bad_arguments_exit_2(capsys):
    from faces.cli import main
    for argv in (["admin", "namespaces", "set-retention", "a/b", "--size", "10X", "--time", "1h"],
                 ["admin", "topics", "create-partitioned-topic", "t", "-p", "0"],
                 ["admin", "tenants", "nosuch"]):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2
    # names are checked before any request (no broker at this URL): exit 2, not 1
    assert main(["admin", "--admin-url", "http://127.0.0.1:1", "topics", "stats", "a/b"]) == 2
    assert "invalid short topic name" in capsys.readouterr().err
    assert main(["admin", "--admin-url", "http://127.0.0.1:1", "namespaces", "create", "a/b/c"]) == 2
    assert main(["admin", "--admin-url", "nope", "tenants", "list"]) == 2


def test_unreachable_admin_exits_1(capsys):
    from faces.cli import main
    from pulsarlite.zk_server import find_free_port
    assert main(["admin", "--admin-url", f"http://127.0.0.1:{find_free_port()}", "tenants", "list"]) == 1
    err = capsys.readouterr().err
    assert "cannot reach the admin service" in err and len(err.strip().splitlines()) == 1


# -- offload by size: pulsar-admin's findFirstLedgerWithinThreshold ----------------------------
def _ledgers(*sizes: int) -> list[dict]:
    return [{"ledgerId": i, "entries": 10, "size": s} for i, s in enumerate(sizes)]


def test_first_kept_ledger():
    ledgers = _ledgers(1000, 2000, 3000)
    assert cli_admin.first_kept_ledger(ledgers, 2 ** 63 - 1) is None
    assert cli_admin.first_kept_ledger(ledgers, 0) == 2
    assert cli_admin.first_kept_ledger(ledgers, 1000) == 2
    assert cli_admin.first_kept_ledger(ledgers, 3000) == 2       # 3000 is not more than 3000
    assert cli_admin.first_kept_ledger(ledgers, 3001) == 2
    assert cli_admin.first_kept_ledger(ledgers, 5000) == 1       # 3000+2000 fits: keep 1 and 2
    assert cli_admin.first_kept_ledger(ledgers, 5001) == 1       # +1000 = 6000 > 5001: offload ledger 0
    assert cli_admin.first_kept_ledger(ledgers, 5999) == 1
    assert cli_admin.first_kept_ledger(ledgers, 6000) is None
    assert cli_admin.first_kept_ledger([], 0) is None


def test_first_kept_ledger_uses_current_ledger_size():
    ledgers = _ledgers(1000, 2000, 0)   # the open ledger's size is only in currentLedgerSize
    assert cli_admin.first_kept_ledger(ledgers, 2500) == 1
    assert cli_admin.first_kept_ledger(ledgers, 2500, current_ledger_bytes=3000) == 2


# -- output ------------------------------------------------------------------------------------
def test_emit_formats(capsys):
    cli_admin.emit(["a", "b"], None)
    assert capsys.readouterr().out == "a\nb\n"
    cli_admin.emit(["a", "b"], "json")
    assert json.loads(capsys.readouterr().out) == ["a", "b"]
    cli_admin.emit({"x": 1, "y": {"z": [1, 2]}}, "table")
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["KEY", "VALUE"]
    assert out[1].split() == ["x", "1"] and out[2].split() == ["y.z", "[1,", "2]"]
    cli_admin.emit(cli_admin.NO_CONTENT, None)
    cli_admin.emit(cli_admin.NO_CONTENT, "json")
    assert capsys.readouterr().out == ""
    cli_admin.emit(None, None)  # a JSON null answer (e.g. no retention policy set)
    assert capsys.readouterr().out == "null\n"
    cli_admin.emit(True, None)
    assert capsys.readouterr().out == "true\n"


def test_table_of_rows():
    text = cli_admin.format_table([{"a": 1, "b": "x"}, {"a": 22, "c": None}])
    assert text.splitlines() == ["A   B  C", "1   x", "22     null"]


# -- the admin HTTP client: redirects and error bodies (a local HTTP server on 127.0.0.1) --------
class _Server:
    """A tiny threaded HTTP server whose handler is a function of (method, path, body)."""

    def __init__(self, respond):
        import http.server
        import threading

        outer = self
        self.seen: list[tuple[str, str, bytes]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                outer.seen.append((self.command, self.path, body))
                status, headers, payload = respond(self.command, self.path, body, outer)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_DELETE = _any

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server_factory():
    servers = []

    def make(respond):
        s = _Server(respond)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def test_redirect_keeps_method_and_body(server_factory):
    owner = server_factory(lambda m, p, b, s: (204, {}, b""))
    front = server_factory(lambda m, p, b, s: (307, {"Location": owner.url + p + "?authoritative=true"}, b""))
    client = cli_admin.AdminClient(front.url)
    assert client.request("PUT", "/admin/v2/persistent/a/b/t/subscription/s", "earliest") is cli_admin.NO_CONTENT
    assert owner.seen == [("PUT", "/admin/v2/persistent/a/b/t/subscription/s?authoritative=true", b'"earliest"')]


def test_redirect_loop_is_bounded(server_factory):
    loop = server_factory(lambda m, p, b, s: (307, {"Location": s.url + "/again"}, b""))
    with pytest.raises(cli_admin.AdminHttpError, match="redirects"):
        cli_admin.AdminClient(loop.url).get("/x")
    assert len(loop.seen) == cli_admin.REDIRECTS_MAX + 1


def test_error_reason_from_json_or_first_line(server_factory):
    def respond(m, p, b, s):
        if p == "/json":
            return 412, {"Content-Type": "application/json"}, b'{"reason": "Offload already running"}'
        return 500, {}, b"proxy exploded\nstack trace line\n"

    srv = server_factory(respond)
    client = cli_admin.AdminClient(srv.url)
    with pytest.raises(cli_admin.AdminHttpError) as e:
        client.get("/json")
    assert (e.value.status, e.value.reason) == (412, "Offload already running")
    with pytest.raises(cli_admin.AdminHttpError) as e:
        client.get("/text")
    assert (e.value.status, e.value.reason) == (500, "proxy exploded")


def test_cli_prints_one_line_and_exits_1_on_http_error(server_factory, capsys):
    from faces.cli import main
    srv = server_factory(lambda m, p, b, s: (404, {}, b'{"reason": "Tenant nope does not exist"}'))
    assert main(["admin", "--admin-url", srv.url, "namespaces", "create", "nope/ns"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pulsarlite admin: Tenant nope does not exist (HTTP 404, PUT /admin/v2/namespaces/nope/ns)"]
    assert srv.seen == [("PUT", "/admin/v2/namespaces/nope/ns", b"")]


def test_offload_command_puts_the_first_kept_ledger(server_factory, capsys):
    from faces.cli import main

    def respond(m, p, b, s):
        if p.endswith("/internalStats"):
            stats = {"currentLedgerSize": 300, "ledgers": [
                {"ledgerId": 3, "size": 100}, {"ledgerId": 7, "size": 200}, {"ledgerId": 9, "size": 0}]}
            return 200, {"Content-Type": "application/json"}, json.dumps(stats).encode()
        return 204, {}, b""

    srv = server_factory(respond)
    assert main(["admin", "--admin-url", srv.url, "topics", "offload", "-s", "500", "t/n/x"]) == 0
    assert "before 7:0:-1" in capsys.readouterr().out
    method, path, body = srv.seen[-1]
    assert (method, path) == ("PUT", "/admin/v2/persistent/t/n/x/offload")
    assert json.loads(body) == {"ledgerId": 7, "entryId": 0, "partitionIndex": -1}
