"""One self-contained HTML report: the table and the plots embedded as data URIs, no network resources."""

from __future__ import annotations

import base64
import html
from pathlib import Path


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.stem)}" src="data:image/png;base64,{data}">'


def _column(key: str) -> tuple[str, float]:
    """A JSON key as a column's header, and the factor its values are shown at: seconds as ms, as the terminal's
    table shows them (`measured_ttft_s` -> "measured ttft (ms)"), `pct_of_x` as "% of x"."""
    if key.endswith("_s") and not key.endswith("_per_s"):
        return f"{key.removesuffix('_s').replace('_', ' ')} (ms)", 1e3
    if key.startswith("pct_of_"):
        return "% of " + key.removeprefix("pct_of_").replace("_", " "), 1.0
    return key.replace("_per_s", "/s").replace("_", " "), 1.0


def _table(rows: list[dict]) -> str:
    if not rows:
        return ""
    columns = {key: _column(key) for key in rows[0]}
    head = "".join(f"<th>{html.escape(name)}</th>" for name, _ in columns.values())
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{v * columns[k][1]:.4g}</td>" if isinstance(v, float) else f"<td>{html.escape(str(v))}</td>"
            for k, v in r.items()
        )
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def write_html(report: dict, plots: list[Path], path: Path) -> Path:
    machine = report["machine"]
    info = "".join(
        f"<li><b>{html.escape(k)}</b>: {html.escape(str(v))}</li>"
        for k, v in machine.items()
        if v is not None and not isinstance(v, dict)
    )
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>rooftop bench</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; }}
th {{ background: #f3f3f3; }}
img {{ max-width: 100%; margin: 1em 0; }}
</style></head><body>
<h1>rooftop bench</h1>
<ul>{info}</ul>
<h2>TTFT against prompt length</h2>{_table(report["ttft"])}
<h2>Decode against batch size</h2>{_table(report["decode"])}
<h2>Each step's time by part: the bound, then the gap</h2>{_table(report["gaps"])}
<h2>Plots</h2>{"".join(_img(p) for p in plots)}
</body></html>
"""
    path.write_text(page)
    return path
