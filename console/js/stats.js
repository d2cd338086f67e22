// Live traffic from GET /admin/v1/stats: the server's counters are
// cumulative since start; this module polls them every POLL_MS while
// signed in, keeps the last HISTORY snapshots, and turns consecutive
// snapshots into rates: requests per second, error ratio and TTFT
// (p50/p99 from the per-model histogram's bucket deltas, interpolated as
// Prometheus' histogram_quantile does; mean per tenant).

import {get} from "./api.js";

export const POLL_MS = 2000;
const HISTORY = 150; // 5 minutes at 2 s

const snapshots = [];
const listeners = new Set();
let timer = null;
let lastError = null;

export function onStats(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

export function latest() {
  return snapshots.length ? snapshots[snapshots.length - 1] : null;
}

export function error() {
  return lastError;
}

export function start() {
  if (timer !== null) return;
  const tick = async () => {
    try {
      const s = await get("/admin/v1/stats");
      lastError = null;
      snapshots.push(s);
      if (snapshots.length > HISTORY) snapshots.shift();
    } catch (e) {
      lastError = e;
    }
    for (const fn of listeners) fn();
    if (timer !== null) timer = setTimeout(tick, POLL_MS);
  };
  timer = setTimeout(tick, 0);
}

export function stop() {
  if (timer !== null) clearTimeout(timer);
  timer = null;
  snapshots.length = 0;
}

const keyOf = {
  models: (m) => (m.model === null ? "(no model)" : m.model),
  tenants: (t) => (t.overflow ? "(other tenants)" : t.tenant),
};

// The rows of kind "models" or "tenants" of one snapshot, by display name.
function rows(s, kind) {
  const out = new Map();
  for (const r of s[kind] || []) out.set(keyOf[kind](r), r);
  return out;
}

// Every interval between snapshots: {t, rows: Map(name → {rps, errorRate, ttftP50, ttftP99, ttftMean})}.
function intervals(kind) {
  const out = [];
  for (let i = 1; i < snapshots.length; i++) {
    const a = snapshots[i - 1], b = snapshots[i];
    const dt = (b.time_ms - a.time_ms) / 1000;
    if (!(dt > 0)) continue;
    const ra = rows(a, kind), rb = rows(b, kind);
    const res = new Map();
    for (const [name, cur] of rb) {
      const prev = ra.get(name);
      res.set(name, delta(prev, cur, dt, b.ttft_buckets_s));
    }
    out.push({t: b.time_ms, rows: res});
  }
  return out;
}

function delta(prev, cur, dt, bounds) {
  const d = (f) => Math.max(0, f(cur) - (prev ? f(prev) : 0));
  const reqs = d((r) => r.requests);
  const errs = d((r) => r.errors_4xx + r.errors_5xx);
  const tc = d((r) => r.ttft.count);
  const ts = d((r) => r.ttft.sum_s);
  const out = {
    rps: reqs / dt,
    errorRate: reqs > 0 ? errs / reqs : null,
    ttftMean: tc > 0 ? (ts / tc) * 1000 : null,
    ttftP50: null,
    ttftP99: null,
  };
  if (cur.ttft.buckets && tc > 0) {
    const buckets = cur.ttft.buckets.map((c, i) => c - (prev && prev.ttft.buckets ? prev.ttft.buckets[i] : 0));
    out.ttftP50 = quantile(0.5, bounds, buckets) * 1000;
    out.ttftP99 = quantile(0.99, bounds, buckets) * 1000;
  }
  return out;
}

// histogram_quantile over cumulative counts (one per bound, then +Inf).
export function quantile(q, bounds, cumulative) {
  const total = cumulative[cumulative.length - 1];
  if (!(total > 0)) return null;
  const rank = q * total;
  for (let i = 0; i < bounds.length; i++) {
    if (cumulative[i] >= rank) {
      const lo = i === 0 ? 0 : bounds[i - 1];
      const below = i === 0 ? 0 : cumulative[i - 1];
      const inBucket = cumulative[i] - below;
      return inBucket > 0 ? lo + ((bounds[i] - lo) * (rank - below)) / inBucket : bounds[i];
    }
  }
  return bounds[bounds.length - 1]; // in +Inf: the highest finite bound, as Prometheus does
}

// Chart series: one per model or tenant, `field` of every interval.
export function series(kind, field, suffix = "") {
  const iv = intervals(kind);
  const names = new Set();
  for (const x of iv) for (const n of x.rows.keys()) names.add(n);
  return [...names].sort().map((name) => ({
    name: name + suffix,
    points: iv.map((x) => [x.t, x.rows.has(name) ? x.rows.get(name)[field] : null]),
  }));
}

// The latest interval's values by name (the tables under the charts), or an empty Map.
export function current(kind) {
  const iv = intervals(kind);
  return iv.length ? iv[iv.length - 1].rows : new Map();
}
