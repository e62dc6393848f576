"""The web console in a real headless browser (Debian's chromium + chromedriver, driven by
selenium; nothing downloaded at test time) against real ZooKeeper, bookie and broker processes.

Open cluster (2 brokers, 3 bookies, a file:// tier): after producing to a topic across ledgers,
offloading its first ledger (and its bookie copy deleted) and subscribing, the rendered pages
show the topic, a segment marked offloaded with its object URI, every live bookie's id and every
broker's address. Secured cluster (token authentication): the page asks for a token; without
one (or with a forged one) it says so and shows no data; with one, the data.

One browser for the module (a start costs seconds). Screenshots go under the pytest tmp dir
(their paths are printed)."""

from __future__ import annotations

import json
import os
import re
import shutil
import urllib.error
import urllib.parse
import urllib.request

import jwt
import pytest

from tests.integration.helpers import wait_for

pulsar = pytest.importorskip("pulsar")
webdriver = pytest.importorskip("selenium.webdriver")

pytestmark = pytest.mark.integration

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
ENTRIES_PER_LEDGER = 5
TOPIC = "console-demo"
SECRET = os.urandom(32)
PAGE_WAIT_S = 60
DISK_TEXT = re.compile(r"\d+(\.\d)? (B|KiB|MiB|GiB|TiB) free \(\d+% used\)")


def http(method: str, url: str, body=None, headers: dict | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
            return resp.status, (json.loads(raw) if raw and resp.headers.get_content_type() == "application/json"
                                 else raw)
    except urllib.error.HTTPError as e:
        raw = e.read()
        try:
            return e.code, json.loads(raw) if raw else None
        except ValueError:
            return e.code, raw.decode(errors="replace")


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and CHROMEDRIVER):
        pytest.skip("chromium and chromium-driver (Debian packages; scripts/setup.sh installs them) are needed")
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def page_text(driver) -> str:
    return driver.find_element("tag name", "body").text


def wait_text(driver, predicate, what: str) -> str:
    return wait_for(lambda: (t := page_text(driver)) and predicate(t) and t, PAGE_WAIT_S, what, interval_s=0.2)


def screenshot(driver, directory, name: str) -> None:
    path = directory / name
    driver.save_screenshot(str(path))
    print(f"console screenshot: {path}")
    assert path.stat().st_size > 0


# -- open cluster --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def open_cluster(module_cluster_factory, module_tmp_path):
    tier = module_tmp_path / "tier"
    tier.mkdir()
    return module_cluster_factory(3, brokers=2, name="open", broker_overrides={
        "tier_uri": f"file://{tier}", "rollover_entries_max": ENTRIES_PER_LEDGER, "offload_deletion_lag_ms": 0,
        "offload_check_interval_ms": 300})


def owner_admin_url(cluster, topic: str) -> str:
    status, got = http("GET", f"{cluster.admin_url}/lookup/v2/topic/persistent/public/default/{topic}")
    assert status == 200, got
    return got["httpUrl"]


def test_console_shows_segments_bookies_and_brokers(open_cluster, browser, module_tmp_path):
    cluster = open_cluster
    status, body = http("POST", f"{cluster.admin_url}/admin/v2/namespaces/public/default/retention",
                        {"retentionTimeInMinutes": -1, "retentionSizeInMB": -1})
    assert status == 204, body
    client = pulsar.Client(cluster.service_url, operation_timeout_seconds=30)
    try:
        producer = client.create_producer(f"persistent://public/default/{TOPIC}", batching_enabled=False)
        for i in range(3 * ENTRIES_PER_LEDGER + 2):
            producer.send(f"m-{i}".encode())
        owner = owner_admin_url(cluster, TOPIC)
        topic_url = f"{owner}/admin/v2/persistent/public/default/{TOPIC}"
        status, stats = http("GET", topic_url + "/internalStats")
        assert status == 200, stats
        ledger_ids = [i["ledgerId"] for i in stats["ledgers"]]
        assert len(ledger_ids) >= 3, stats
        # offload exactly the first ledger: every closed ledger before the second one's entry 0
        status, body = http("PUT", topic_url + "/offload", {"ledgerId": ledger_ids[1], "entryId": 0})
        assert status == 204, body

        def first_offloaded():
            got = http("GET", topic_url + "/internalStats")[1]["ledgers"]
            return got[0]["offloadState"] == "bookie-deleted" and got

        ledgers = wait_for(first_offloaded, 120, "the first ledger offloaded and deleted from the bookies",
                           interval_s=0.2)
        assert all(i["offloadState"] == "none" for i in ledgers[1:]), ledgers
        offload_uri = ledgers[0]["offloadUri"]
        consumer = client.subscribe(f"persistent://public/default/{TOPIC}", "console-sub",
                                    initial_position=pulsar.InitialPosition.Earliest)
        consumer.receive(timeout_millis=30_000)          # one received, not acknowledged: a backlog

        status_ = cluster.status()
        brokers = [p for p in status_["processes"] if p["role"] == "broker"]
        bookie_ids = [p["bookie_id"] for p in status_["processes"] if p["role"] == "bookie"]
        broker_addresses = [f"127.0.0.1:{p['ports']['pulsar']}" for p in brokers]
        assert len(brokers) == 2 and len(bookie_ids) == 3

        # the console of the broker that does NOT own the topic: it reads from the owner
        others = [f"http://127.0.0.1:{p['ports']['http']}" for p in brokers]
        page_base = next(u for u in others if u != owner)
        browser.get(page_base + "/")
        text = wait_text(browser, lambda t: all(b in t for b in bookie_ids) and all(a in t for a in broker_addresses)
                         and TOPIC in t, "cluster page with every bookie, broker and the topic")
        assert "Under-replicated ledgers" in text
        # free disk for every live bookie (read by the broker from each bookie's /metrics):
        # figures, not "unknown"
        def disk_cells():
            cells = {e.get_attribute("data-bookie"): e.text
                     for e in browser.find_elements("css selector", ".bookie-disk")}
            return set(cells) == set(bookie_ids) and all(DISK_TEXT.fullmatch(t) for t in cells.values()) and cells

        cells = wait_for(disk_cells, PAGE_WAIT_S, "free disk shown for every bookie", interval_s=0.2)
        assert set(cells) == set(bookie_ids), cells
        status, got = http("GET", page_base + "/admin/v2/console/cluster")
        assert status == 200, got
        for bookie in got["bookies"]:
            assert bookie["diskFreeBytes"] > 0 and 0 < bookie["diskUsedRatio"] < 1, bookie
        screenshot(browser, module_tmp_path, "console-cluster.png")

        # follow the topic's link, as a user would
        link = next(a for a in browser.find_elements("css selector", "a.topic-link") if a.text.endswith("/" + TOPIC))
        link.click()
        text = wait_text(browser, lambda t: "console-sub" in t and "offloaded:" in t, "topic page")
        assert f"persistent://public/default/{TOPIC}" in text
        segments = browser.find_elements("css selector", "#segments .segment")
        assert [s.get_attribute("data-ledger") for s in segments] == [str(i) for i in ledger_ids]
        assert [s.get_attribute("data-location") for s in segments] == \
            ["offloaded"] + ["bookies"] * (len(ledger_ids) - 2) + ["open"]
        assert offload_uri in segments[0].text
        assert any(b in segments[1].text for b in bookie_ids)       # where a closed ledger lives
        assert "producer" in text.lower() and producer.producer_name() in text
        screenshot(browser, module_tmp_path, "console-topic.png")

        # live: a new message shows up without reloading the page (the refresh polls)
        before = browser.find_element("css selector", "#segments .segment:last-child").text
        producer.send(b"one more")
        wait_for(lambda: browser.find_element("css selector", "#segments .segment:last-child").text != before,
                 PAGE_WAIT_S, "the open segment redrawn with the new entry", interval_s=0.2)

        # tenants and namespaces with their policies (the retention set above among them)
        browser.get(page_base + "/#/tenants")
        text = wait_text(browser, lambda t: "Namespace public/default" in t and TOPIC in t, "tenants page")
        browser.find_element("css selector", "details summary").click()
        assert '"retentionTimeInMinutes": -1' in page_text(browser)

        # a topic that does not exist: a clear message, not a blank page
        browser.get(page_base + "/#/topic/public/default/no-such-topic")
        wait_text(browser, lambda t: "404" in t and "not found" in t.lower(), "404 message")
    finally:
        client.close()


def test_console_files_and_bad_input(open_cluster):
    base = open_cluster.admin_url
    status, body = http("GET", base + "/")
    assert status == 200 and b"console.js" in body
    for path in ("/console/..%2Fconsole.py", "/console/console.py", "/console/__init__.py"):
        status, body = http("GET", base + path)
        assert status == 404, (path, body)
    status, body = http("GET", base + "/admin/v2/persistent/public/default/no-such/console")
    assert status == 404 and "not found" in body["reason"].lower()
    bad_name = urllib.parse.quote("bad\x00name", safe="")
    status, body = http("GET", base + f"/admin/v2/persistent/public/default/{bad_name}/console")
    assert status == 400, body


# -- secured cluster -----------------------------------------------------------------------------
def make_token(sub: str, key: bytes = SECRET) -> str:
    return jwt.encode({"sub": sub}, key, algorithm="HS256")


@pytest.fixture(scope="module")
def secured_cluster(module_cluster_factory, module_tmp_path):
    key_path = module_tmp_path / "secret.key"
    key_path.write_bytes(SECRET)
    # bookie-3 serves no /metrics: its disk is "unknown" while the others' show
    return module_cluster_factory(3, brokers=1, name="secured", bookie_overrides={"bookie-3": {"metrics_port": 0}},
                                  broker_overrides={
        "authentication_enabled": True, "authentication_providers": "token", "authorization_enabled": True,
        "superuser_roles": "admin", "token_secret_key": f"file://{key_path}"})


def test_console_with_authentication(secured_cluster, browser, module_tmp_path):
    cluster = secured_cluster
    base = cluster.admin_url
    admin = make_token("admin")
    # the files are served without credentials; the data is not
    assert http("GET", base + "/")[0] == 200
    assert http("GET", base + "/admin/v2/console/cluster")[0] == 401
    status, got = http("GET", base + "/admin/v2/console/cluster", headers={"Authorization": "Bearer " + admin})
    assert status == 200, got
    # the broker reads the bookies' /metrics (which take no credentials) with none of the caller's;
    # the bookie without a metrics port: unknown, and the others still shown
    processes = {p["name"]: p for p in cluster.status()["processes"]}
    no_metrics = processes["bookie-3"]["bookie_id"]
    disks = {b["id"]: b for b in got["bookies"]}
    assert len(disks) == 3 and disks[no_metrics]["disk"] == "unknown" and disks[no_metrics]["diskFreeBytes"] is None
    assert all(DISK_TEXT.fullmatch(b["disk"]) for i, b in disks.items() if i != no_metrics), got

    browser.get(base + "/")
    browser.execute_script("sessionStorage.clear()")
    browser.refresh()
    text = wait_text(browser, lambda t: "Authentication required" in t, "the token prompt")
    assert "401" in text
    bookie_ids = [p["bookie_id"] for p in cluster.status()["processes"] if p["role"] == "bookie"]
    assert not any(b in text for b in bookie_ids)                   # no data without a token
    screenshot(browser, module_tmp_path, "console-auth-prompt.png")

    # a forged token: refused, said so, still no data
    browser.find_element("id", "token-input").send_keys(make_token("admin", key=os.urandom(32)))
    browser.find_element("css selector", "#token-form button").click()
    text = wait_text(browser, lambda t: "refused the token" in t, "the refusal of a forged token")
    assert not any(b in text for b in bookie_ids)

    # a role that is authenticated but not a superuser: 403, said so
    browser.find_element("id", "token-input").send_keys(make_token("nobody"))
    browser.find_element("css selector", "#token-form button").click()
    wait_text(browser, lambda t: "Forbidden (403)" in t, "the 403 message")

    # the superuser's token: the data, and the token itself never drawn
    browser.find_element("id", "forget-token").click()
    wait_text(browser, lambda t: "Authentication required" in t, "the token prompt again")
    browser.find_element("id", "token-input").send_keys(admin)
    browser.find_element("css selector", "#token-form button").click()
    text = wait_text(browser, lambda t: all(b in t for b in bookie_ids), "the cluster page with a token")
    assert admin not in browser.page_source and admin not in text
    assert browser.execute_script("return sessionStorage.getItem('pulsarlite.console.token')") == admin
    screenshot(browser, module_tmp_path, "console-auth-ok.png")
