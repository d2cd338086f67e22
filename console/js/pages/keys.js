// Virtual keys: list, create (the secret shown once), rotate (a new secret,
// shown once), revoke, and one key's detail with its own usage.
// The secret lives only in the dialog that shows it: never stored, never
// put in a URL, gone when the dialog closes.

import {api, get, seg, sessionGeneration, ApiError, EXACT_NUMBERS, holdsRoundedInteger, parseTyped} from "../api.js";
import {badge, h, mount, num, period, text, unixTime, usd} from "../dom.js";
import {budget} from "./tenants.js";

export function render(root, r) {
  if (r.rest.length) return detail(root, r.rest[0]);
  const list = h("div", {}, h("p", {class: "muted"}, "Loading…"));
  const formBox = h("div", {});
  mount(root, h("header", {class: "page-head"}, h("h1", {}, "Keys"),
    h("button", {type: "button", class: "primary", id: "new-key", on: {click: () => openForm()}}, "Create key")),
  formBox, list);
  let alive = true;
  let tenants = [];

  const load = async () => {
    try {
      const [keys, ts] = await Promise.all([get("/admin/v1/keys"), get("/admin/v1/tenants")]);
      if (!alive) return;
      // Not the implicit anonymous tenant: it serves only requests without credentials, no key can name it.
      tenants = ts.data.filter((t) => !t.implicit).map((t) => t.name);
      mount(list, h("p", {class: "muted"}, `Runtime keys are kept in: ${keys.persistence}.`), table(keys.data));
    } catch (e) {
      if (alive) mount(list, h("p", {class: "error"}, `Could not load keys: ${e.message}`));
    }
  };

  const table = (keys) => h("table", {class: "grid", id: "keys-table"},
    h("thead", {}, h("tr", {}, ["Id", "Name", "Tenant", "Models", "Limits", "Budget", "Expires", "Created", ""].map((x) => h("th", {}, x)))),
    h("tbody", {}, keys.length === 0 ? h("tr", {}, h("td", {colspan: 9, class: "muted"}, "No keys.")) : keys.map((k) => h("tr", {data: {key: k.id}},
      h("td", {}, h("a", {href: `#/keys/${seg(k.id)}`, class: "mono"}, k.id)),
      h("td", {class: "key-name"}, k.name === null ? "–" : k.name),
      h("td", {}, k.tenant),
      h("td", {}, k.models === null ? "tenant's" : k.models.join(", ")),
      h("td", {}, limits(k.limits)),
      h("td", {}, k.budget ? `${usd(k.budget.usd)} / ${period(k.budget.period)}` : "–"),
      h("td", {}, k.expired ? badge("bad", "expired") : unixTime(k.expires_at)),
      h("td", {}, k.created_at ? unixTime(k.created_at) : "config"),
      h("td", {class: "actions"}, k.read_only ? badge("muted", "config file") : [
        h("button", {type: "button", class: "rotate", on: {click: () => rotate(k)}}, "Rotate"),
        h("button", {type: "button", class: "danger revoke", on: {click: () => revoke(k)}}, "Revoke"),
      ])))));

  const rotate = (k) => confirmDialog(`Rotate key ${k.id}?`, "The current secret stops working at once; the new one is shown once.", "Rotate", async () => {
    const gen = sessionGeneration();
    const res = await api("POST", `/admin/v1/keys/${seg(k.id)}/rotate`);
    if (gen !== sessionGeneration()) return; // (signed out meanwhile: no secret over the sign-in form)
    secretDialog(res, "New secret");
    load();
  });
  const revoke = (k) => confirmDialog(`Revoke key ${k.id}?`, "The next request with it gets 401. This cannot be undone.", "Revoke", async () => {
    await api("DELETE", `/admin/v1/keys/${seg(k.id)}`);
    load();
  });

  let loaded = null; // the first load: the form's tenant choices come from it
  const openForm = async () => {
    // (A click before the first load has answered: the form waits for the tenants, else it had none to offer.)
    await loaded;
    if (!alive) return;
    const f = keyForm(tenants, async (body) => {
      const gen = sessionGeneration();
      const res = await api("POST", "/admin/v1/keys", body);
      if (gen !== sessionGeneration()) return; // (signed out meanwhile: no secret over the sign-in form)
      formBox.replaceChildren();
      secretDialog(res, "Key created");
      load();
    }, () => formBox.replaceChildren());
    mount(formBox, f);
    f.querySelector("select, input").focus();
  };

  loaded = load();
  return () => {
    alive = false;
  };
}

function limits(l) {
  if (!l) return "–";
  const parts = [];
  if (l.requests_per_minute !== undefined) parts.push(`${num(l.requests_per_minute)} req/min`);
  if (l.tokens_per_minute !== undefined) parts.push(`${num(l.tokens_per_minute)} tok/min`);
  if (l.max_concurrent_streams !== undefined) parts.push(`${num(l.max_concurrent_streams)} streams`);
  return parts.length ? parts.join(", ") : "tenant's";
}

function field(label, input, hint) {
  return h("div", {class: "field"}, h("label", {for: input.id}, label), input, hint ? h("small", {class: "muted"}, hint) : null);
}

function keyForm(tenants, submit, cancel) {
  const tenant = h("select", {id: "key-tenant", name: "tenant", required: true}, tenants.map((t) => h("option", {value: t}, t)));
  const name = h("input", {id: "key-name", name: "name", type: "text", placeholder: "team C"});
  const models = h("input", {id: "key-models", name: "models", type: "text", placeholder: "all the tenant's"});
  const rpm = h("input", {id: "key-rpm", name: "rpm", type: "number", min: 0, step: 1});
  const tpm = h("input", {id: "key-tpm", name: "tpm", type: "number", min: 0, step: 1});
  const streams = h("input", {id: "key-streams", name: "streams", type: "number", min: 0, step: 1});
  const budgetUsd = h("input", {id: "key-budget", name: "budget", type: "number", min: 0, step: "any"});
  const budgetPeriod = h("input", {id: "key-period", name: "period", type: "text", placeholder: "720h"});
  const expires = h("input", {id: "key-expires", name: "expires", type: "datetime-local"});
  const metadata = h("textarea", {id: "key-metadata", name: "metadata", rows: 3, spellcheck: "false", placeholder: "{\"owner\": \"team-c\"}"});
  const err = h("p", {class: "error", role: "alert", id: "key-form-error"});
  const go = h("button", {type: "submit", class: "primary", id: "key-create"}, "Create");
  const int = (el) => (el.value === "" ? undefined : Number(el.value));
  const form = h("form", {class: "card form", id: "key-form", on: {submit: async (e) => {
    e.preventDefault();
    err.textContent = "";
    const body = {tenant: tenant.value};
    if (name.value.trim()) body.name = name.value.trim();
    const ms = models.value.split(",").map((s) => s.trim()).filter(Boolean);
    if (ms.length) body.models = ms;
    const l = {requests_per_minute: int(rpm), tokens_per_minute: int(tpm), max_concurrent_streams: int(streams)};
    for (const k of Object.keys(l)) if (l[k] === undefined) delete l[k];
    if (Object.keys(l).length) body.limits = l;
    if (budgetUsd.value !== "") body.budget = {usd: Number(budgetUsd.value), period: budgetPeriod.value.trim() || null};
    if (expires.value) body.expires_at = new Date(expires.value).toISOString().replace(/\.\d+Z$/, "Z");
    if (metadata.value.trim()) {
      try {
        // (Its numbers as typed: parseTyped.)
        body.metadata = parseTyped(metadata.value);
      } catch (x) {
        err.textContent = x instanceof RangeError ? `Metadata: ${x.message}` : `Metadata is not JSON: ${x.message}`;
        return;
      }
    }
    go.disabled = true;
    try {
      await submit(body);
    } catch (x) {
      err.textContent = x instanceof ApiError && x.param ? `${x.message} (${x.param})` : x.message;
      go.disabled = false;
    }
  }}},
  h("h2", {}, "New key"),
  h("div", {class: "form-grid"},
    field("Tenant", tenant), field("Name", name), field("Models", models, "comma-separated; prefix* allowed"),
    field("Requests per minute", rpm), field("Tokens per minute", tpm), field("Concurrent streams", streams),
    field("Budget (USD)", budgetUsd), field("Budget period", budgetPeriod, "24h, 720h; empty: never resets"),
    field("Expires", expires, "your local time"), field("Metadata (JSON object)", metadata)),
  h("div", {class: "form-actions"}, go, h("button", {type: "button", on: {click: cancel}}, "Cancel")),
  err);
  return form;
}

// A modal with the new secret: the only time anyone sees it.
function secretDialog(key, title) {
  const input = h("input", {type: "text", id: "new-secret", readonly: true, value: key.key, spellcheck: "false", autocomplete: "off"});
  const copied = h("span", {class: "muted", "aria-live": "polite"});
  const close = () => {
    input.value = "";
    overlay.remove();
  };
  const overlay = h("div", {class: "overlay", role: "dialog", "aria-label": title},
    h("div", {class: "dialog"},
      h("h2", {}, title),
      h("p", {}, "Key ", h("strong", {class: "mono", id: "new-key-id"}, key.id), " for tenant ", h("strong", {}, key.tenant), "."),
      h("p", {class: "warn"}, "Copy the secret now: it is shown only once and Weir keeps only its hash."),
      input,
      h("div", {class: "form-actions"},
        h("button", {type: "button", on: {click: async () => {
          input.select();
          try {
            await navigator.clipboard.writeText(input.value);
            copied.textContent = "Copied.";
          } catch {
            copied.textContent = "Select the text and copy it (the browser refused clipboard access).";
          }
        }}}, "Copy"),
        h("button", {type: "button", class: "primary", id: "secret-done", on: {click: close}}, "Done"),
        copied)));
  document.body.appendChild(overlay);
  input.select();
}

function confirmDialog(title, message, action, run) {
  const err = h("p", {class: "error", role: "alert"});
  const go = h("button", {type: "button", class: "danger", id: "confirm-go"}, action);
  const overlay = h("div", {class: "overlay", role: "dialog", "aria-label": title},
    h("div", {class: "dialog"}, h("h2", {}, title), h("p", {}, message),
      h("div", {class: "form-actions"}, go,
        h("button", {type: "button", id: "confirm-cancel", on: {click: () => overlay.remove()}}, "Cancel")), err));
  go.addEventListener("click", async () => {
    go.disabled = true;
    try {
      await run();
      overlay.remove();
    } catch (x) {
      err.textContent = x.message;
      go.disabled = false;
    }
  });
  document.body.appendChild(overlay);
  go.focus();
}

function detail(root, id) {
  const body = h("div", {}, h("p", {class: "muted"}, "Loading…"));
  mount(root, h("header", {class: "page-head"}, h("h1", {}, "Key ", h("span", {class: "mono"}, id)),
    h("a", {href: "#/keys"}, "← All keys")), body);
  let alive = true;
  get(`/admin/v1/keys/${seg(id)}`).then((k) => {
    if (!alive) return;
    const u = k.usage || {};
    const facts = [
      ["Name", k.name === null ? "–" : k.name], ["Tenant", k.tenant], ["Source", k.source],
      ["Models", k.models === null ? "the tenant's" : k.models.join(", ")], ["Limits", limits(k.limits)],
      ["Expires", k.expired ? `${unixTime(k.expires_at)} (expired)` : unixTime(k.expires_at)],
      ["Created", k.created_at ? unixTime(k.created_at) : "–"],
    ];
    if (u.requests) facts.push(["Requests bucket", `${num(u.requests.remaining)} of ${num(u.requests.limit)} left`]);
    if (u.tokens) facts.push(["Tokens bucket", `${num(u.tokens.remaining)} of ${num(u.tokens.limit)} left`]);
    if (u.streams) facts.push(["Streams", `${num(u.streams.in_flight)} of ${num(u.streams.limit)}`]);
    mount(body, h("section", {class: "card"},
      u.budget ? budget(u.budget) : h("p", {class: "muted"}, "No budget of its own (the tenant's applies)."),
      h("dl", {class: "facts"}, facts.map(([a, b]) => [h("dt", {}, a), h("dd", {}, text(b))])),
      h("h3", {}, "Metadata"),
      h("pre", {class: "json", id: "key-metadata-view"}, JSON.stringify(k.metadata, null, 2)),
      !EXACT_NUMBERS && holdsRoundedInteger(k.metadata) ? h("p", {class: "error", id: "key-metadata-rounded"},
        "This browser shows integers beyond 2^53 rounded; the key holds them exactly (read them with the admin API).") : null,
      h("p", {}, h("a", {href: `#/requests?key_id=${encodeURIComponent(k.id)}`}, "Requests with this key →"))));
  }).catch((e) => {
    if (alive) mount(body, h("p", {class: "error"}, e.status === 404 ? `No key ${id} (revoked or never created).` : e.message));
  });
  return () => {
    alive = false;
  };
}
