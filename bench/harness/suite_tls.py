"""tls: what an https:// upstream costs Weir per request against the same upstream over plain http.

Two weir-mocks that differ only in TLS (the same binary; one with --tls-cert/--tls-key), a Weir in front of
each (the https pool trusts the run's throwaway CA: `pools.mock.tls.ca_file`, verification on), clients
speaking plain HTTP to Weir in both, alternated in the same rounds. Then the same pair with the mocks'
keep-alive off (every request on a new upstream connection: TCP connect + TLS handshake, resumed from
Weir's session ticket), and a third https mock that refuses resumption (a full handshake per request)."""

from __future__ import annotations

import re

import configs
import measure
import suite_latency
import suite_stream
from common import Options, gateway_failed, live, sat_text, stop_targets
from measure import agg, median
from report import Report, table
from targets import Env, Mock, Target, direct, start_weir

TITLE = "the added cost of an https upstream per request, against the same upstream over http"
DIRECT = "direct (no gateway)"
HTTP = "weir → http"
HTTPS = "weir → https"
HTTP_NEW = "weir → http, new connection per request"
HTTPS_NEW = "weir → https, new connection per request (resumed)"
HTTPS_FULL = "weir → https, new connection per request (full handshake)"
# (plain lane, TLS lane) pairs whose ratio the report gives.
PAIRS = [(HTTP, HTTPS, "kept-alive connection"), (HTTP_NEW, HTTPS_NEW, "new connection, session resumed"),
         (HTTP_NEW, HTTPS_FULL, "new connection, full handshake")]
FRONTIER_LEVELS = [4, 16, 64, 256]
STREAM_LEVELS = (1, 16)


def c1_load(env: Env):
    """Non-streamed chat completion ("Say hello.", max_tokens 16), closed loop, one at a time."""
    return suite_latency.small_load(env, 1, 0.5 if env.smoke else 4.0)


def cpu_us_per_request(r: dict) -> float | None:
    """The gateway's CPU over one weir-bench run (warm-up and drain included, ns resolution) per request
    weir-bench completed in it (warm-up included), µs."""
    cpu = r.get("target_cpu_run_s")
    reqs = (r.get("generator") or {}).get("requests_total")
    return cpu * 1e6 / reqs if cpu is not None and reqs else None


def ratio(tls, plain) -> float | None:
    return tls / plain if tls is not None and plain is not None and plain > 0 and tls > 0 else None


def fmt_ratio(r, tls=None, plain=None) -> str:
    if r is not None:
        return f"{r:,.2f}×"
    if tls is None or plain is None:
        return "–"
    return "– (http ≤ 0)" if plain <= 0 else "– (https ≤ 0)"


def mock_counters(mock: Mock) -> dict[str, float]:
    """The mock's accepted connections, TLS handshakes (full / resumed) and finished requests."""
    text = mock.metrics()
    out = {"connections": 0.0, "handshakes_full": 0.0, "handshakes_resumed": 0.0, "requests": 0.0}
    for line in text.splitlines():
        if line.startswith("weir_mock_connections_total"):
            out["connections"] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("weir_mock_tls_handshakes_total"):
            key = "handshakes_resumed" if 'resumed="true"' in line else "handshakes_full"
            out[key] += float(line.rsplit(" ", 1)[1])
        elif line.startswith("vllm:request_success_total"):
            out["requests"] += float(line.rsplit(" ", 1)[1])
    return out


def check_lanes(c1: dict[str, list[dict]]) -> list[str]:
    """Each lane measured what it says, from its mock's counters: the kept-alive lanes reused their upstream
    connection, the others opened one per request; the resumed lane's handshakes were resumed (all but the
    first of a run), the full-handshake lane's never."""
    out = []
    for label, rs in c1.items():
        ps = [r["probe"] for r in rs if r.get("probe") and r["probe"].get("requests")]
        if label == DIRECT or not ps:
            continue
        reqs = sum(p["requests"] for p in ps)
        conns = sum(p["connections"] for p in ps)
        resumed = sum(p["handshakes_resumed"] for p in ps)
        full = sum(p["handshakes_full"] for p in ps)
        if label in (HTTP, HTTPS) and conns > 0.1 * reqs:
            out.append(f"{label}: {conns:.0f} upstream connections for {reqs:.0f} requests (kept-alive expected)")
        if label not in (HTTP, HTTPS) and conns < 0.9 * reqs:
            out.append(f"{label}: {conns:.0f} upstream connections for {reqs:.0f} requests (one each expected)")
        if label == HTTPS_NEW and resumed < 0.9 * (reqs - len(ps)):
            out.append(f"{label}: {resumed:.0f} resumed of {resumed + full:.0f} handshakes (resumption expected)")
        if label == HTTPS_FULL and resumed > 0:
            out.append(f"{label}: {resumed:.0f} resumed handshakes (the mock refuses resumption)")
    return out


def run(env: Env, opts: Options) -> Report:
    rep = Report("tls", TITLE, env)
    tls = configs.make_tls(env.work)
    # Instant mocks for the non-streamed measurements; the kept-alive pair is restarted for the streams.
    plain = Mock(env, name="mock-http", ttft_ms=0, itl_ms=0, max_tokens=128)
    secure = Mock(env, name="mock-https", ttft_ms=0, itl_ms=0, max_tokens=128, tls=tls)
    plain_new = Mock(env, name="mock-http-close", ttft_ms=0, itl_ms=0, max_tokens=128, extra=["--no-keep-alive"])
    secure_new = Mock(env, name="mock-https-close", ttft_ms=0, itl_ms=0, max_tokens=128, extra=["--no-keep-alive"],
                      tls=tls)
    secure_full = Mock(env, name="mock-https-full", ttft_ms=0, itl_ms=0, max_tokens=128,
                       extra=["--no-keep-alive", "--tls-no-resume"], tls=tls)
    mocks = {HTTP: plain, HTTPS: secure, HTTP_NEW: plain_new, HTTPS_NEW: secure_new, HTTPS_FULL: secure_full}
    rep.add_meta("mocks", f"five weir-mocks, the same binary, all on the load CPU: {plain.describe()} "
                 "(instant) over http and over https (TLS 1.3, a throwaway CA's ECDSA P-256 certificate for "
                 "127.0.0.1, made for the run), and three with `--no-keep-alive` (every response `connection: "
                 "close`): http, https, and https with `--tls-no-resume` (no session tickets, no session cache). "
                 "For the streams the kept-alive pair is restarted on the same ports with the stream suite's "
                 "timing")
    weirs = {}
    for label, m in mocks.items():
        cfg = configs.plain_tls(m.url, tls.ca) if m.tls is not None else configs.plain(m.url)
        tag = "weir-" + m.name.removeprefix("mock-")
        weirs[label] = start_weir(env, label, cfg, tag=tag, name=tag)
    w = weirs[HTTP]
    rep.add_meta("weir", f"{w.version}; --workers 1; one Weir per mock (one pool, no auth, no limits, access log "
                 "off, so TLS is the only difference); the https pools: `tls: {ca_file: <the run's CA>}`, "
                 "verification on; clients speak plain HTTP to Weir in every lane")
    rep.add_meta("load", "weir-bench closed loop, payload `small` (chat completion \"Say hello.\", max_tokens 16, "
                 "not streamed) unless said otherwise; every round runs each target once, order rotated")
    targets: list[Target] = [direct(plain)] + list(weirs.values())

    def probe(t: Target) -> dict[str, float]:
        m = mocks.get(t.label)
        return mock_counters(m) if m is not None else {}

    # ----------------------------------------------- concurrency 1, all lanes ---
    env.log("  tls: concurrency 1, instant mocks (kept-alive and new-connection lanes)")
    c1 = measure.run_cell(env, live(targets), lambda t: c1_load(env), "c1", mock=plain, give_up=gateway_failed,
                          probe=probe)
    for label, rs in c1.items():
        if env.smoke:
            measure.require_clean(env, label, rs, "c1", rep.failures)
    d_rs = c1.get(DIRECT, [])
    added = {label: {p: measure.added(rs, d_rs, "e2e", p) for p in ("p50", "p99")} for label, rs in c1.items()}
    cpu_req = {label: median(cpu_us_per_request(r) for r in rs) for label, rs in c1.items() if label != DIRECT}
    rows = []
    for label, rs in c1.items():
        if not rs:
            continue
        a = agg(rs)
        isd = label == DIRECT
        conns = [r.get("probe", {}) for r in rs if r.get("probe")]
        per_req = median(p["connections"] / p["requests"] for p in conns if p.get("requests"))
        resumed = sum(p.get("handshakes_resumed", 0) for p in conns)
        full = sum(p.get("handshakes_full", 0) for p in conns)
        hs = f"{full:,.0f} full / {resumed:,.0f} resumed" if mocks.get(label) and mocks[label].tls else ""
        rows.append([label, f"{a['achieved_rate_rps']:,.0f}",
                     f"{a['e2e_p50_us']:,.0f} / {a['e2e_p99_us']:,.0f}",
                     "" if isd else " / ".join(f"{added[label][p]:+,.0f}" if added[label][p] is not None else "–"
                                               for p in ("p50", "p99")),
                     "" if isd or cpu_req.get(label) is None else f"{cpu_req[label]:,.1f}",
                     "" if per_req is None else f"{per_req:.3f}", hs, sat_text(a)])
        rep.row("c1", label, 1, "achieved_rps", a["achieved_rate_rps"], "req/s", a["rounds"])
        for p in ("p50", "p99"):
            rep.row("c1", label, 1, f"e2e_{p}", a[f"e2e_{p}_us"], "us", a["rounds"])
            if not isd:
                rep.row("c1", label, 1, f"added_e2e_{p}", added[label][p], "us", a["rounds"])
        if not isd:
            rep.row("c1", label, 1, "cpu_per_request", cpu_req.get(label), "us", a["rounds"])
            rep.row("c1", label, 1, "upstream_connections_per_request", per_req, "connections", a["rounds"],
                    note=hs)
    for why in check_lanes(c1):
        (rep.failures if env.smoke else rep.notes).append(f"c1: {why}")
    rep.section("Concurrency 1, instant mock: added latency and CPU per request", (
        "One non-streamed request at a time. Added = e2e through the lane's Weir − e2e direct to the plain mock, "
        "per round, median over rounds (µs). **CPU per request**: the Weir process's CPU time over each "
        "weir-bench run (the scheduler's per-thread runtime from /proc, ns resolution, warm-up and drain "
        "included) ÷ the requests completed in that run, median over rounds. Upstream connections per request "
        "and the TLS handshakes are the lane's mock's own counters over the runs (`weir_mock_connections_total`, "
        "`weir_mock_tls_handshakes_total{resumed}`): about 0 on the kept-alive lanes, 1 on the others.\n\n"
        + table(["target", "req/s", "e2e p50 / p99 (µs)", "added p50 / p99 (µs)", "Weir CPU per request (µs)",
                 "upstream connections per request", "TLS handshakes", "notes"], rows)))

    # TLS − plain, per round (the same pairing as added latency), and https ÷ http.
    rows = []
    for plain_l, tls_l, what in PAIRS:
        if not c1.get(plain_l) or not c1.get(tls_l):
            continue
        diff = {p: measure.added(c1[tls_l], c1[plain_l], "e2e", p) for p in ("p50", "p99")}
        ad_p, ad_t = added[plain_l], added[tls_l]
        cp, ct = cpu_req.get(plain_l), cpu_req.get(tls_l)
        rows.append([what, " / ".join(f"{diff[p]:+,.0f}" if diff[p] is not None else "–" for p in ("p50", "p99")),
                     " / ".join(fmt_ratio(ratio(ad_t[p], ad_p[p]), ad_t[p], ad_p[p]) for p in ("p50", "p99")),
                     "–" if cp is None or ct is None else f"{ct - cp:+,.1f}", fmt_ratio(ratio(ct, cp), ct, cp)])
        for p in ("p50", "p99"):
            rep.row("tls_cost", what, 1, f"e2e_{p}_https_minus_http", diff[p], "us")
            rep.row("tls_cost", what, 1, f"added_e2e_{p}_https_over_http", ratio(ad_t[p], ad_p[p]), "ratio")
        rep.row("tls_cost", what, 1, "cpu_per_request_https_minus_http",
                None if cp is None or ct is None else ct - cp, "us")
        rep.row("tls_cost", what, 1, "cpu_per_request_https_over_http", ratio(ct, cp), "ratio")
    if c1.get(HTTP) and c1.get(HTTP_NEW):
        d = {p: measure.added(c1[HTTP_NEW], c1[HTTP], "e2e", p) for p in ("p50", "p99")}
        cn, ck = cpu_req.get(HTTP_NEW), cpu_req.get(HTTP)
        rows.append(["(for scale) a new TCP connection per request, http: new − kept-alive",
                     " / ".join(f"{d[p]:+,.0f}" if d[p] is not None else "–" for p in ("p50", "p99")), "",
                     "–" if cn is None or ck is None else f"{cn - ck:+,.1f}", ""])
        for p in ("p50", "p99"):
            rep.row("tls_cost", "new tcp connection (http)", 1, f"e2e_{p}_new_minus_kept", d[p], "us")
    rep.section("What TLS adds per request (concurrency 1)", (
        "Each row compares a TLS lane with the plain lane of the same connection handling, same rounds: "
        "https − http e2e (per round, median over rounds, µs), added latency https ÷ http, and Weir's CPU per "
        "request https − http (µs) and https ÷ http. The kept-alive row is the steady state (Weir reuses "
        "pooled connections: the record layer only); the new-connection rows put a TCP connect and a TLS 1.3 "
        "handshake under every request, resumed from the session ticket Weir kept (no certificate exchange, "
        "no verification) or full (certificate chain verified: the mock refuses resumption). The handshake "
        "costs the mock's side too, on the load CPU, and that is in the latency rows, not in Weir's CPU.\n\n"
        + table(["connection", "https − http e2e p50 / p99 (µs)", "added https ÷ http p50 / p99",
                 "Weir CPU per request https − http (µs)", "CPU https ÷ http"], rows)))

    # ------------------------------------------------------- closed-loop max ---
    env.log("  tls: closed-loop maximum (kept-alive lanes)")
    kept = [t for t in targets if t.label in (DIRECT, HTTP, HTTPS)]
    for t in targets:
        if t.label not in (DIRECT, HTTP, HTTPS):
            t.pause()
    front = suite_latency.frontier(env, kept, plain, "frontier", rep, [16] if env.smoke else FRONTIER_LEVELS)
    best = {}
    rows = []
    for label, lv in front.items():
        clean = {c: a for c, a in lv.items() if not a.get("errors_total")}
        if not clean:
            continue
        c, a = max(clean.items(), key=lambda kv: kv[1].get("achieved_rate_rps") or 0)
        cores, rps = a.get("target_cpu_cores"), a.get("achieved_rate_rps")
        per_req = cores * 1e6 / rps if label != DIRECT and cores is not None and rps else None
        best[label] = (rps, c, a, per_req)
        rows.append([label, f"{a['achieved_rate_rps']:,.0f}", c, f"{a['e2e_p99_us']:,.0f}",
                     "" if label == DIRECT or cores is None else f"{cores:.2f}",
                     "" if per_req is None else f"{per_req:,.1f}", sat_text(a)])
        rep.row("max_rps", label, c, "max_rps_zero_failures", a["achieved_rate_rps"], "req/s", a["rounds"])
        if label != DIRECT:
            rep.row("max_rps", label, c, "cpu_cores", cores, "cores", a["rounds"])
            rep.row("max_rps", label, c, "cpu_per_request", per_req, "us", a["rounds"])
    rh, rs_ = best.get(HTTP), best.get(HTTPS)
    r_max = ratio(rs_[0], rh[0]) if rh and rs_ else None
    rep.row("max_rps", "https over http", "", "max_rps_https_over_http", r_max, "ratio")
    bound = ""
    idle = [(label, b[2]["target_cpu_cores"]) for label, b in best.items()
            if label != DIRECT and b[2].get("target_cpu_cores") is not None and b[2]["target_cpu_cores"] < 0.9]
    if idle:
        bound = (" In this run " + " and ".join(f"{label}'s Weir used {cores:.2f}" for label, cores in idle)
                 + " of its core at the maximum: the limit was the load CPU (weir-bench and the mock, whose TLS "
                 "work is there too), not Weir; the ratio is then the load side's.")
        rep.note("closed-loop maximum:" + bound.replace(" In this run", " in this run", 1))
    rep.section("Closed-loop maximum (kept-alive connections)", (
        "The most requests/s with zero failures over concurrency "
        + ", ".join(str(c) for c in sorted({c for lv in front.values() for c in lv}))
        + f" (closed loop, instant mocks), and Weir's CPU there (cores; 1.00 is its whole core, and per request: "
        "cores ÷ req/s, over the measured window). https ÷ http: "
        f"{fmt_ratio(r_max)}. The direct row is the plain mock and the load generator alone on their core: the "
        "ceiling of every lane here, and the TLS mock spends more of that core than the plain one." + bound
        + "\n\n" + table(["target", "max req/s", "at concurrency", "p99 (µs)", "Weir CPU", "Weir CPU per request (µs)",
                           "notes"], rows)))

    # ----------------------------------------------------------------- streams ---
    suite_stream.configure(env.smoke)
    tt, it = suite_stream.TTFT_MS, suite_stream.ITL_MS
    env.log(f"  tls: streaming TTFT (mocks restarted with --ttft-ms {tt} --itl-ms {it})")
    plain.restart(ttft_ms=tt, itl_ms=it, max_tokens=suite_stream.TOKENS)
    secure.restart(ttft_ms=tt, itl_ms=it, max_tokens=suite_stream.TOKENS)
    ttft: dict[int, dict[str, list[dict]]] = {}
    for c in STREAM_LEVELS:
        ttft[c] = measure.run_cell(env, kept, lambda t: suite_stream.ttft_load(env, c), f"ttft-c{c}", mock=plain,
                                   give_up=gateway_failed)
        if env.smoke:
            for label, rs in ttft[c].items():
                measure.require_clean(env, label, rs, f"ttft c={c}", rep.failures)
    rows = []
    ttft_added: dict[int, dict[str, dict]] = {}
    for c in STREAM_LEVELS:
        d = ttft[c].get(DIRECT, [])
        ttft_added[c] = {}
        for label, rs in ttft[c].items():
            if not rs:
                continue
            a = agg(rs)
            ad = {p: measure.added(rs, d, "ttft", p) for p in ("p50", "p99")}
            ttft_added[c][label] = ad
            isd = label == DIRECT
            rows.append([c, label, f"{a.get('ttft_count', 0):,}",
                         f"{(a.get('ttft_p50_us') or 0) / 1000:.3f} / {(a.get('ttft_p99_us') or 0) / 1000:.3f}",
                         "" if isd else " / ".join(f"{ad[p]:+,.0f}" if ad[p] is not None else "–"
                                                   for p in ("p50", "p99")),
                         "" if isd or label == HTTP else " / ".join(
                             fmt_ratio(ratio(ad[p], ttft_added[c].get(HTTP, {}).get(p)), ad[p],
                                       ttft_added[c].get(HTTP, {}).get(p)) for p in ("p50", "p99")),
                         sat_text(a)])
            for p in ("p50", "p99"):
                rep.row("ttft", label, c, f"ttft_{p}", a.get(f"ttft_{p}_us"), "us", a.get("rounds"))
                if not isd:
                    rep.row("ttft", label, c, f"added_ttft_{p}", ad[p], "us", a.get("rounds"))
            if label == HTTPS:
                for p in ("p50", "p99"):
                    h = ttft_added[c].get(HTTP, {}).get(p)
                    rep.row("ttft", "https over http", c, f"added_ttft_{p}_https_over_http", ratio(ad[p], h), "ratio")
                    rep.row("ttft", "https minus http", c, f"ttft_{p}_https_minus_http",
                            measure.added(rs, ttft[c].get(HTTP, []), "ttft", p), "us")
    rep.section("Streaming: added TTFT at concurrency 1 and 16 (kept-alive connections)", (
        f"The stream suite's TTFT measurement (`suite_stream.ttft_load`): 2-token streams, mock first token after "
        f"{tt} ms; concurrency 1 closed loop, 16 open loop at the rate that keeps 16 streams in flight, latency "
        f"from the intended send time. TTFT in ms, added = the lane − direct (µs), median of per-round "
        f"differences; https ÷ http of the added TTFT.\n\n"
        + table(["concurrency", "target", "TTFT n", "TTFT p50 / p99 (ms)", "added p50 / p99 (µs)",
                 "added https ÷ http p50 / p99", "notes"], rows)))
    stop_targets(targets)
    for m in mocks.values():
        m.stop()

    # ----------------------------------------------------------------- summary ---
    rows = []

    def add_row(metric: str, h, s, unit: str, digits: int = 0):
        r = ratio(s, h)
        rows.append([metric, "–" if h is None else f"{h:,.{digits}f}", "–" if s is None else f"{s:,.{digits}f}",
                     fmt_ratio(r, s, h)])
        rep.row("summary", "https over http", unit, metric, r, "ratio",
                note=f"http {'–' if h is None else f'{h:,.{digits}f}'}, https {'–' if s is None else f'{s:,.{digits}f}'} {unit}")

    for p in ("p50", "p99"):
        add_row(f"added e2e {p}, concurrency 1 (µs)", added.get(HTTP, {}).get(p), added.get(HTTPS, {}).get(p), "us")
    add_row("closed-loop max req/s", rh[0] if rh else None, rs_[0] if rs_ else None, "req/s")
    for c in STREAM_LEVELS:
        for p in ("p50", "p99"):
            add_row(f"added TTFT {p}, concurrency {c} (µs)", ttft_added[c].get(HTTP, {}).get(p),
                    ttft_added[c].get(HTTPS, {}).get(p), "us")
    add_row("Weir CPU per request at the closed-loop maximum (µs)", rh[3] if rh else None, rs_[3] if rs_ else None,
            "us", 1)
    add_row("Weir CPU per request, kept-alive (µs)", cpu_req.get(HTTP), cpu_req.get(HTTPS), "us", 1)
    add_row("Weir CPU per request, new connection, resumed (µs)", cpu_req.get(HTTP_NEW), cpu_req.get(HTTPS_NEW),
            "us", 1)
    add_row("Weir CPU per request, new connection, full handshake (µs)", cpu_req.get(HTTP_NEW),
            cpu_req.get(HTTPS_FULL), "us", 1)
    for p in ("p50", "p99"):
        add_row(f"added e2e {p}, new connection, resumed (µs)", added.get(HTTP_NEW, {}).get(p),
                added.get(HTTPS_NEW, {}).get(p), "us")
        add_row(f"added e2e {p}, new connection, full handshake (µs)", added.get(HTTP_NEW, {}).get(p),
                added.get(HTTPS_FULL, {}).get(p), "us")
    rep.sections.insert(0, ("https ÷ http", (
        "Every measure of this run for the http lane and the https lane (same Weir binary and config but the "
        "pool's scheme and CA, same mock binary but --tls-cert, alternated in the same rounds); the ratio is "
        "https ÷ http (above 1: TLS costs that much more). Latencies are added over the direct path to the plain "
        "mock; no ratio where a value is within the noise of the direct path (≤ 0). The new-connection rows "
        "compare with http on a new connection per request as well.\n\n"
        + table(["measure", "http", "https", "https ÷ http"], rows))))
    rep.data = {"c1": {k: [trim(r) for r in v] for k, v in c1.items()},
                "max_rps": {k: {str(c): a for c, a in lv.items()} for k, lv in front.items()},
                "ttft": {str(c): {k: [trim(r) for r in v] for k, v in ttft[c].items()} for c in STREAM_LEVELS}}

    def figure(plt):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        labels = [lbl for lbl in c1 if lbl != DIRECT and c1[lbl]]
        xs = range(len(labels))
        for i, p in enumerate(("p50", "p99")):
            axes[0].bar([x + (i - 0.5) * 0.4 for x in xs], [max(added[lbl][p] or 0, 0) for lbl in labels],
                        width=0.4, label=f"added {p}")
        axes[0].set_xticks(list(xs))
        axes[0].set_xticklabels([re.sub(r"new connection per request", "new conn.", lbl) for lbl in labels],
                                rotation=20, fontsize=6)
        axes[0].set_ylabel("added e2e at concurrency 1 (µs)")
        axes[0].legend(fontsize=7)
        axes[1].bar(list(xs), [cpu_req.get(lbl) or 0 for lbl in labels], color="C2")
        axes[1].set_xticks(list(xs))
        axes[1].set_xticklabels([re.sub(r"new connection per request", "new conn.", lbl) for lbl in labels],
                                rotation=20, fontsize=6)
        axes[1].set_ylabel("Weir CPU per request (µs)")
        return fig
    rep.figure = figure
    return rep


def trim(r: dict) -> dict:
    keep = ("round", "achieved_rate_rps", "errors_total", "errors", "e2e", "ttft", "generator_saturated",
            "target_cpu_run_s", "generator", "probe", "raw_file")
    return {k: r.get(k) for k in keep if k in r}
