"""deploy/: the compose file validates with Debian's docker-compose, every config file it mounts
exists and loads with the process's own loader, and the addresses in those configs agree with
the compose services (no Docker engine runs here: this is what CI can check)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from broker.config import BrokerConfig
from faces.cluster import BOOKIE, BROKER, settings_from_file
from pulsarlite.config import BookieConfig, load_toml

yaml = pytest.importorskip("yaml", reason="PyYAML (a dependency of moto[server]) reads the compose file")

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
COMPOSE = DEPLOY / "docker-compose.yml"
LOADERS = {"bookie": BookieConfig, "broker": BrokerConfig}


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def bind_mounts(service: dict) -> list[tuple[Path, str]]:
    mounts = []
    for volume in service.get("volumes", []):
        source, target = volume.split(":")[:2]
        if source.startswith((".", "/")):
            mounts.append(((DEPLOY / source).resolve(), target))
    return mounts


def test_compose_file_validates_with_docker_compose():
    exe = shutil.which("docker-compose")
    if exe is None:
        pytest.skip("docker-compose is not on PATH (scripts/setup.sh installs Debian's docker-compose)")
    result = subprocess.run([exe, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    # and a broken file is refused (the check can fail)
    broken = COMPOSE.read_text().replace("    depends_on: *broker-depends", "    depends_on: *no-such-anchor")
    result = subprocess.run([exe, "-f", "-", "config", "-q"], input=broken, capture_output=True, text=True,
                            timeout=120, cwd=DEPLOY)
    assert result.returncode != 0


def test_services_images_and_health_checks():
    services = compose()["services"]
    assert {"zookeeper", "bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2", "minio",
            "createbucket"} <= set(services)
    for name, service in services.items():
        image = service["image"]
        assert ":" in image and not image.endswith(":latest"), f"{name}: image {image} is not pinned"
        for dependency in service.get("depends_on", {}):
            assert dependency in services, f"{name} depends on unknown {dependency}"
        if name not in ("createbucket", "bookie-auth-init"):     # one-shot services
            assert "healthcheck" in service, f"{name} has no health check"
    assert services["zookeeper"]["image"].startswith("zookeeper:3.")
    for name in ("bookie-1", "bookie-2", "bookie-3", "broker-1", "broker-2"):
        assert services[name]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert "createbucket" in services["broker-1"]["depends_on"]
    assert "mc mb" in " ".join(services["createbucket"]["command"])
    volumes = set(compose()["volumes"])
    for name, service in services.items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if not source.startswith((".", "/")):
                assert source in volumes, f"{name}: undeclared volume {source}"


def test_every_mounted_config_exists_and_loads():
    services = compose()["services"]
    checked = 0
    bookie_ids = set()
    for name, service in services.items():
        role = name.rsplit("-", 1)[0]
        if role not in LOADERS:
            continue
        command = service["command"]
        assert command[0] == role and command[1] == "--config"
        mounts = dict((target, source) for source, target in bind_mounts(service))
        assert command[2] in mounts, f"{name}: its --config {command[2]} is not mounted"
        source = mounts[command[2]]
        assert source.is_file(), f"{name}: {source} missing"
        config = load_toml(LOADERS[role], source)
        checked += 1
        if role == "bookie":
            host, port = config.effective_bookie_id.rsplit(":", 1)
            assert host == name and int(port) == config.port, f"{name}: bookie_id must be its service name"
            assert any(target == "/var/lib/pulsarlite" for _, target in
                       [(v.split(":")[0], v.split(":")[1]) for v in service["volumes"]])
            assert config.journal_dir.startswith("/var/lib/pulsarlite/")
            bookie_ids.add(config.effective_bookie_id)
        else:
            published = {int(p.split(":")[0]): int(p.split(":")[1]) for p in service["ports"]}
            assert published == {config.port: config.port, config.http_port: config.http_port}
            assert config.zookeeper == "zookeeper:2181" and config.host == "0.0.0.0"
            assert config.offload.tier_uri.startswith("s3://pulsarlite") and "minio:9000" in config.offload.tier_s3_endpoint_url
            assert {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} <= set(service["environment"])
            assert str(config.http_port) in " ".join(service["healthcheck"]["test"])
            assert config.managed_ledger.write_quorum <= len([n for n in services if n.startswith("bookie-")])
    assert checked == 5 and len(bookie_ids) == 3


def test_launcher_reads_the_same_config_files():
    broker = settings_from_file(BROKER, DEPLOY / "conf" / "broker-1.toml")
    assert broker["offload"]["tier_uri"] == "s3://pulsarlite/offload" and "port" not in broker and "zookeeper" not in broker
    # what is left of a bookie's file besides addresses and directories: bookie and ZooKeeper
    # authentication
    assert set(settings_from_file(BOOKIE, DEPLOY / "conf" / "bookie-1.toml")) == {
        "bookie_auth_enabled", "bookie_auth_roles", "bookie_auth_token_secret_key", "bookie_auth_token_file",
        "zookeeper_auth_digest_file"}


def test_dockerfile():
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1] not in ("root", "0")
    assert re.search(r"pip install \"?\.\[lake\]", text)           # pyiceberg and the PostgreSQL driver
    lake_extra = " ".join(tomllib.loads((DEPLOY.parent / "pyproject.toml").read_text())
                          ["project"]["optional-dependencies"]["lake"])
    assert "sql-postgres" in lake_extra
    assert "java" not in text.lower().replace("no java", "")
    root = DEPLOY.parent
    copied = set()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for source in line.split()[:-1]:
            assert (root / source).exists(), f"COPY source {source} missing"
            copied.add(source.rstrip("/"))
    # every package `pip install .` installs is in the image (the console script imports faces)
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in include}
    assert packages and packages <= copied, f"packages not copied into the image: {sorted(packages - copied)}"


@pytest.mark.parametrize("compose_file", ["docker-compose.yml", "docker-compose.secure.yml"])
def test_brokers_share_the_postgres_lake_catalog(compose_file):
    """[lakehouse] both brokers have the lake on, with one catalog: the postgres service's
    database, reached by service name, user and database as the service makes them; the password
    is not in the TOML (libpq reads PGPASSWORD from the broker's environment, the service's)."""
    from urllib.parse import urlsplit

    services = yaml.safe_load((DEPLOY / compose_file).read_text())["services"]
    pg = services["postgres"]
    assert pg["image"].startswith("postgres:") and "pg_isready" in pg["healthcheck"]["test"]
    env = pg["environment"]
    uris = set()
    for name in ("broker-1", "broker-2"):
        service = services[name]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        (config_path,) = [source for source, target in bind_mounts(service) if target == service["command"][2]]
        config = load_toml(BrokerConfig, config_path)
        assert config.offload.lake_enabled
        uri = urlsplit(config.offload.lake_catalog_uri)
        assert uri.scheme == "postgresql+psycopg2" and uri.hostname == "postgres" and uri.port == 5432
        assert uri.username == env["POSTGRES_USER"] and uri.path == "/" + env["POSTGRES_DB"] and uri.password is None
        assert service["environment"]["PGPASSWORD"] == env["POSTGRES_PASSWORD"]
        uris.add(config.offload.lake_catalog_uri)
    assert len(uris) == 1                                                 # one catalog for both
