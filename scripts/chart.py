"""Draws the benchmark results (bench/results/h200.json) as an SVG bar chart: for every
record with a peer figure measured in the same run, gpukit's speed relative to the peer
(higher is better; time metrics are inverted), with both absolute figures as labels.

    python scripts/chart.py [--results bench/results/h200.json] [--out docs/charts/h200.svg]
                            [--only attention_decode,gemv,...]

No dependencies beyond the standard library.
"""
from __future__ import annotations

import argparse
import html
import json
import math
from pathlib import Path

TIME_METRICS = {"us", "ms", "s", "TTFT s"}
ROW_H, LABEL_W, BAR_W, VALUE_W, PAD = 18, 430, 420, 250, 10


def ratio(rec):
    """gpukit's speed over the peer's (> 1: gpukit is faster), or None without a peer figure."""
    g, p = rec.get("gpukit"), rec.get("peer_value")
    if not isinstance(g, (int, float)) or not isinstance(p, (int, float)) or g <= 0 or p <= 0:
        return None
    return p / g if rec.get("metric") in TIME_METRICS else g / p


def fmt(v):
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def rows_of(results, only):
    rows = []
    for r in results:
        if only and r["name"] not in only:
            continue
        q = ratio(r)
        if q is None:
            continue
        label = f'{r["name"]}  {r.get("shape", "")}  {r.get("dtype", "")}'
        value = f'{fmt(r["gpukit"])} vs {fmt(r["peer_value"])} {r.get("metric", "")}'
        rows.append((r["name"], label, q, value, r.get("peer", "")))
    rows.sort(key=lambda t: (t[0], t[1]))
    return rows


def svg(rows, title):
    lo = min(0.1, min(q for _, _, q, _, _ in rows))
    hi = max(10.0, max(q for _, _, q, _, _ in rows))
    span = math.log10(hi) - math.log10(lo)
    x_of = lambda q: LABEL_W + BAR_W * (math.log10(q) - math.log10(lo)) / span  # noqa: E731
    width = LABEL_W + BAR_W + VALUE_W + 2 * PAD
    top = 50
    height = top + ROW_H * len(rows) + 40
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="monospace" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{PAD}" y="20" font-size="14" font-weight="bold">{html.escape(title)}</text>',
           f'<text x="{PAD}" y="38">gpukit speed / peer speed (log scale; green: gpukit faster)</text>']
    for q in (0.1, 0.25, 0.5, 1, 2, 4, 10):
        if lo <= q <= hi:
            x = x_of(q)
            out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 30}" '
                       f'stroke="{"black" if q == 1 else "#ccc"}" stroke-width="{1.5 if q == 1 else 0.5}"/>')
            out.append(f'<text x="{x:.1f}" y="{height - 16}" text-anchor="middle">{q:g}x</text>')
    prev = None
    for i, (name, label, q, value, peer) in enumerate(rows):
        y = top + i * ROW_H
        if prev is not None and name != prev:
            out.append(f'<line x1="{PAD}" y1="{y - 1}" x2="{width - PAD}" y2="{y - 1}" stroke="#eee"/>')
        prev = name
        x0, x1 = x_of(1.0), x_of(q)
        color = "#3a3" if q >= 1 else "#d44"
        out.append(f'<rect x="{min(x0, x1):.1f}" y="{y + 3}" width="{abs(x1 - x0):.1f}" height="{ROW_H - 6}" '
                   f'fill="{color}"><title>{html.escape(peer)}</title></rect>')
        out.append(f'<text x="{LABEL_W - 6}" y="{y + 13}" text-anchor="end">{html.escape(label[:64])}</text>')
        out.append(f'<text x="{LABEL_W + BAR_W + 8}" y="{y + 13}">{q:.2f}x  {html.escape(value)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default="bench/results/h200.json")
    ap.add_argument("--out", default="docs/charts/h200.svg")
    ap.add_argument("--only", default="", help="comma-separated record names")
    a = ap.parse_args(argv)
    data = json.loads(Path(a.results).read_text())
    only = {s for s in a.only.split(",") if s}
    rows = rows_of(data["results"], only)
    if not rows:
        raise SystemExit(f"{a.results}: no records with a peer figure")
    title = f'gpukit vs peer on {data.get("device", "?")} (CUDA {data.get("cuda", "?")}, commit {data.get("commit", "?")})'
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(svg(rows, title))
    print(f"wrote {a.out}: {len(rows)} records")


if __name__ == "__main__":
    main()
