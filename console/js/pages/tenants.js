// Tenants: limits, current bucket levels, spend and remaining budget
// (GET /admin/v1/tenants), with the spend since start from the stats.

import {get} from "../api.js";
import {h, mount, num, period, usd} from "../dom.js";
import * as stats from "../stats.js";

const REFRESH_MS = 3000;

export function render(root) {
  const body = h("div", {}, h("p", {class: "muted"}, "Loading…"));
  mount(root, h("header", {class: "page-head"}, h("h1", {}, "Tenants & spend"),
    h("p", {class: "muted"}, "Budgets are the current period's settled spend; requests in flight are not included.")), body);
  let alive = true, timer = null, list = null;
  // Drawn again when either source moves: the tenants (every REFRESH_MS) or the stats (every 2 s).
  const draw = () => {
    if (!alive || !list) return;
    const s = stats.latest();
    const since = new Map((s ? s.tenants : []).filter((t) => !t.overflow).map((t) => [t.tenant, t]));
    mount(body, list.data.length === 0
      ? h("p", {class: "muted"}, "No tenants: this configuration has no tenants: or auth: section.")
      : h("div", {class: "cards"}, list.data.map((t) => card(t, since.get(t.name)))));
  };
  const load = async () => {
    try {
      list = await get("/admin/v1/tenants");
      draw();
    } catch (e) {
      if (alive) mount(body, h("p", {class: "error"}, `Could not load tenants: ${e.message}`));
    }
    if (alive) timer = setTimeout(load, REFRESH_MS);
  };
  const off = stats.onStats(draw);
  load();
  return () => {
    alive = false;
    off();
    clearTimeout(timer);
  };
}

function card(t, traffic) {
  const u = t.usage || {};
  const b = u.budget;
  const rows = [
    ["Spend since start", usd(traffic ? traffic.spend_usd : 0), "spend-total"],
    ["Requests since start", num(traffic ? traffic.requests : 0), "requests-total"],
  ];
  const bucket = (label, v, unit) => v ? [label, `${num(v.remaining)} of ${num(v.limit)} ${unit} left`, null] : null;
  for (const r of [bucket("Requests bucket", u.requests, "req/min"), bucket("Tokens bucket", u.tokens, "tok/min")])
    if (r) rows.push(r);
  if (u.streams) rows.push(["Streams", `${num(u.streams.in_flight)} of ${num(u.streams.limit)} in flight`, null]);
  rows.push(["Runtime keys", num(t.runtime_keys), null]);
  if (t.models && t.models.length) rows.push(["Models", t.models.join(", "), null]);
  return h("section", {class: "card tenant", data: {tenant: t.name}},
    h("h2", {}, t.name, t.tier ? h("span", {class: "muted small"}, ` · tier ${t.tier}`) : null),
    b ? budget(b) : h("p", {class: "muted budget-none"}, "No budget"),
    h("dl", {class: "facts"}, rows.map(([k, v, cls]) => [h("dt", {}, k), h("dd", {class: cls}, v)])),
    h("p", {}, h("a", {href: `#/requests?tenant=${encodeURIComponent(t.name)}`}, "Requests of this tenant →")));
}

export function budget(b) {
  const used = b.limit_usd > 0 ? Math.min(1, Math.max(0, b.spent_usd / b.limit_usd)) : 1;
  const bar = h("div", {class: "bar-fill"});
  bar.style.width = `${(used * 100).toFixed(1)}%`;
  if (used >= 0.9) bar.classList.add("bar-bad");
  else if (used >= 0.7) bar.classList.add("bar-warn");
  return h("div", {class: "budget"},
    h("div", {class: "budget-line"},
      h("span", {}, "Budget spent ", h("strong", {class: "budget-spent"}, usd(b.spent_usd)), ` of ${usd(b.limit_usd)}`),
      h("span", {}, h("strong", {class: "budget-remaining"}, usd(b.remaining_usd)), " left · ", period(b.period))),
    h("div", {class: "bar", role: "img", "aria-label": `${(used * 100).toFixed(0)}% of the budget spent`}, bar));
}
