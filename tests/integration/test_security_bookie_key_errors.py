"""[security] A bookie whose token-key setting is bad refuses to start with one line naming the
key (exit code 2, no traceback), before it touches ZooKeeper or its disks: a real bookie process
against a real ZooKeeper."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from kazoo.client import KazooClient

from pulsarlite.config import BookieConfig, to_toml
from pulsarlite.zk_server import find_free_port

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _rsa_public_pem() -> bytes:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _settings(case: str, d: Path) -> tuple[dict, str]:
    """The bookie's key settings for ``case`` and the key its error must name."""
    (d / "garbage.key").write_bytes(b"this is no key\n")
    (d / "empty.key").write_bytes(b"")
    (d / "rsa.pub").write_bytes(_rsa_public_pem())
    (d / "a-directory").mkdir(exist_ok=True)
    return {
        "secret-not-base64": ({"bookie_auth_token_secret_key": "not base64 !"}, "bookie_auth_token_secret_key"),
        "secret-empty-file": ({"bookie_auth_token_secret_key": f"file://{d}/empty.key"},
                              "bookie_auth_token_secret_key"),
        "secret-unreadable": ({"bookie_auth_token_secret_key": f"file://{d}/a-directory"},
                              "bookie_auth_token_secret_key"),
        "secret-missing-file": ({"bookie_auth_token_secret_key": f"file://{d}/absent.key"},
                                "bookie_auth_token_secret_key"),
        "public-garbage": ({"bookie_auth_token_public_key": str(d / "garbage.key")}, "bookie_auth_token_public_key"),
        "public-wrong-alg": ({"bookie_auth_token_public_key": f"file://{d}/rsa.pub",
                              "bookie_auth_token_public_alg": "ES256"}, "bookie_auth_token_public_alg"),
    }[case]


@pytest.mark.parametrize("case", ["secret-not-base64", "secret-empty-file", "secret-unreadable",
                                  "secret-missing-file", "public-garbage", "public-wrong-alg"])
def test_bad_bookie_token_key_is_one_line_naming_the_key(zk_hosts, tmp_path, case):
    settings, key_name = _settings(case, tmp_path)
    port = find_free_port()
    config = BookieConfig(host="127.0.0.1", port=port, zookeeper=zk_hosts, bookie_auth_enabled=True,
                          journal_dir=str(tmp_path / "journal"), ledger_dir=str(tmp_path / "ledgers"), **settings)
    path = tmp_path / "bookie.toml"
    path.write_text(to_toml(config))
    proc = subprocess.run([sys.executable, "-m", "pulsarlite", "bookie", "--config", str(path)],
                          capture_output=True, text=True, timeout=120, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("pulsarlite bookie:")]
    assert len(lines) == 1 and key_name in lines[0], proc.stderr
    # refused before anything changed: no cookie, no registration, no journal or ledger directory
    assert not (tmp_path / "journal").exists() and not (tmp_path / "ledgers").exists()
    server, chroot = zk_hosts.split("/", 1)
    zk = KazooClient(hosts=server)
    zk.start(timeout=15)
    try:
        assert zk.exists(f"/{chroot}") is None      # the bookie never even made its chroot
    finally:
        zk.stop()
        zk.close()
