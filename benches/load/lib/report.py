#!/usr/bin/env python3
"""Turns the load suite's raw runs (one JSON line per run) into report.json,
report.md and chart.png: every figure is the median of the runs, with its
spread (min-max), and its ratio to direct and to nginx / HAProxy in the same
scenario (Envoy, when the suite found it, in the paired ratios); then every goal
the suite measures (plain HTTP/1.1, HTTP/2, the Redis limiter, TLS new and
resumed connections, the TLS tail, the cold PostgreSQL store) with its figure.

usage: report.py --raw RAW.jsonl --meta META.json --resources RES.json --out DIR [--note TEXT]
"""
import argparse
import json
import statistics
import time
from pathlib import Path

SCENARIOS = [
    # (scenario, target, label)
    ("saturation", "direct", "direct to upstream (HTTP/1.1)"),
    ("saturation", "gateway", "gateway, plain HTTP"),
    ("saturation", "gateway_redis", "gateway, plain HTTP, limiter in Redis (backend = \"redis\")"),
    ("saturation", "gateway_redis_credits", "gateway, plain HTTP, limiter in Redis, a key with usage credits"),
    ("tls_keepalive", "gateway", "gateway, TLS keep-alive"),
    ("tls_keepalive", "nginx", "nginx, TLS keep-alive"),
    ("tls_keepalive", "haproxy", "HAProxy, TLS keep-alive"),
    ("tls_new_conn", "gateway", "gateway, new TLS connection per request (X25519MLKEM768 negotiated)"),
    ("tls_new_conn", "gateway_classical", "gateway, new TLS connection per request, client offering X25519 only"),
    ("tls_new_conn", "nginx", "nginx, new TLS connection per request"),
    ("tls_new_conn", "haproxy", "HAProxy, new TLS connection per request"),
    ("tls_resume", "gateway", "gateway, resumed TLS 1.3 session per request"),
    ("tls_resume", "nginx", "nginx, resumed TLS 1.3 session per request"),
    ("tls_resume", "haproxy", "HAProxy, resumed TLS 1.3 session per request"),
    ("tail_plain", "gateway", "gateway, plain HTTP keep-alive, tail once connections are open (h2load --h1)"),
    ("tail_tls", "gateway", "gateway, TLS keep-alive, tail once connections are open (h2load --h1)"),
    ("http2", "gateway", "gateway, HTTP/2 over TLS (10 conns x 32 streams)"),
    ("http2", "nginx", "nginx, HTTP/2 over TLS (10 conns x 32 streams)"),
    ("http2", "haproxy", "HAProxy, HTTP/2 over TLS (10 conns x 32 streams)"),
    ("invalid_keys", "gateway", "gateway, flood of unknown keys (401)"),
    ("rate_limited_429", "gateway", "gateway, flood of rate-limited requests (429)"),
    ("keys_1", "gateway", "gateway, 1 key (wrk Lua)"),
    ("keys_100k", "gateway", "gateway, 100 000 distinct keys (wrk Lua)"),
    ("pg_cold", "gateway_pg", "gateway on PostgreSQL, 100 000 keys first seen (cold)"),
    ("pg_warm", "gateway_pg", "gateway on PostgreSQL, the same keys again (warm)"),
    ("saturation", "nginx", "nginx, same job"),
    ("saturation", "haproxy", "HAProxy, same job"),
    ("saturation", "envoy", "Envoy, same job"),
    ("saturation", "relay", "bare TCP relay (HAProxy mode tcp: no HTTP, no auth), a proxy's ceiling here"),
]
# The scenarios the gateway, nginx and HAProxy all run over TLS.
TLS_SCENARIOS = ["tls_keepalive", "tls_new_conn", "tls_resume", "http2"]
FIXED = ["fixed_quarter", "fixed_half", "paced_half"]
# How each fixed load is named in the Markdown.
FIXED_LABELS = {"fixed_quarter": "quarter (oha)", "fixed_half": "half (oha)",
                "paced_half": "half, paced (h2load)"}


def stat(values):
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": len(values),
    }


def others_on_core0(r):
    """How much of core 0 was busy beyond the server's own CPU during a run,
    in percent of the core (run.sh's core0_s: every busy tick of core 0 in
    /proc/stat; cpu_s: the server's own), or None for a run without it or
    whose server is not on core 0 (direct). Interrupts and kernel work charged
    to no process make a floor of a few percent, and 100 Hz tick sampling
    moves it by a few more either way."""
    if "core0_s" not in r or not r["duration_us"] or r["target"] == "direct":
        return None
    return max(0.0, (r["core0_s"] - r["cpu_s"]) / (r["duration_us"] / 1e6) * 100)


# A run with more than this share of core 0 going to others did not measure
# the server alone (another process spinning there shows as tens of percent):
# the report names it.
OTHERS_ON_CORE0_PCT = 15


def summarize(rows):
    rps = [r["requests"] / r["duration_us"] * 1e6 if r["duration_us"] else None for r in rows]
    cpu = [r["cpu_s"] / r["requests"] * 1e6 if r["requests"] else None for r in rows]
    sys_ = [r["sys_s"] / r["requests"] * 1e6 if r["requests"] and "sys_s" in r else None for r in rows]

    def busy(key):  # the share of a run's time that `key` (seconds of CPU) covers
        return stat([r[key] / (r["duration_us"] / 1e6) if r["duration_us"] and key in r else None for r in rows])

    return {
        "tool": rows[0]["tool"],
        "rps": stat(rps),
        "p50_ms": stat([r.get("p50_us") and r["p50_us"] / 1000 for r in rows]),
        "p99_ms": stat([r.get("p99_us") and r["p99_us"] / 1000 for r in rows]),
        "p999_ms": stat([r.get("p999_us") and r["p999_us"] / 1000 for r in rows]),
        "mean_ms": stat([r.get("mean_us") and r["mean_us"] / 1000 for r in rows]),
        "server_cpu_us_per_req": stat(cpu),
        "server_sys_us_per_req": stat(sys_),
        # The share of its core the server kept busy (1.0: CPU-bound).
        "server_busy": busy("cpu_s"),
        # The share of core 1 (load generator and upstream) that was busy: near
        # 1.0, the load generator's core held the server back.
        "core1_busy": busy("core1_s"),
        "rss_mib": stat([r.get("rss_kib") and r["rss_kib"] / 1024 for r in rows]),
        "non_2xx": sum(r.get("non_2xx", 0) for r in rows),
        "errors": sum(r.get("errors", 0) for r in rows),
        "requests": sum(r["requests"] for r in rows),
        "offered_rps": rows[0].get("offered_rps"),
    }


def paired(raw, a, b):
    """The ratio a/b of req/s within each round that ran both (run.sh interleaves
    the runs), as a stat over the rounds; a and b are (scenario, target)."""
    rounds = {}
    for r in raw:
        k = (r["scenario"], r["target"])
        if k in (a, b) and r.get("duration_us"):
            rounds.setdefault(r["run"], {})[k] = r["requests"] / r["duration_us"] * 1e6
    return stat([v[a] / v[b] for v in rounds.values() if a in v and b in v and v[b]])


PAIRS = [("saturation", "gateway", "nginx"), ("saturation", "gateway", "haproxy"), ("saturation", "gateway", "envoy"),
         ("saturation", "gateway", "direct"), ("saturation", "nginx", "direct"), ("saturation", "haproxy", "direct"),
         ("saturation", "envoy", "direct"), ("saturation", "relay", "direct"), ("saturation", "gateway", "relay"),
         ("saturation", "gateway_redis", "gateway"), ("saturation", "gateway_redis_credits", "gateway")]
PAIRS += [(s, "gateway", peer) for s in TLS_SCENARIOS for peer in ("nginx", "haproxy")]
PAIRS += [("tls_new_conn", "gateway_classical", peer) for peer in ("nginx", "haproxy")]


def pair_name(scenario, a, b):
    return f"{a} / {b}" if scenario == "saturation" else f"{scenario}: {a} / {b}"


def med(s, key):
    v = s and s.get(key)
    return v["median"] if v else None


def ratio(a, b):
    return round(a / b, 3) if a and b else None


def fmt(s, digits=2):
    if not s:
        return "–"
    m, lo, hi = s["median"], s["min"], s["max"]
    if s["runs"] == 1:
        return f"{m:,.{digits}f}"
    return f"{m:,.{digits}f} ({lo:,.{digits}f}–{hi:,.{digits}f})"


def busy_share(s):
    """A busy share as a percentage, with its range over the runs."""
    if not s:
        return "–"
    if s["runs"] == 1:
        return f"{s['median'] * 100:.0f}%"
    return f"{s['median'] * 100:.0f}% ({s['min'] * 100:.0f}–{s['max'] * 100:.0f}%)"


def build(raw, meta, resources, note):
    groups = {}
    for r in raw:
        if r["scenario"] not in ("own_time", "pg_store"):
            groups.setdefault((r["scenario"], r["target"]), []).append(r)
    own = [r for r in raw if r["scenario"] == "own_time"]
    pg = [r for r in raw if r["scenario"] == "pg_store"]
    summary = {k: summarize(v) for k, v in groups.items()}
    direct = med(summary.get(("saturation", "direct")), "rps")
    nginx = med(summary.get(("saturation", "nginx")), "rps")
    haproxy = med(summary.get(("saturation", "haproxy")), "rps")
    scenarios = []
    for scenario, target, label in SCENARIOS:
        s = summary.get((scenario, target))
        if not s:
            continue
        rps = med(s, "rps")
        # Ratios to the peers in the same scenario (over TLS, nginx's and HAProxy's TLS
        # runs); to direct only over plain HTTP/1.1.
        peer = {t: med(summary.get((scenario, t)), "rps") for t in ("nginx", "haproxy")}
        resumed = [r for r in groups[(scenario, target)] if "resumed" in r]
        scenarios.append({
            "scenario": scenario, "target": target, "label": label, **s,
            "ratio_to_direct": ratio(rps, direct) if scenario == "saturation" else None,
            "ratio_to_nginx": ratio(rps, peer["nginx"]) if target != "nginx" else None,
            "ratio_to_haproxy": ratio(rps, peer["haproxy"]) if target != "haproxy" else None,
            "resumed_share": resumed and round(sum(r["resumed"] for r in resumed)
                                               / max(1, sum(r["requests"] for r in resumed)), 3) or None,
        })
    fixed = []
    for scenario in FIXED:
        base = summary.get((scenario, "direct"))
        for target in ["direct", "gateway", "gateway_redis", "nginx", "haproxy", "relay"]:
            s = summary.get((scenario, target))
            if not s:
                continue
            added = None
            if base and target != "direct" and med(s, "p99_ms") is not None and med(base, "p99_ms") is not None:
                added = round(med(s, "p99_ms") - med(base, "p99_ms"), 3)
            fixed.append({"scenario": scenario, "target": target, **s, "p99_added_ms": added})
    own_time = None
    if own:
        client = summary.get(("own_time_half", "gateway"))
        own_time = {
            "offered_rps": client and client["offered_rps"],
            "requests": sum(r["requests"] for r in own),
            "within_1ms": stat([r["within_1ms"] for r in own]),
            "own_p99_ms": stat([r["own_p99_us"] / 1000 for r in own]),
            "client_p99_ms": client and client["p99_ms"],
        }
    gw = summary.get(("saturation", "gateway"))
    res = dict(resources)
    res["rss_under_load_mib"] = gw and gw["rss_mib"]
    cpu = med(gw, "server_cpu_us_per_req")
    res["cpu_s_per_100k_requests"] = cpu and round(cpu * 1e5 / 1e6, 3)
    gw_rps = med(gw, "rps")
    pairs = [{"pair": pair_name(sc, a, b), **(paired(raw, (sc, a), (sc, b)) or {})} for sc, a, b in PAIRS]
    # The cold key store against the warm one, each run's cold pass against its warm one.
    pairs.append({"pair": pair_name("pg", "cold", "warm"), **(paired(raw, ("pg_cold", "gateway_pg"), ("pg_warm", "gateway_pg")) or {})})
    pairs = [p for p in pairs if "median" in p]

    def pair_or_ratio(a, b, fallback=None, scenario="saturation"):
        # The paired median when rounds were interleaved, else the ratio of medians.
        p = next((p for p in pairs if p["pair"] == pair_name(scenario, a, b)), None)
        return round(p["median"], 3) if p else fallback

    def p999(scenario):
        return med(summary.get((scenario, "gateway")), "p999_ms")

    store = None
    if pg:
        store = {
            "runs": len(pg),
            "queries_per_key": stat([r["queries_per_key"] for r in pg]),
            "store_queries": sum(r["store_queries"] for r in pg),
            "idle_queries_taken_off": round(sum(r["idle_queries_taken_off"] for r in pg), 1),
            "cache_misses": sum(r["cache_misses"] for r in pg),
            "cold_requests": sum(r["cold_requests"] for r in pg),
            "cold_wrapped": any(r["cold_wrapped"] for r in pg),
            "rss_bytes_per_cached_key": stat([r["rss_bytes_per_cached_key"] for r in pg]),
            "cache_entries_added": stat([r["cache_entries_added"] for r in pg]),
        }

    def at(scenario, target="gateway"):
        return next((f for f in fixed if f["scenario"] == scenario and f["target"] == target), None)

    half, paced = at("fixed_half"), at("paced_half")

    def redis_added(scenario):
        # What the Redis limiter adds to the p99 of the gateway with the local one, at the same load.
        r, l = at(scenario, "gateway_redis"), at(scenario)
        if r and l and med(r, "p99_ms") is not None and med(l, "p99_ms") is not None:
            return round(med(r, "p99_ms") - med(l, "p99_ms"), 3)
        return None
    # The tail of steady keep-alive traffic: requests begun once every connection
    # is open (the handshakes at the start of a TLS run are the new-connection
    # scenarios' subject), TLS and plain measured alike and in the same rounds.
    tls_p999_ratio = ratio(p999("tail_tls"), p999("tail_plain"))
    # Bare round trips from the gateway's core to Redis (PING, one at a time, before the
    # rounds): a request whose limit is decided in Redis waits for at least one.
    redis_rtt = meta.get("redis_round_trip") or {}
    # What the bare TCP relay (no HTTP, no auth) added at the same loads: what the
    # layout and the host add for any proxy, before any HTTP work.
    relay_floor = {tool: f["p99_added_ms"] for tool, f in
                   (("oha", at("fixed_half", "relay")), ("paced", at("paced_half", "relay")))
                   if f and f["p99_added_ms"] is not None}
    # (name, comparison, bound, measured value): the goal shown and the check made are one.
    # The goals of the plain HTTP/1.1 path, then those of the other paths (HTTP/2,
    # the Redis limiter, TLS, the cold key store); "info" rows have no bound.
    goals = [
        ("gateway / nginx req/s", ">=", 1.2, pair_or_ratio("gateway", "nginx", ratio(gw_rps, nginx))),
        ("gateway / HAProxy req/s", ">=", 1.2, pair_or_ratio("gateway", "haproxy", ratio(gw_rps, haproxy))),
        ("gateway / direct req/s", ">=", 0.75, pair_or_ratio("gateway", "direct", ratio(gw_rps, direct))),
        ("p99 added at half of peak, oha (ms)", "<", 1, half and half["p99_added_ms"]),
        ("p99 added at half of peak, paced arrivals (h2load) (ms)", "<", 1, paced and paced["p99_added_ms"]),
        ("RSS holding 10 000 idle connections (MiB)", "<", 64,
         resources.get("rss_10k_idle_conns_kib") and round(resources["rss_10k_idle_conns_kib"] / 1024, 1)),
        ("HTTP/2 over TLS: gateway / HAProxy req/s", ">=", 1.2, pair_or_ratio("gateway", "haproxy", scenario="http2")),
        ("HTTP/2 over TLS: gateway / nginx req/s", ">=", 1.2, pair_or_ratio("gateway", "nginx", scenario="http2")),
        ("Redis limiter / local limiter req/s", ">=", 0.8, pair_or_ratio("gateway_redis", "gateway")),
        ("a key with credits, Redis limiter / a plain key, local limiter req/s", ">=", 0.8,
         pair_or_ratio("gateway_redis_credits", "gateway")),
        ("p99 added by Redis at half of peak, oha (ms)", "<", 0.3, redis_added("fixed_half")),
        ("p99 added by Redis at half of peak, paced arrivals (h2load) (ms)", "<", 0.3, redis_added("paced_half")),
        ("a bare round trip from core 0 to Redis, servers idle: p99 (ms)", "info", None, redis_rtt.get("p99_ms")),
        ("new TLS connection per request, hybrid group: gateway / nginx", ">=", 2,
         pair_or_ratio("gateway", "nginx", scenario="tls_new_conn")),
        ("new TLS connection per request, hybrid group: gateway / HAProxy", ">=", 2,
         pair_or_ratio("gateway", "haproxy", scenario="tls_new_conn")),
        ("new TLS connection per request, X25519 only: gateway / nginx", "info", None,
         pair_or_ratio("gateway_classical", "nginx", scenario="tls_new_conn")),
        ("new TLS connection per request, X25519 only: gateway / HAProxy", "info", None,
         pair_or_ratio("gateway_classical", "haproxy", scenario="tls_new_conn")),
        ("resumed TLS session per request: gateway / nginx", "info", None,
         pair_or_ratio("gateway", "nginx", scenario="tls_resume")),
        ("resumed TLS session per request: gateway / HAProxy", "info", None,
         pair_or_ratio("gateway", "haproxy", scenario="tls_resume")),
        ("TLS keep-alive: gateway / nginx req/s", "info", None,
         pair_or_ratio("gateway", "nginx", scenario="tls_keepalive")),
        ("TLS keep-alive: gateway / HAProxy req/s", "info", None,
         pair_or_ratio("gateway", "haproxy", scenario="tls_keepalive")),
        ("TLS keep-alive p99.9 / plain HTTP p99.9 (gateway, saturation, connections open)", "<=", 2, tls_p999_ratio),
        ("TLS keep-alive p99.9 / plain HTTP p99.9 (gateway, saturation, wrk: handshakes included)", "info", None,
         ratio(p999("tls_keepalive"), p999("saturation"))),
        ("PostgreSQL store: cold / warm req/s (100 000 keys)", ">=", 0.5,
         pair_or_ratio("cold", "warm", scenario="pg")),
        ("PostgreSQL store: store queries per key first seen", "<=", 1, med(store, "queries_per_key")),
        ("RSS per cached key (bytes; the key's own strings included)", "info", None,
         med(store, "rss_bytes_per_cached_key")),
    ]
    if meta.get("mode") == "quick" and "suite_s" in meta:
        goals.append(("--quick: the whole suite, builds excluded (s)", "<", 600, meta["suite_s"]))
    compare = {">=": lambda v, b: v >= b, "<": lambda v, b: v < b, "<=": lambda v, b: v <= b,
               "info": lambda v, b: None}
    targets = [
        {"name": name, "goal": "–" if op == "info" else f"{op} {bound}", "value": value,
         "met": None if value is None or op == "info" else bool(compare[op](value, bound))}
        for name, op, bound, value in goals
    ]
    # Where the throughput ratios come from: at saturation a proxy that keeps
    # core 0 busy serves about 1 / (its CPU per request).
    budget = None
    if gw and med(gw, "server_cpu_us_per_req"):
        def sat(target, key="server_cpu_us_per_req"):
            return med(summary.get(("saturation", target)), key)
        budget = {
            "gateway_cpu_us": sat("gateway"),
            "gateway_kernel_us": sat("gateway", "server_sys_us_per_req"),
            "relay_kernel_us": sat("relay", "server_sys_us_per_req"),
            "busy": {t: sat(t, "server_busy") for t in ("gateway", "nginx", "haproxy", "relay")
                     if sat(t, "server_busy") is not None},
            "core1_busy": {t: sat(t, "core1_busy") for t in ("direct", "gateway", "nginx", "haproxy", "relay")
                           if sat(t, "core1_busy") is not None},
            "cpu_ratio_to_gateway": {t: ratio(sat(t), sat("gateway")) for t in ("nginx", "haproxy") if sat(t)},
        }
    shares = [(others_on_core0(r), r) for r in raw]
    shares = [(v, r) for v, r in shares if v is not None]
    core0 = shares and {
        **stat([v for v, _ in shares]),
        "limit_pct": OTHERS_ON_CORE0_PCT,
        "runs_over_limit": [{"scenario": r["scenario"], "target": r["target"], "run": r["run"], "pct": round(v, 1)}
                            for v, r in shares if v > OTHERS_ON_CORE0_PCT],
    }
    return {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "note": note,
        "meta": meta,
        "scenarios": scenarios,
        "fixed_load": fixed,
        "own_time_half": own_time,
        "pg_store": store,
        "resources": res,
        "paired_ratios": pairs,
        "targets": targets,
        "relay_p99_added_half_ms": relay_floor or None,
        "core0_others_pct": core0 or None,
        "cpu_budget": budget,
    }


def host_kernel(m):
    """", kernel K (TCP congestion control C)": the loopback's cost per request moves with both."""
    if "kernel" not in m:
        return ""
    cc = m.get("tcp_congestion_control")
    return f", kernel {m['kernel']}" + (f" (TCP congestion control {cc})" if cc else "")


def core0_held(m):
    """How core 0 was kept for the server under test (run.sh, core0.py)."""
    if "core0_held" not in m:  # a report from before run.sh held core 0
        return ""
    h = m["core0_held"]
    if not h:
        return "; the machine's other tasks shared it (--share-core0)"
    return (f"; the machine's other tasks held to core 1 for the rounds: {h['moved_threads']} threads of "
            f"{h['moved_processes']} processes, {h['left_on_core0']} per-CPU kernel threads stay"
            + (f", {h['not_permitted']} not permitted" if h["not_permitted"] else ""))


def markdown(rep):
    m = rep["meta"]
    out = []
    if rep["note"]:
        out.append(f"> **{rep['note']}**\n")
    out.append(
        f"{m['mode']} mode: {m['runs']} run(s) x {m['duration_s']} s per figure, {m['connections']} connections; "
        f"{m['cpu']}, {m['cores']} cores{host_kernel(m)}; load average before: {' '.join(m['load_before'])}. "
        f"The gateway: {m.get('gateway_build', 'release')} build. "
        f"Server under test alone on core 0 (one worker/thread{core0_held(m)}), load generator and upstream on core 1. "
        "Figures: median (min–max) of the runs.\n"
    )
    c = rep.get("core0_others_pct")
    if c:
        over = c["runs_over_limit"]
        out.append(
            f"Core 0 beside the server under test (its busy time in /proc/stat less the server's own CPU: "
            f"interrupts and kernel work charged to no process, plus anything else that ran there): "
            f"median {c['median']:.1f}%, at most {c['max']:.1f}% of the core over {c['runs']} runs; "
            + (f"**{len(over)} run(s) over {c['limit_pct']}%**, which measured the server sharing its core: "
               + ", ".join(f"{o['scenario']}/{o['target']} run {o['run']} ({o['pct']}%)" for o in over)
               if over else f"none over {c['limit_pct']}%.") + "\n"
        )
    gaps = m.get("core_gaps")
    if gaps:
        out.append(
            "The cores themselves, before the runs (a busy loop on each, both at once, counting the gaps over 1 ms "
            "between its clock reads: another task of the machine, or the host taking the vCPU): "
            + "; ".join(f"core {g['core']} lost {g['lost_pct']}% of {g['seconds']:g} s in {g['gaps_over_1ms']} gaps, "
                        f"the longest {g['longest_ms']} ms" for g in gaps)
            + ". A request that arrives during a stall waits it out: stalls that take about 1% of a core's "
            "time show in the p99 of what runs there.\n"
        )
    out.append("Ratios: × direct over plain HTTP/1.1 only; × nginx and × HAProxy to the peer in the same scenario "
               "(over TLS, its TLS runs), ratios of the medians (the paired ones are below). For a new or resumed "
               "TLS connection per request, req/s is connections per second.\n")
    out.append("| scenario | req/s | p50 ms | p99 ms | p99.9 ms | server CPU µs/req | of it in the kernel | × direct | × nginx | × HAProxy | non-2xx |")
    out.append("| - | -: | -: | -: | -: | -: | -: | -: | -: | -: | -: |")
    for s in rep["scenarios"]:
        p50 = fmt(s["p50_ms"]) if s["p50_ms"] else (f"mean {fmt(s['mean_ms'])}" if s["mean_ms"] else "–")
        out.append(
            f"| {s['label']} | {fmt(s['rps'], 0)} | {p50} | {fmt(s['p99_ms'])} | {fmt(s['p999_ms'])} "
            f"| {fmt(s['server_cpu_us_per_req'], 1)} | {fmt(s['server_sys_us_per_req'], 1)} | {s['ratio_to_direct'] or '–'} | {s['ratio_to_nginx'] or '–'} "
            f"| {s['ratio_to_haproxy'] or '–'} | {s['non_2xx']:,} |"
        )
    resumed = [(s["target"], s["resumed_share"]) for s in rep["scenarios"] if s["scenario"] == "tls_resume"]
    if resumed:
        out.append("\nNew and resumed TLS connections: `benches/tls_connect.rs`, a TLS 1.3 client that checks "
                   "no certificate or signature (so that its core is not the limit), one request with "
                   "`Connection: close` per connection, each of its loops resuming its previous connection's "
                   "session in the resumed scenario. Share of the connections that resumed: "
                   + ", ".join(f"{t} {v * 100:.1f}%" if v is not None else f"{t} –" for t, v in resumed) + ".")
    st = rep.get("pg_store")
    if st:
        out.append(
            f"\nThe cold key store (PostgreSQL, 100 000 keys; {st['runs']} run(s), each on a fresh gateway): "
            f"{st['cold_requests']:,} requests with keys first seen ({st['cache_misses']:,} key-cache misses, "
            f"those in flight at the end included) took {st['store_queries']:,} store queries: "
            f"{fmt(st['queries_per_key'], 3)} per key (the count of `mpg_store_query_duration_seconds` over the "
            f"run, less {st['idle_queries_taken_off']:g} the gateway makes idle at that rate, such as the change "
            "log's reads); once all were cached, "
            f"the RSS grew by {fmt(st['rss_bytes_per_cached_key'], 0)} bytes per cached key (the key's own strings, "
            "its limiter state and the allocator's overhead included)."
            + (" **The cold runs came round to keys already seen: lengthen the key list or shorten --duration.**"
               if st["cold_wrapped"] else ""))
    if rep.get("paired_ratios"):
        others = " and ".join(name for target, name in [("relay", "the bare TCP relay"), ("envoy", "Envoy")]
                              if any(s["target"] == target for s in rep["scenarios"]))
        out.append("\nreq/s compared within each round (direct, gateway, nginx and HAProxy run one after "
                   f"another in every round{', and ' + others + ' with them' if others else ''}; over TLS the "
                   "gateway, nginx and HAProxy; on PostgreSQL each run's cold pass against its warm one), "
                   "median (min–max) over the rounds; the targets below use these:\n")
        out.append("| pair | ratio of req/s |")
        out.append("| - | -: |")
        for p in rep["paired_ratios"]:
            out.append(f"| {p['pair']} | {fmt(p, 3)} |")
    if rep["fixed_load"]:
        out.append("\nAt fixed offered loads, a quarter and half of the gateway's peak: oha `-q` (its requests "
                   "leave in bursts on its 1 ms timer ticks), and h2load `--rps` for paced arrivals (each "
                   "connection on its own timer); relay is the bare TCP relay, a proxy's floor. Core 1 runs the "
                   "load generator, the upstream and Redis: where it nears 100%, the client's own lateness is in "
                   "its p99:\n")
        out.append("| load | target | offered req/s | achieved req/s | p50 ms | p99 ms | p99.9 ms | p99 added vs direct ms | server CPU µs/req | core 1 busy |")
        out.append("| - | - | -: | -: | -: | -: | -: | -: | -: | -: |")
        for f in rep["fixed_load"]:
            out.append(
                f"| {FIXED_LABELS[f['scenario']]} | {f['target']} | {f['offered_rps']:,} | {fmt(f['rps'], 0)} "
                f"| {fmt(f['p50_ms'], 3)} | {fmt(f['p99_ms'], 3)} | {fmt(f['p999_ms'], 3)} "
                f"| {f['p99_added_ms'] if f['p99_added_ms'] is not None else '–'} | {fmt(f['server_cpu_us_per_req'], 1)} "
                f"| {busy_share(f['core1_busy'])} |"
            )
    o = rep.get("own_time_half")
    if o:
        out.append(f"\nThe gateway's own time at half of peak ({o['offered_rps']:,} req/s offered, {o['requests']:,} requests; "
                   "its `mpg_request_duration_seconds` histogram, admin listener on: from the request head read to the "
                   "response head ready, the upstream's answer included), beside what the client saw in the same runs:\n")
        out.append("| share within 1 ms | p99 ms (read off the buckets) | client's p99 ms, same runs |")
        out.append("| -: | -: | -: |")
        share = o["within_1ms"]
        out.append(f"| {share['median'] * 100:.2f}% ({share['min'] * 100:.2f}–{share['max'] * 100:.2f}%) "
                   f"| {fmt(o['own_p99_ms'], 3)} | {fmt(o['client_p99_ms'], 3)} |")
    r = rep["resources"]
    out.append("\n| resource (gateway) | value |")
    out.append("| - | -: |")
    out.append(f"| RSS idle (fresh, after one request) | {r['rss_idle_kib'] / 1024:.1f} MiB |")
    out.append(f"| RSS under load (mid-run) | {fmt(r['rss_under_load_mib'], 1)} MiB |")
    out.append(f"| RSS holding {r['idle_conns_held']:,} idle keep-alive connections | {r['rss_10k_idle_conns_kib'] / 1024:.1f} MiB |")
    if r.get("rss_after_100k_keys_kib"):
        out.append(f"| RSS after the runs above (100 000 keys cached and tracked) | {r['rss_after_100k_keys_kib'] / 1024:.1f} MiB |")
    if r.get("idle_conns_held"):
        per = (r["rss_10k_idle_conns_kib"] - r["rss_idle_kib"]) / r["idle_conns_held"]
        out.append(f"| RSS per idle keep-alive connection | {per:.1f} KiB |")
    out.append(f"| CPU seconds per 100 000 requests (plain HTTP, saturated) | {r['cpu_s_per_100k_requests']} |")
    out.append("\n| target | goal | measured | met |")
    out.append("| - | - | -: | - |")
    for t in rep["targets"]:
        met = {True: "yes", False: "**no**", None: "–"}[t["met"]]
        out.append(f"| {t['name']} | {t['goal']} | {t['value'] if t['value'] is not None else '–'} | {met} |")
    floor = rep.get("relay_p99_added_half_ms")
    if floor:
        said = {"oha": "with oha", "paced": "with paced arrivals (h2load)"}
        out.append("\nAt the same half of peak, the bare TCP relay (no HTTP, no key check: a proxy that only "
                   "moves the bytes) added "
                   + " and ".join(f"{v} ms {said[k]}" for k, v in floor.items())
                   + " to direct's p99: what this layout and this host add for any proxy, before any HTTP work.")
    rtt = rep["meta"].get("redis_round_trip")
    if rtt:
        out.append(f"\nA bare round trip from core 0 to the suite's Redis (PING, one at a time, every server idle; "
                   f"`redis-benchmark -c 1`) took {rtt['p50_ms']} ms at the median and {rtt['p99_ms']} ms at p99 "
                   f"(at most {rtt['max_ms']} ms): a request whose limit is decided in Redis waits for at least "
                   "one such round trip.")
    b = rep.get("cpu_budget")
    if b and b["cpu_ratio_to_gateway"]:
        names = {"direct": "direct", "gateway": "gateway", "nginx": "nginx", "haproxy": "HAProxy",
                 "relay": "the bare relay"}
        proxies = {t: v for t, v in b["busy"].items() if t != "relay"}
        busy = ", ".join(f"{names[t]} {v * 100:.0f}%" for t, v in b["busy"].items())
        ratios = ", ".join(f"{names[t]} {v}" for t, v in b["cpu_ratio_to_gateway"].items())
        relay = f"; the bare relay's kernel time for the same socket work: {b['relay_kernel_us']:.1f} µs" \
            if b["relay_kernel_us"] else ""
        # CPU-bound: each proxy kept core 0 busy, and core 1 (where measured) had room to spare.
        core1_full = any(v >= 0.95 for t, v in b.get("core1_busy", {}).items() if t in proxies)
        bound = all(v >= 0.9 for v in proxies.values()) and not core1_full
        out.append(
            f"\nAt saturation, the share of the time each proxy kept core 0 busy: {busy}; "
            + ("so their req/s there is set by their CPU per request. " if bound else
               "so at least one was held back by something other than its own CPU (the core 0 line above, "
               "or the load generator's core). ")
            + f"CPU per request, as a ratio to the gateway's (medians of the runs; the targets use the paired "
            f"req/s above): {ratios}. The gateway took {b['gateway_cpu_us']:.1f} µs per request, "
            f"{b['gateway_kernel_us']:.1f} of them in the kernel{relay}."
        )
        if b.get("core1_busy"):
            core1 = ", ".join(f"{names[t]} {v * 100:.0f}%" for t, v in b["core1_busy"].items())
            out.append(
                f"\nCore 1 (the load generator and the upstream) at saturation was busy: {core1}. Where it is "
                "near 100% beside a proxy that left core 0 idle, the load generator's core held that proxy back."
            )
    return "\n".join(out) + "\n"


def chart(rep, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report.py: matplotlib missing, no chart")
        return False
    rows = [s for s in rep["scenarios"] if s["rps"]]
    labels = [s["label"].replace(", ", "\n", 1) for s in rows]
    colors = {"direct": "#888888", "gateway": "#2b6cb0", "nginx": "#2f855a", "haproxy": "#c05621",
              "relay": "#bbbbbb", "envoy": "#6b46c1", "gateway_redis": "#4a90d9", "gateway_pg": "#1a365d",
              "gateway_redis_credits": "#90cdf4",
              "gateway_classical": "#63b3ed"}
    fig, (a, b) = plt.subplots(1, 2, figsize=(15, 11))
    y = range(len(rows))
    a.barh(y, [s["rps"]["median"] for s in rows], color=[colors[s["target"]] for s in rows],
           xerr=[[s["rps"]["median"] - s["rps"]["min"] for s in rows], [s["rps"]["max"] - s["rps"]["median"] for s in rows]])
    a.set_yticks(list(y), labels, fontsize=8)
    a.invert_yaxis()
    # New and resumed TLS connections per second sit two orders below keep-alive req/s.
    a.set_xscale("log")
    a.set_xlabel("requests (or TLS connections) per second, log scale (median, min–max)")
    a.set_title("Throughput")
    p99 = [med(s, "p99_ms") or 0 for s in rows]
    b.barh(y, p99, color=[colors[s["target"]] for s in rows])
    b.set_yticks(list(y), [""] * len(rows))
    b.invert_yaxis()
    b.set_xlabel("p99 latency, ms, at saturation (HTTP/2 and resumption: none reported)")
    b.set_title("p99 latency")
    title = "mpg-gateway load suite"
    if rep["note"]:
        title += f" — {rep['note']}"
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--raw", required=True)
    ap.add_argument("--meta", required=True)
    ap.add_argument("--resources", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--note", default="")
    a = ap.parse_args()
    raw = [json.loads(line) for line in open(a.raw) if line.strip()]
    rep = build(raw, json.load(open(a.meta)), json.load(open(a.resources)), a.note)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(rep, indent=2) + "\n")
    (out / "report.md").write_text(markdown(rep))
    chart(rep, out / "chart.png")
    print(markdown(rep))


if __name__ == "__main__":
    main()
