// Overview: live requests per second, TTFT and error rate, per model and
// per tenant (GET /admin/v1/stats every 2 s, charted from the deltas).

import {h, mount, ms, num, pct, usd} from "../dom.js";
import {LineChart} from "../chart.js";
import * as stats from "../stats.js";

export function render(root) {
  const perSecond = (v) => `${num(v, v < 10 ? 1 : 0)}/s`;
  const charts = {
    modelRps: new LineChart("Requests per second by model", {format: perSecond}),
    modelTtft: new LineChart("TTFT p50 and p99 by model", {format: ms}),
    modelErr: new LineChart("Error rate by model (4xx + 5xx)", {format: pct, max: 1}),
    tenantRps: new LineChart("Requests per second by tenant", {format: perSecond}),
    tenantTtft: new LineChart("Mean TTFT by tenant", {format: ms}),
    tenantErr: new LineChart("Error rate by tenant (4xx + 5xx)", {format: pct, max: 1}),
  };
  const tiles = h("div", {class: "tiles"});
  const status = h("p", {class: "muted", "aria-live": "polite"});
  const modelTable = h("div", {});
  const tenantTable = h("div", {});
  mount(root,
    h("header", {class: "page-head"}, h("h1", {}, "Overview"), status),
    tiles,
    h("h2", {}, "By model"),
    h("div", {class: "charts"}, charts.modelRps.el, charts.modelTtft.el, charts.modelErr.el),
    modelTable,
    h("h2", {}, "By tenant"),
    h("div", {class: "charts"}, charts.tenantRps.el, charts.tenantTtft.el, charts.tenantErr.el),
    tenantTable);

  const update = () => {
    const s = stats.latest();
    const e = stats.error();
    status.textContent = e ? `Stats unavailable: ${e.message}` : s ? `Updated ${new Date(s.time_ms).toISOString().slice(11, 19)}Z · every 2 s` : "Loading…";
    if (!s) return;
    const models = stats.current("models");
    const tenantsNow = stats.current("tenants");
    let rps = 0, reqs = 0, errs = 0;
    for (const m of models.values()) rps += m.rps;
    for (const m of s.models) {
      reqs += m.requests;
      errs += m.errors_4xx + m.errors_5xx;
    }
    mount(tiles,
      tile("Requests/s", perSecond(rps), "tile-rps"),
      tile("Active streams", num(s.active_streams), "tile-streams"),
      tile("Requests since start", num(reqs), "tile-requests"),
      tile("Errors since start", `${num(errs)} (${pct(reqs ? errs / reqs : 0)})`, "tile-errors"));
    charts.modelRps.update(stats.series("models", "rps"));
    const p99 = stats.series("models", "ttftP99", " p99");
    charts.modelTtft.update(withData(stats.series("models", "ttftP50", " p50").flatMap((x, i) => [x, p99[i]])));
    charts.modelErr.update(stats.series("models", "errorRate"));
    charts.tenantRps.update(stats.series("tenants", "rps"));
    charts.tenantTtft.update(withData(stats.series("tenants", "ttftMean")));
    charts.tenantErr.update(stats.series("tenants", "errorRate"));
    mount(modelTable, table("models", s.models.map((m) => ({
      name: m.model === null ? "(no model)" : m.model, row: m, now: models.get(m.model === null ? "(no model)" : m.model),
    }))));
    mount(tenantTable, table("tenants", s.tenants.map((t) => ({
      name: t.overflow ? "(other tenants)" : t.tenant, row: t, now: tenantsNow.get(t.overflow ? "(other tenants)" : t.tenant),
    }))));
  };
  const off = stats.onStats(update);
  update();
  return () => {
    off();
    for (const c of Object.values(charts)) c.destroy();
  };
}

// Series with at least one value (a model without streams has no TTFT: no legend entry either).
function withData(series) {
  return series.filter((x) => x.points.some((p) => p[1] !== null));
}

function tile(label, value, id) {
  return h("div", {class: "tile", id}, h("div", {class: "tile-label"}, label), h("div", {class: "tile-value"}, value));
}

function table(kind, rows) {
  const ttft = (r) => (r.ttft && r.ttft.count ? ms((r.ttft.sum_s / r.ttft.count) * 1000) : "–");
  return h("table", {class: "grid", id: `stats-${kind}`},
    h("thead", {}, h("tr", {},
      h("th", {}, kind === "models" ? "Model" : "Tenant"),
      h("th", {class: "num"}, "Req/s now"),
      h("th", {class: "num"}, "Requests"),
      h("th", {class: "num"}, "4xx"),
      h("th", {class: "num"}, "5xx"),
      h("th", {class: "num"}, "Mean TTFT"),
      h("th", {class: "num"}, "Tokens in / out"),
      h("th", {class: "num"}, "Spend"))),
    h("tbody", {}, rows.length === 0 ? h("tr", {}, h("td", {colspan: 8, class: "muted"}, "No traffic yet.")) :
      rows.map(({name, row, now}) => h("tr", {data: {name}},
        h("td", {}, name),
        h("td", {class: "num"}, now ? num(now.rps, 1) : "–"),
        h("td", {class: "num"}, num(row.requests)),
        h("td", {class: "num"}, num(row.errors_4xx)),
        h("td", {class: "num"}, num(row.errors_5xx)),
        h("td", {class: "num"}, ttft(row)),
        h("td", {class: "num"}, `${num(row.prompt_tokens)} / ${num(row.completion_tokens)}`),
        h("td", {class: "num"}, usd(row.spend_usd))))));
}

