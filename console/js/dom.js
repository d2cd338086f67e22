// DOM building for the console: elements and text nodes only.
//
// Everything the admin API returns is data (key names and metadata, tenant
// names, request ids, models a client sent): it reaches the page through
// text nodes and form values, never through an HTML parser. The server's
// Content-Security-Policy enforces this too (require-trusted-types-for
// 'script' with no policy: innerHTML and the like throw).

const SAFE_ATTRS = new Set([
  "id", "type", "name", "value", "placeholder", "for", "title", "role", "colspan", "min", "max", "step",
  "autocomplete", "spellcheck", "readonly", "disabled", "required", "checked", "selected", "rows", "list",
  "aria-label", "aria-live", "aria-current", "aria-hidden", "width", "height", "tabindex", "lang",
]);

// h("button", {class: "x", on: {click: fn}, href: "#/keys"}, "text", child, [more])
// Attributes outside SAFE_ATTRS are refused (no on*, no style, no src); href
// takes in-page links ("#/...") only; data-* go through dataset.
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = Array.isArray(v) ? v.filter(Boolean).join(" ") : v;
    else if (k === "on") for (const [ev, fn] of Object.entries(v)) el.addEventListener(ev, fn);
    else if (k === "data") for (const [dk, dv] of Object.entries(v)) el.dataset[dk] = String(dv);
    else if (k === "href") {
      if (typeof v !== "string" || !v.startsWith("#")) throw new Error("h: only in-page links");
      el.setAttribute("href", v);
    } else if (k === "text") el.textContent = String(v);
    else if (SAFE_ATTRS.has(k)) el.setAttribute(k, v === true ? "" : String(v));
    else throw new Error(`h: attribute ${k} is not allowed`);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// Replaces el's children (no HTML parsing).
export function mount(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

// --- formatting (all return plain strings) ---

// Modal dialogs (a new key's secret, a confirmation) are attached to <body>, outside #app, so a page's
// re-render does not take them away. When the session ends (sign-out, the idle timeout, a refused token)
// every one goes, its fields emptied first: no secret or action stays on screen over the sign-in form.
export function closeOverlays() {
  for (const o of document.querySelectorAll("body > .overlay")) {
    for (const i of o.querySelectorAll("input, textarea")) i.value = "";
    o.remove();
  }
}

export function usd(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  const a = Math.abs(v);
  if (a === 0) return "$0";
  if (a < 1) {
    // Up to 6 decimals (a request costs millionths), at least 2, no trailing zeros: $0.05, $0.000016.
    let t = a.toFixed(6).replace(/0+$/, "");
    if (t.split(".")[1].length < 2) t = a.toFixed(2);
    return `${v < 0 ? "-" : ""}$${t}`;
  }
  return `${v < 0 ? "-" : ""}$${a.toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2})}`;
}

export function num(v, digits = 0) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return Number(v).toLocaleString("en-US", {minimumFractionDigits: digits, maximumFractionDigits: digits});
}

export function ms(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (v >= 10000) return `${(v / 1000).toFixed(1)} s`;
  if (v >= 100) return `${Math.round(v)} ms`;
  return `${v.toFixed(1)} ms`;
}

export function pct(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  return `${(v * 100).toFixed(v > 0 && v < 0.1 ? 1 : 0)}%`;
}

// Unix seconds → "2026-11-30 03:54:24Z" (UTC, like the request log's ts).
export function unixTime(s) {
  if (s === null || s === undefined) return "never";
  return new Date(s * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

// A request log ts ("2026-11-30T03:54:24.933Z") for a table cell.
export function logTime(ts) {
  return typeof ts === "string" ? ts.replace("T", " ") : "–";
}

// A budget period as the API answers it (seconds, "86400s" or "1.5s"; a calendar period's word, "day"; null:
// never resets), or any duration string the configuration takes ("1500ms", "90m", "24h", "7d", "250us") or a
// number of milliseconds → "1d", "12h", "90s", "1.5s", "250ms". Anything else is shown as it is.
const UNIT_MS = {us: 0.001, "µs": 0.001, ms: 1, s: 1000, m: 60000, h: 3600000, d: 86400000};
export function period(p) {
  if (p === null || p === undefined) return "never resets";
  let ms = typeof p === "number" ? p : NaN;
  if (typeof p === "string") {
    const m = /^\s*(\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)\s*(us|µs|ms|s|m|h|d)?\s*$/.exec(p);
    if (m) ms = Number(m[1]) * UNIT_MS[m[2] || "ms"];
  }
  if (!Number.isFinite(ms) || ms <= 0) return String(p);
  ms = Math.round(ms * 1000) / 1000;  // (a float's 1.5 * 1000 noise)
  for (const [unit, size] of [["d", 86400000], ["h", 3600000], ["m", 60000], ["s", 1000]])
    if (ms % size === 0) return `${ms / size}${unit}`;
  if (ms >= 1000) return `${ms / 1000}s`;
  return `${ms}ms`;
}

// A value of any JSON type as one line of text.
export function text(v) {
  if (v === null || v === undefined) return "–";
  if (typeof v === "object") return JSON.stringify(v);
  return String(v);
}

export function badge(kind, label) {
  return h("span", {class: ["badge", `badge-${kind}`]}, label);
}

export function statusBadge(status) {
  const kind = status >= 500 ? "bad" : status >= 400 ? "warn" : "ok";
  return badge(kind, String(status));
}
