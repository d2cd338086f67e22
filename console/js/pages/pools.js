// Pools and endpoints with their health (GET /admin/v1/pools, every 3 s).

import {get} from "../api.js";
import {badge, h, mount, num, pct} from "../dom.js";

const REFRESH_MS = 3000;

export function render(root) {
  const body = h("div", {}, h("p", {class: "muted"}, "Loading…"));
  mount(root, h("header", {class: "page-head"}, h("h1", {}, "Pools"),
    h("p", {class: "muted"}, "Health as the workers see it: ejected after connect failures or failing answers, down after failed health probes.")), body);
  let alive = true, timer = null;
  const load = async () => {
    try {
      const pools = await get("/admin/v1/pools");
      if (!alive) return;
      mount(body, pools.data.map(pool));
    } catch (e) {
      if (alive) mount(body, h("p", {class: "error"}, `Could not load pools: ${e.message}`));
    }
    if (alive) timer = setTimeout(load, REFRESH_MS);
  };
  load();
  return () => {
    alive = false;
    clearTimeout(timer);
  };
}

const HEALTH = {up: "ok", ejected: "warn", down: "bad"};

function pool(p) {
  const all = p.endpoints.length;
  return h("section", {class: "card pool", data: {pool: p.name}},
    h("h2", {}, p.name, " ", badge(p.healthy_endpoints === all ? "ok" : p.healthy_endpoints === 0 ? "bad" : "warn",
      `${p.healthy_endpoints}/${all} healthy`)),
    h("p", {class: "muted"}, `Models: ${p.models.length ? p.models.join(", ") : "none"} · balance: ${p.balance} · health probes: ${p.health_checks ? "on" : "off"}`),
    h("table", {class: "grid"},
      h("thead", {}, h("tr", {}, ["Endpoint", "Health", "In flight", "Idle conns", "Load (running / waiting / KV)", "Attempts", "Failures", ""]
        .map((x) => h("th", {}, x)))),
      h("tbody", {}, p.endpoints.map((e) => {
        const failures = Object.entries(e.failures).filter(([, n]) => n > 0);
        const total = failures.reduce((a, [, n]) => a + n, 0);
        return h("tr", {data: {endpoint: e.url}},
          h("td", {class: "mono"}, e.url),
          h("td", {}, badge(HEALTH[e.health] || "muted", e.health)),
          h("td", {class: "num"}, num(e.in_flight)),
          h("td", {class: "num"}, num(e.idle_connections)),
          h("td", {class: "num"}, e.load ? `${num(e.load.running)} / ${num(e.load.waiting)} / ${pct(e.load.kv_cache_usage)}` : "–"),
          h("td", {class: "num"}, num(e.attempts)),
          h("td", {class: "num", title: failures.map(([k, n]) => `${k}: ${n}`).join(", ") || null}, num(total)),
          h("td", {class: "muted small"}, e.health === "ejected" ? `on ${e.ejected_workers} worker(s), ${num(e.ejected_ms)} ms more`
            : e.health === "down" ? `${e.failed_probes} failed probes`
            : e.half_open_workers > 0 ? `half-open on ${e.half_open_workers} worker(s)` : ""));
      }))));
}
