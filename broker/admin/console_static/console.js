// pulsarlite console: fetches the admin REST API of the broker that served this page and draws
// it. No computation here beyond formatting: the shapes come from broker/admin/console.py.
// Pages (location hash): #/cluster, #/tenants, #/topic/<tenant>/<namespace>/<topic>.
// [security] With authentication on, a 401 asks for a token (kept in sessionStorage, sent as
// Authorization: Bearer); a 403 says the role may not read it. The token is never drawn.
"use strict";

const TOKEN_KEY = "pulsarlite.console.token";
const REFRESH_MS = 3000;           // live pages (cluster, topic) are fetched again this often
let refreshTimer = null;
let drawing = 0;                   // a newer draw makes an older one's answer obsolete

class HttpError extends Error {
  constructor(status, reason, path) { super(reason); this.status = status; this.path = path; }
}

function token() { return sessionStorage.getItem(TOKEN_KEY); }

async function api(path) {
  const headers = { "Accept": "application/json" };
  const t = token();
  if (t) headers["Authorization"] = "Bearer " + t;
  const resp = await fetch(path, { headers, credentials: "omit" });
  let body = null;
  const text = await resp.text();
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = null; }
  if (!resp.ok) {
    const reason = body && body.reason ? body.reason : (text || resp.statusText);
    throw new HttpError(resp.status, reason, path);
  }
  return body;
}

// -- DOM helpers (textContent only: names come from outside) ------------------------------------
function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined) continue;
    if (k === "class") el.className = v; else el.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return el;
}

function table(headers, rows) {
  return h("table", {}, h("thead", {}, h("tr", {}, headers.map((x) => h("th", {}, x)))),
           h("tbody", {}, rows.map((r) => h("tr", {}, r.map((c) => c instanceof Node ? h("td", {}, c)
             : h("td", { class: typeof c === "number" ? "num" : null }, c === null || c === undefined ? "-" : c))))));
}

function bytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0; let v = n;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return (i === 0 ? v : v.toFixed(1)) + " " + units[i];
}
function rate(x) { return x === undefined || x === null ? "-" : Number(x).toFixed(1); }
function time(ms) { return ms === null || ms === undefined ? "?" : new Date(ms).toISOString().replace(".000Z", "Z"); }

function topicHref(full) {
  // persistent://tenant/ns/topic -> #/topic/tenant/ns/<encoded topic>
  const rest = full.replace(/^persistent:\/\//, "");
  const [tenant, ns, ...local] = rest.split("/");
  return `#/topic/${encodeURIComponent(tenant)}/${encodeURIComponent(ns)}/${encodeURIComponent(local.join("/"))}`;
}
function topicLink(full) { return h("a", { href: topicHref(full), class: "topic-link" }, full); }

function setStatus(text) { document.getElementById("status").textContent = text; }

// -- pages --------------------------------------------------------------------------------------
async function clusterPage() {
  const c = await api("/admin/v2/console/cluster");
  const brokers = table(["broker", "service URL", "admin URL", "bundles and their topics"],
    c.brokers.map((b) => [h("span", { class: "broker-id" }, b.id), b.pulsarUrl, b.httpUrl,
      b.bundles.length ? h("ul", {}, b.bundles.map((x) => h("li", {}, x.bundle,
        x.topics.length ? h("ul", {}, x.topics.map((t) => h("li", {}, topicLink(t)))) : null))) : "none"]));
  const bookies = table(["bookie", "mode", "disk"], c.bookies.map((b) =>
    [h("span", { class: "bookie-id" }, b.id), h("span", { class: "badge " + b.mode }, b.mode),
     h("span", { class: "bookie-disk", "data-bookie": b.id }, b.disk)]));
  const ur = c.underReplicatedLedgers;
  return [h("h2", {}, `Brokers (${c.brokers.length})`), brokers,
          h("h2", {}, `Bookies (${c.bookies.length})`), bookies,
          h("p", { class: "note" }, "Disk: the fuller of the bookie's journal and ledger disks, from its /metrics " +
            "(unknown: no metrics port, or no answer within 1 s). Journal latency per bookie: the Grafana dashboard (deploy/)."),
          h("h2", {}, "Under-replicated ledgers"),
          h("p", { id: "under-replicated" }, ur.count === 0 ? "none" :
            `${ur.count}: ${ur.ledgers.join(", ")}${ur.count > ur.ledgers.length ? ", …" : ""}`),
          c.orphanBundles.length ? h("p", {}, "Bundles owned by no live broker: " + c.orphanBundles.join(", ")) : null];
}

async function tenantsPage() {
  const out = [];
  const tenants = await api("/admin/v2/tenants");
  for (const tenant of tenants) {
    out.push(h("h2", {}, "Tenant " + tenant));
    const namespaces = await api(`/admin/v2/namespaces/${encodeURIComponent(tenant)}`);
    for (const ns of namespaces) {
      const [t, n] = ns.split("/");
      const base = `/admin/v2/namespaces/${encodeURIComponent(t)}/${encodeURIComponent(n)}`;
      const [policies, topics] = await Promise.all([api(base), api(base + "/topics")]);
      out.push(h("h3", {}, "Namespace " + ns),
               topics.length ? h("ul", {}, topics.map((x) => h("li", {}, topicLink(x)))) : h("p", {}, "no topics"),
               h("details", {}, h("summary", {}, "policies"), h("pre", {}, JSON.stringify(policies, null, 2))));
    }
  }
  return out;
}

function segmentBox(s) {
  const where = s.location === "offloaded" ? h("div", { class: "uri" }, "offloaded: " + s.offloadUri)
    : s.location === "open" ? h("div", {}, "open (being written)")
    : h("div", {}, "on bookies" + (s.offloadState !== "none" ? ` (offload ${s.offloadState})` : ""));
  const ensembles = s.ensembles ? s.ensembles.map((e) => h("div", { class: "ensemble" },
    `from entry ${e.firstEntry}: ${e.bookies.join(", ")}`)) : null;
  const box = h("div", { class: `segment loc-${s.location}${s.underReplicated ? " under-replicated" : ""}`,
                         "data-ledger": String(s.ledgerId), "data-location": s.location },
    h("div", { class: "sid" }, "ledger " + s.ledgerId),
    h("div", {}, `${s.entries} entries, ${bytes(s.size)}`),
    h("div", {}, `${time(s.minPublishTimeMs)} … ${time(s.maxPublishTimeMs)}`),
    where, ensembles, s.underReplicated ? h("div", {}, "under-replicated") : null);
  box.style.flexGrow = String(Math.max(1, Math.log2(1 + s.size)));
  return box;
}

async function topicPage(tenant, ns, local) {
  const base = `/admin/v2/persistent/${encodeURIComponent(tenant)}/${encodeURIComponent(ns)}/${encodeURIComponent(local)}`;
  const t = await api(base + "/console");
  const st = t.stats || {};
  const subs = Object.entries(st.subscriptions || {});
  const out = [h("h2", { id: "topic-name" }, t.topic),
    h("p", {}, `in ${rate(st.msgRateIn)} msg/s, out ${rate(st.msgRateOut)} msg/s, stored ${bytes(st.storageSize)}, ` +
      `backlog ${bytes(st.backlogSize)}; served by ${t.ownerAdminUrl || "this broker"}`),
    h("h2", {}, `Segments (${t.segmentsTotal}${t.segmentsTotal > t.segments.length ? `, newest ${t.segments.length} drawn` : ""})`),
    h("div", { class: "segments", id: "segments" }, t.segments.map(segmentBox)),
    h("h2", {}, `Subscriptions (${subs.length})`),
    table(["subscription", "type", "backlog", "msg/s out", "consumers"], subs.map(([name, s]) => [name, s.type,
      s.msgBacklog, rate(s.msgRateOut), (s.consumers || []).map((c) =>
        `${c.consumerName} @ ${c.address} (${rate(c.msgRateOut)} msg/s, ${c.unackedMessages ?? 0} unacked)`).join("; ") || "none"])),
    h("h2", {}, `Producers (${(st.publishers || []).length})`),
    table(["producer", "msg/s in", "bytes/s in", "address", "since"], (st.publishers || []).map((p) =>
      [p.producerName, rate(p.msgRateIn), rate(p.msgThroughputIn), p.address, p.connectedSince]))];
  try {
    const schemas = await api(`/admin/v2/schemas/${encodeURIComponent(tenant)}/${encodeURIComponent(ns)}/${encodeURIComponent(local)}/schemas`);
    const versions = (schemas && schemas.getSchemaResponses) || [];
    out.push(h("h2", {}, `Schema versions (${versions.length})`),
             table(["version", "type"], versions.map((v) => [v.version, v.type])));
  } catch (e) {
    if (!(e instanceof HttpError) || (e.status !== 404 && e.status !== 403)) throw e;
  }
  return out;
}

// -- routing, auth, refresh ---------------------------------------------------------------------
function route() {
  const parts = (location.hash || "#/cluster").slice(2).split("/").map(decodeURIComponent);
  if (parts[0] === "tenants") return { live: false, draw: tenantsPage };
  if (parts[0] === "topic" && parts.length >= 4) {
    return { live: true, draw: () => topicPage(parts[1], parts[2], parts.slice(3).join("/")) };
  }
  return { live: true, draw: clusterPage };
}

function showAuth(message) {
  document.getElementById("auth").hidden = false;
  document.getElementById("auth-message").textContent = message;
  document.getElementById("page").replaceChildren();
}

async function draw() {
  const mine = ++drawing;
  clearTimeout(refreshTimer);
  const r = route();
  const errorBox = document.getElementById("error");
  document.getElementById("forget-token").hidden = !token();
  try {
    const nodes = await r.draw();
    if (mine !== drawing) return;
    document.getElementById("auth").hidden = true;
    errorBox.hidden = true;
    document.getElementById("page").replaceChildren(...nodes.flat().filter((n) => n));
    setStatus("updated " + new Date().toLocaleTimeString());
    if (r.live) refreshTimer = setTimeout(draw, REFRESH_MS);
  } catch (e) {
    if (mine !== drawing) return;
    if (e instanceof HttpError && e.status === 401) {
      showAuth(token() ? "The broker refused the token (401): " + e.message + ". Enter another token."
                       : "This broker requires authentication (401). Enter a token to see its data.");
      return;
    }
    document.getElementById("auth").hidden = true;
    errorBox.hidden = false;
    errorBox.className = e instanceof HttpError ? "http-" + e.status : "";
    errorBox.textContent = e instanceof HttpError && e.status === 403
      ? "Forbidden (403): this token's role may not read " + e.path + ": " + e.message
      : (e instanceof HttpError ? `Error ${e.status} from ${e.path}: ${e.message}` : "Error: " + e.message);
    if (r.live) refreshTimer = setTimeout(draw, REFRESH_MS);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    const input = document.getElementById("token-input");
    sessionStorage.setItem(TOKEN_KEY, input.value.trim());
    input.value = "";
    draw();
  });
  document.getElementById("forget-token").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    draw();
  });
  window.addEventListener("hashchange", draw);
  draw();
});
