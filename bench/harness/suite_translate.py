"""translate: what the protocol translators cost. The same weir-mock stream through the same Weir as
/v1/chat/completions (passed through), /v1/messages (Anthropic Messages, translated both ways) and
/v1/responses (OpenAI Responses, translated both ways), alternated in the same rounds: added TTFT of each
translated route over plain chat, and the gateway's CPU per upstream SSE event."""

from __future__ import annotations

import json

import configs
import measure
from common import Options, sat_text, stop_targets
from loadgen import Load
from measure import agg
from report import Report, table
from targets import Env, Mock, Target, direct, start_weir

TITLE = "protocol translation: /v1/messages and /v1/responses against /v1/chat/completions"
TOKENS = 64
TTFT_MS, ITL_MS = 20, 5
CHAT = "weir /v1/chat/completions"
ROUTES = {  # label -> (path, body)
    CHAT: ("/v1/chat/completions", {"messages": [{"role": "user", "content": "{prompt}"}], "max_tokens": "{n}",
                                    "stream": True, "stream_options": {"include_usage": True}}),
    "weir /v1/messages": ("/v1/messages", {"messages": [{"role": "user", "content": "{prompt}"}],
                                           "max_tokens": "{n}", "stream": True}),
    "weir /v1/responses": ("/v1/responses", {"input": "{prompt}", "max_output_tokens": "{n}", "stream": True}),
}
PROMPT = " ".join(f"word{i % 97}" for i in range(300))   # the seed's 300-word prompt shape
LEVELS = (1, 16)


def configure(smoke: bool) -> None:
    global TTFT_MS, ITL_MS
    TTFT_MS, ITL_MS = (5, 2) if smoke else (20, 5)


def payload(label: str, n: int) -> list[str]:
    """One request body (weir-bench --payload-file): the route's shape, the same prompt and length."""
    path, body = ROUTES.get(label, ROUTES[CHAT])
    text = json.dumps(dict(body, model="{model}"))
    return [text.replace('"{prompt}"', json.dumps(PROMPT)).replace('"{n}"', str(n))]


def stream_s(n: int) -> float:
    return (TTFT_MS + (n - 1) * ITL_MS) / 1000.0


def load(env: Env, t: Target, c: int, n: int) -> Load:
    """Concurrency 1: closed loop; 16: open loop at the rate that keeps 16 streams in flight."""
    path = ROUTES.get(t.label, ROUTES[CHAT])[0]
    dur = 0.4 if env.smoke else (6.0 if n == 2 else 5.0)
    common = dict(duration=dur, warmup=0.1 if env.smoke else 0.3, payload_lines=payload(t.label, n), stall_ms=1000,
                  timeout=30,
                  extra=["--path", path])
    if c == 1:
        return Load(concurrency=1, **common)
    return Load(rate=c / stream_s(n), max_lag_ms=5, **common)


def upstream_events(r: dict, n: int) -> float | None:
    """SSE events the upstream sent in one run: every request's stream is the mock's role delta, n deltas,
    the usage chunk and [DONE] (the translated routes ask for usage, and so does the chat payload)."""
    reqs = (r.get("generator") or {}).get("requests_total")
    return reqs * (n + 3) if reqs else None


def cpu_per_upstream_event(r: dict, n: int) -> float | None:
    cpu, ev = r.get("target_cpu_run_s"), upstream_events(r, n)
    return cpu * 1e6 / ev if cpu is not None and ev else None


def run(env: Env, opts: Options) -> Report:
    rep = Report("translate", TITLE, env)
    configure(env.smoke)
    mock = Mock(env, ttft_ms=TTFT_MS, itl_ms=ITL_MS, max_tokens=TOKENS)
    rep.add_meta("mock", mock.describe() + f": a role delta, up to {TOKENS} content deltas {ITL_MS} ms apart, "
                 "usage, [DONE]")
    weir = start_weir(env, CHAT, configs.plain(mock.url), tag="weir-translate")
    rep.add_meta("weir", f"{weir.version}; --workers 1; one pool, no auth, access log off. One process serves all "
                 "three routes: the translated ones are Target views of it with another path and body")
    targets: list[Target] = [direct(mock), weir]
    for label in ROUTES:
        if label != CHAT:
            targets.append(Target(name="weir", label=label, url=weir.url, port=weir.port, proc=weir.proc,
                                  version=weir.version))
    rep.add_meta("load", f"the same {len(PROMPT.split())}-word prompt as each route's request shape (chat: "
                 "stream_options.include_usage, as the translated routes ask upstream); concurrency 1 closed loop, "
                 "16 open loop; every round runs each route once, order rotated")

    ttft: dict[int, dict[str, list[dict]]] = {}
    full: dict[int, dict[str, list[dict]]] = {}
    # Smoke (CI: seconds): concurrency 1 only, and the full streams' first tokens stand for TTFT.
    levels = (1,) if env.smoke else LEVELS
    for c in levels:
        env.log(f"  translate: CPU per event at concurrency {c} ({TOKENS}-token streams)")
        full[c] = measure.run_cell(env, targets, lambda t: load(env, t, c, TOKENS), f"full-c{c}", mock=mock)
        if env.smoke:
            ttft[c] = full[c]
            continue
        env.log(f"  translate: TTFT at concurrency {c} (2-token streams)")
        ttft[c] = measure.run_cell(env, targets, lambda t: load(env, t, c, 2), f"ttft-c{c}", mock=mock)
        for res in ({"": []} if env.smoke else ttft[c], full[c]):
            for label, rs in res.items():
                if env.smoke:
                    measure.require_clean(env, label, rs, f"translate c={c}", rep.failures)
                for r in rs:
                    if r.get("ok") and not r.get("tokens"):
                        rep.failures.append(f"translate c={c}: {label} counted no tokens ({r.get('raw_file')})")
    stop_targets([weir])
    mock.stop()

    rows = []
    for c in levels:
        chat_rs = ttft[c].get(CHAT, [])
        for label, rs in ttft[c].items():
            if not rs:
                continue
            a = agg(rs)
            vs_direct = {p: measure.added(rs, ttft[c].get("direct (no gateway)", []), "ttft", p)
                         for p in ("p50", "p99")}
            vs_chat = {p: measure.added(rs, chat_rs, "ttft", p) for p in ("p50", "p99")}
            gw = label != "direct (no gateway)"
            rows.append([c, label, f"{a.get('ttft_count', 0):,}",
                         " / ".join(f"{(a.get(f'ttft_{p}_us') or 0) / 1000:.3f}" for p in ("p50", "p99")),
                         " / ".join(f"{vs_direct[p]:+,.0f}" if gw and vs_direct[p] is not None else "–"
                                    for p in ("p50", "p99")),
                         " / ".join(f"{vs_chat[p]:+,.0f}" if gw and label != CHAT and vs_chat[p] is not None
                                    else "–" for p in ("p50", "p99")),
                         sat_text(a)])
            for p in ("p50", "p99"):
                rep.row("ttft", label, c, f"ttft_{p}", a.get(f"ttft_{p}_us"), "us", a.get("rounds"))
                if gw:
                    rep.row("ttft", label, c, f"added_ttft_{p}", vs_direct[p], "us", a.get("rounds"))
                if gw and label != CHAT:
                    rep.row("ttft", label, c, f"ttft_{p}_over_chat", vs_chat[p], "us", a.get("rounds"))
    rep.section("Added TTFT", (
        ("Smoke: the first tokens of the full streams. " if env.smoke else "") +
        "Time to the first token event of 2-token streams (µs). Added = the route through Weir − direct to the "
        "mock (chat, same round); over chat = the translated route − /v1/chat/completions through the same "
        "Weir, same round: what translation adds to the first token. Medians over rounds of per-round "
        "differences.\n\n"
        + table(["concurrency", "target", "TTFT n", "TTFT p50 / p99 (ms)", "added p50 / p99 (µs)",
                 "over chat p50 / p99 (µs)", "notes"], rows)))

    rows = []
    per_event: dict[int, dict[str, float | None]] = {}
    for c in levels:
        per_event[c] = {}
        for label, rs in full[c].items():
            if not rs or label == "direct (no gateway)":
                continue
            up = measure.median(cpu_per_upstream_event(r, TOKENS) for r in rs)
            client = measure.median(measure.cpu_us_per_event(r) for r in rs)
            per_event[c][label] = up
            events = measure.median((r.get("generator") or {}).get("events_total") for r in rs)
            reqs = measure.median((r.get("generator") or {}).get("requests_total") for r in rs)
            ch = per_event[c].get(CHAT)
            over = up - ch if up is not None and ch is not None and label != CHAT else None
            rows.append([c, label, f"{reqs or 0:,.0f}", f"{events or 0:,.0f}",
                         f"{up:.2f}" if up is not None else "–", f"{client:.2f}" if client is not None else "–",
                         f"{over:+.2f}" if over is not None else "–",
                         f"{over / ch * 100:+.0f} %" if over is not None and ch else "–", sat_text(agg(rs))])
            rep.row("cpu", label, c, "cpu_per_upstream_event", up, "us", len(rs))
            rep.row("cpu", label, c, "cpu_per_client_event", client, "us", len(rs))
            if over is not None:
                rep.row("cpu", label, c, "cpu_per_upstream_event_over_chat", over, "us", len(rs))
    rep.section("CPU per event", (
        f"{TOKENS}-token streams. The gateway's CPU time over each weir-bench run (warm-up and drain included, "
        f"ns resolution) divided by the upstream's SSE events in it (requests × {TOKENS + 3}: the same upstream "
        "stream for every route), and by the events the client received (each route frames the stream "
        "differently: chat passes the mock's 67, /v1/messages sends message_start, block start/stop, "
        "message_delta and message_stop around the deltas, /v1/responses its created/in_progress/item/part "
        "and done events). Over chat: the translated route − chat per upstream event, same rounds.\n\n"
        + table(["concurrency", "route", "streams", "client events", "CPU µs / upstream event",
                 "CPU µs / client event", "over chat (µs)", "over chat", "notes"], rows)))
    for c in levels:
        for label in ROUTES:
            if label == CHAT:
                continue
            up, ch = per_event[c].get(label), per_event[c].get(CHAT)
            if up is not None and ch is not None:
                rep.note(f"concurrency {c}: {label} costs {up - ch:+.2f} µs CPU per upstream event over chat "
                         f"({up:.2f} against {ch:.2f})")
    rep.data = {"ttft": {str(c): {k: [trim(r) for r in v] for k, v in ttft[c].items()} for c in levels},
                "full": {str(c): {k: [trim(r) for r in v] for k, v in full[c].items()} for c in levels}}

    def figure(plt):
        fig, ax = plt.subplots(figsize=(7, 4))
        labels = [lbl for lbl in ROUTES]
        for i, c in enumerate(levels):
            vals = [per_event[c].get(lbl) or 0 for lbl in labels]
            ax.bar([x + i * 0.4 for x in range(len(labels))], vals, width=0.4, label=f"concurrency {c}")
        ax.set_xticks([x + 0.2 for x in range(len(labels))])
        ax.set_xticklabels([lbl.replace("weir ", "") for lbl in labels], fontsize=8)
        ax.set_ylabel("gateway CPU µs per upstream SSE event")
        ax.grid(True, axis="y", alpha=0.3)
        ax.legend(fontsize=7)
        return fig
    rep.figure = figure
    return rep


def trim(r: dict) -> dict:
    keep = ("round", "ok", "errors_total", "tokens", "events", "target_cpu_run_s", "generator", "ttft", "e2e",
            "generator_saturated", "raw_file")
    return {k: r.get(k) for k in keep}
