"""deploy/grafana/dashboards/pulsarlite.json queries only metrics that exist: a real broker (with
a file:// tier) and a real bookie are started, a topic is produced to and consumed, and every
metric name the dashboard's PromQL names is found on their /metrics. The provisioning files
agree with the dashboard (datasource uid) and the compose file (mounts, scrape targets)."""

from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")
yaml = pytest.importorskip("yaml", reason="PyYAML (a dependency of moto[server]) reads the provisioning files")

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "pulsarlite.json"
METRIC_PREFIXES = ("pulsar_", "pulsarlite_", "bookie_", "bookkeeper_", "auditor_", "replication_worker_")
# what else a dashboard expression may name: PromQL functions, aggregations, keywords, labels
PROMQL_WORDS = {"sum", "max", "min", "avg", "topk", "rate", "irate", "increase", "histogram_quantile", "by",
                "without", "le", "instance", "namespace", "topic", "success", "cluster", "__rate_interval"}


def dashboard_exprs(dashboard: dict) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def metric_names(expr: str) -> set[str]:
    """The metric names of a PromQL expression (strings and label values removed first);
    ValueError for a word that is neither a known PromQL word nor a pulsarlite metric."""
    bare = re.sub(r'"[^"]*"', "", expr)
    names = set()
    for word in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare):
        if word.startswith(METRIC_PREFIXES):
            names.add(word)
        elif word not in PROMQL_WORDS:
            raise ValueError(f"unknown word {word!r} in {expr!r}")
    return names


def test_metric_names_extraction_can_fail():
    assert metric_names('sum by (le) (rate(bookie_x_bucket{success="true"}[$__rate_interval]))') == {"bookie_x_bucket"}
    with pytest.raises(ValueError):
        metric_names("sum(rate(no_such_metric_total[1m]))")


def scrape(url: str) -> set[str]:
    with urllib.request.urlopen(url, timeout=30) as resp:
        text = resp.read().decode()
    return {sample.name for family in text_string_to_metric_families(text) for sample in family.samples}


def test_provisioning_agrees_with_dashboard_and_compose():
    dashboard = json.loads(DASHBOARD.read_text())
    datasource = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    uids = {d["uid"] for d in datasource["datasources"]}
    assert {p["datasource"]["uid"] for p in dashboard["panels"] if "datasource" in p} <= uids
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())["services"]
    assert "./grafana/dashboards:/var/lib/grafana/dashboards:ro" in compose["grafana"]["volumes"]
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/pulsarlite.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    scrape_config = yaml.safe_load((DEPLOY / "prometheus/prometheus.yml").read_text())
    targets = {t for job in scrape_config["scrape_configs"] for c in job["static_configs"] for t in c["targets"]}
    from broker.config import BrokerConfig
    from pulsarlite.config import BookieConfig, load_toml
    expected = set()
    for name in compose:
        role = name.rsplit("-", 1)[0]
        if role == "broker":
            expected.add(f"{name}:{load_toml(BrokerConfig, DEPLOY / 'conf' / f'{name}.toml').http_port}")
        elif role == "bookie":
            port = load_toml(BookieConfig, DEPLOY / "conf" / f"{name}.toml").metrics_port
            assert port, f"{name}: no metrics_port: Prometheus could not scrape it"
            expected.add(f"{name}:{port}")
    assert targets == expected


def test_every_dashboard_metric_exists_on_a_running_broker_and_bookie(cluster_factory, tmp_path):
    tier = tmp_path / "tier"
    tier.mkdir()
    cluster = cluster_factory(1, brokers=1, broker_overrides={
        "ensemble_size": 1, "write_quorum": 1, "ack_quorum": 1, "tier_uri": f"file://{tier}",
        "rollover_entries_max": 3})
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        consumer = client.subscribe("persistent://public/default/dash", "s",
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer("persistent://public/default/dash", batching_enabled=False)
        for i in range(5):
            producer.send(b"m%d" % i)
        consumer.receive(timeout_millis=30_000)
        bookie = cluster.status()["processes"]
        bookie_port = next(p["ports"]["metrics"] for p in bookie if p["role"] == "bookie")
        needed = set().union(*(metric_names(e) for e in dashboard_exprs(json.loads(DASHBOARD.read_text()))))
        assert len(needed) >= 15, needed

        def missing():
            found = scrape(cluster.admin_url + "/metrics") | scrape(f"http://127.0.0.1:{bookie_port}/metrics")
            return needed - found

        # rates, backlogs and latencies are folded on the broker's stats interval: wait for them
        left = set()

        def all_found():
            left.clear()
            left.update(missing())
            return not left

        try:
            wait_for(all_found, 60, "every dashboard metric on /metrics", interval_s=0.5)
        except AssertionError:
            pytest.fail(f"the dashboard queries metrics no process exports: {sorted(left)}")
    finally:
        client.close()
