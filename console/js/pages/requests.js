// The request log (GET /admin/v1/requests): filters in the fragment's query
// (#/requests?tenant=acme&status=5xx, so a view can be linked), keyset
// pages, and one request's whole record (GET /admin/v1/requests/{id}).

import {get, seg} from "../api.js";
import {h, logTime, mount, ms, num, statusBadge, text, usd} from "../dom.js";

const LIVE_MS = 3000;
const FILTERS = ["since", "until", "tenant", "key_id", "model", "request_id", "status", "limit"];

export function render(root, r) {
  if (r.rest.length) return detail(root, r.rest[0]);
  const q = r.query;
  const inputs = {
    since: h("input", {id: "f-since", name: "since", type: "text", placeholder: "2026-01-31T00:00:00Z or Unix s"}),
    until: h("input", {id: "f-until", name: "until", type: "text", placeholder: "exclusive"}),
    tenant: h("input", {id: "f-tenant", name: "tenant", type: "text"}),
    key_id: h("input", {id: "f-key", name: "key_id", type: "text"}),
    model: h("input", {id: "f-model", name: "model", type: "text"}),
    request_id: h("input", {id: "f-request-id", name: "request_id", type: "text"}),
    status: h("input", {id: "f-status", name: "status", type: "text", placeholder: "429 or 5xx"}),
    limit: h("input", {id: "f-limit", name: "limit", type: "number", min: 1, max: 1000, placeholder: "50"}),
  };
  for (const k of FILTERS) inputs[k].value = q.get(k) || "";
  const labels = {since: "Since", until: "Until", tenant: "Tenant", key_id: "Key id", model: "Model", request_id: "Request id", status: "Status", limit: "Rows"};
  const form = h("form", {class: "filters", id: "request-filters", on: {submit: (e) => {
    e.preventDefault();
    const p = new URLSearchParams();
    for (const k of FILTERS) if (inputs[k].value.trim()) p.set(k, inputs[k].value.trim());
    const next = `#/requests${p.toString() ? `?${p}` : ""}`;
    if (location.hash === next) load(null);
    else location.hash = next;
  }}},
  FILTERS.map((k) => h("div", {class: "field"}, h("label", {for: inputs[k].id}, labels[k]), inputs[k])),
  h("div", {class: "field"}, h("button", {type: "submit", class: "primary", id: "apply-filters"}, "Apply")));
  const out = h("div", {});
  const pager = h("div", {class: "pager"});
  // Live: the newest page again every LIVE_MS while it is the one shown (like tail -f).
  const live = h("input", {type: "checkbox", id: "live", checked: true});
  mount(root, h("header", {class: "page-head"}, h("h1", {}, "Requests"),
    h("label", {class: "live"}, live, " Live"),
    h("button", {type: "button", id: "refresh-requests", on: {click: () => load(null)}}, "Refresh")), form, out, pager);

  let alive = true, timer = null;
  const cursors = []; // cursors of the pages before this one (for "Newer")
  let current = null;
  const load = async (cursor) => {
    clearTimeout(timer);
    const p = new URLSearchParams();
    for (const k of FILTERS) if (q.get(k)) p.set(k, q.get(k));
    if (cursor) p.set("cursor", cursor);
    try {
      const page = await get(`/admin/v1/requests?${p}`);
      if (!alive) return;
      current = cursor;
      mount(out, table(page.data));
      mount(pager,
        cursors.length ? h("button", {type: "button", on: {click: () => load(cursors.pop())}}, "← Newer") : null,
        page.has_more ? h("button", {type: "button", id: "older", on: {click: () => {
          cursors.push(current);
          load(page.next_cursor);
        }}}, "Older →") : null);
    } catch (e) {
      if (!alive) return;
      mount(out, h("p", {class: "error", id: "requests-error"}, e.code === "no_request_log"
        ? "The request log is off: configure request_log: {url: \"sqlite:PATH\"} to store and query requests." : e.message));
      pager.replaceChildren();
    }
    if (alive) timer = setTimeout(poll, LIVE_MS);
  };
  const poll = () => {
    if (!alive) return;
    if (live.checked && current === null) load(null);
    else timer = setTimeout(poll, LIVE_MS);
  };
  load(null);
  return () => {
    alive = false;
    clearTimeout(timer);
  };
}

function table(rows) {
  return h("table", {class: "grid", id: "requests-table"},
    h("thead", {}, h("tr", {}, ["Time (UTC)", "Request id", "Tenant", "Key", "Model", "Status", "TTFT", "Duration", "Tokens", "Spend", "Error"]
      .map((x) => h("th", {}, x)))),
    h("tbody", {}, rows.length === 0 ? h("tr", {}, h("td", {colspan: 11, class: "muted"}, "No requests match.")) :
      rows.map((r) => h("tr", {data: {request: r.request_id}},
        h("td", {class: "nowrap"}, logTime(r.ts)),
        h("td", {}, h("a", {class: "mono", href: `#/requests/${seg(r.request_id)}`}, r.request_id)),
        h("td", {}, text(r.tenant)),
        h("td", {class: "mono"}, text(r.key_id)),
        h("td", {}, text(r.model)),
        h("td", {}, statusBadge(r.status)),
        h("td", {class: "num"}, ms(r.ttft_ms)),
        h("td", {class: "num"}, ms(r.duration_ms)),
        h("td", {class: "num"}, r.prompt_tokens === null || r.prompt_tokens === undefined ? "–" : `${num(r.prompt_tokens)} / ${num(r.completion_tokens)}`),
        h("td", {class: "num"}, r.spend_usd === undefined ? "–" : usd(r.spend_usd)),
        h("td", {}, r.error ? text(r.error.code) : "")))));
}

function detail(root, id) {
  const body = h("div", {}, h("p", {class: "muted"}, "Loading…"));
  mount(root, h("header", {class: "page-head"}, h("h1", {}, "Request ", h("span", {class: "mono", id: "request-id"}, id)),
    h("a", {href: "#/requests"}, "← Request log")), body);
  let alive = true;
  get(`/admin/v1/requests/${seg(id)}`).then((rec) => {
    if (!alive) return;
    const facts = Object.entries(rec).filter(([k]) => k !== "attempts");
    // Clients choose their x-request-id: another request (another tenant's) may have used this one too.
    const others = rec.others_with_id > 0 ? h("p", {class: "muted", id: "others-with-id"},
      `${num(rec.others_with_id)} other ${rec.others_with_id === 1 ? "request has" : "requests have"} this id: `,
      h("a", {href: `#/requests?${new URLSearchParams({request_id: id})}`}, "list them all")) : null;
    mount(body, others, h("section", {class: "card"},
      h("dl", {class: "facts", id: "request-detail"}, facts.map(([k, v]) => [h("dt", {}, k), h("dd", {data: {field: k}}, text(v))])),
      Array.isArray(rec.attempts) ? [h("h3", {}, "Attempts"), h("table", {class: "grid"},
        h("thead", {}, h("tr", {}, ["Pool", "Endpoint", "Status", "Failure", "Time"].map((x) => h("th", {}, x)))),
        h("tbody", {}, rec.attempts.map((a) => h("tr", {}, h("td", {}, text(a.pool)), h("td", {}, text(a.endpoint)),
          h("td", {}, text(a.status)), h("td", {}, text(a.failure)), h("td", {}, ms(a.ms))))))] : null,
      h("h3", {}, "Record"),
      h("pre", {class: "json"}, JSON.stringify(rec, null, 2))));
  }).catch((e) => {
    if (alive) mount(body, h("p", {class: "error"}, e.message));
  });
  return () => {
    alive = false;
  };
}
