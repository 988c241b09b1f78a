"""The quick mode's results: one row per test in the terminal's table or in llama-bench's outputs (`-o md`, `csv`,
`json`, `jsonl`), whose records keep llama-bench's field names so that scripts reading its output read rooftop's."""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import TextIO

from rich.table import Table

from rooftop.bench.quick import BenchTest
from rooftop.roofline.report import seconds

OUTPUTS = ("md", "csv", "json", "jsonl", "sql")
COLUMNS = ("model", "size", "params", "backend", "threads", "weights", "KV cache", "test", "t/s", "TPOT")
UBATCH = "n_ubatch"  # a column before the test's where -ub was given, as llama-bench adds one
RIGHT = {"size", "params", "threads", UBATCH, "test", "t/s", "TPOT"}  # llama-bench's numbers, right-aligned
SAMPLES = ("samples_ns", "samples_ts")  # in llama-bench's json and jsonl, not in its csv


def model_name(machine: dict) -> str:
    """The model, and what changes what its numbers mean: dummy weights, speculative decoding (a tgN then decodes
    in fewer steps than N)."""
    name = machine["model"] + (" (dummy weights)" if machine["load_format"] == "dummy" else "")
    if spec := machine.get("speculative_config"):  # results saved before the field: none
        drafter = {"model": lambda m: Path(m).name, "draft_layers": lambda n: f"{n} layers"}
        by = "".join(f" {show(spec[key])}" for key, show in drafter.items() if key in spec)
        name += f" (speculative: {spec['method']}{by} x{spec['num_speculative_tokens']})"
    return name


def size_text(nbytes: float) -> str:
    """llama-bench's size: MiB below a GiB, else GiB."""
    return f"{nbytes / 2**20:.2f} MiB" if nbytes < 2**30 else f"{nbytes / 2**30:.2f} GiB"


def params_text(count: int) -> str:
    """llama-bench's params: millions below a billion, else billions."""
    return f"{count / 1e6:.2f} M" if count < 1e9 else f"{count / 1e9:.2f} B"


Runs = list[tuple[dict, list[BenchTest]]]  # per thread count (-t): the machine it ran on, its tests


def columns(runs: Runs) -> tuple[str, ...]:
    """COLUMNS, with n_ubatch before the test where a test ran with -ub."""
    if not any(t.n_ubatch for _, tests in runs for t in tests):
        return COLUMNS
    at = COLUMNS.index("test")
    return (*COLUMNS[:at], UBATCH, *COLUMNS[at:])


def rows(runs: Runs) -> list[list[str]]:
    """The table's cells (`columns`): each test's t/s ± the spread of its repetitions' rates, and a decode test's
    TPOT, 1 / its t/s; a run's tests after the run before (llama-bench's order for its -t lists)."""
    ubatch = UBATCH in columns(runs)
    cells = []
    for machine, tests in runs:
        model = [
            model_name(machine),
            size_text(machine["weight_bytes"]),
            params_text(machine["parameters"]),
            machine["backend"],
            threads_text(machine),
            machine["weights_format"],
            machine["kv_cache_dtype"],
        ]
        for t in tests:
            rate = f"{t.tokens_per_s:.2f} ± {t.tokens_per_s_stdev:.2f}"
            chunk = [str(t.chunk or "")] if ubatch else []
            cells.append([*model, *chunk, t.name, rate, "" if t.tpot_s is None else seconds(t.tpot_s)])
    return cells


def threads_text(machine: dict) -> str:
    """The threads column: a tensor-parallel run's threads per rank and its ranks ("1 x3")."""
    ranks = machine.get("tensor_parallel_size", 1)
    return str(machine["threads"]) + (f" x{ranks}" if ranks > 1 else "")


def table(runs: Runs) -> Table:
    out = Table()
    for name in columns(runs):
        out.add_column(name, justify="right" if name in RIGHT else "left")
    for row in rows(runs):
        out.add_row(*row)
    return out


def markdown(runs: Runs) -> str:
    """llama-bench's markdown table: padded cells, numbers right-aligned (`---:`)."""
    cells, names = rows(runs), columns(runs)
    widths = [max(len(name), *(len(row[i]) for row in cells)) for i, name in enumerate(names)]

    def line(values) -> str:
        return (
            "| "
            + " | ".join(
                v.rjust(w) if name in RIGHT else v.ljust(w) for name, v, w in zip(names, values, widths, strict=True)
            )
            + " |"
        )

    rule = (
        "| "
        + " | ".join("-" * (w - 1) + ":" if n in RIGHT else "-" * w for n, w in zip(names, widths, strict=True))
        + " |"
    )
    return "\n".join([line(names), rule, *(line(row) for row in cells)]) + "\n"


def records(runs: Runs) -> list[dict]:
    """One record per test under llama-bench's field names, with rooftop's values (avg_ts: the table's t/s, the
    tokens over avg_ns; n_ubatch: a prompt's tokens per step; type_k and type_v: the KV cache's dtype as rooftop
    names it; test_time: when the run started), then rooftop's own fields."""
    return [
        {
            "cpu_info": machine["cpu"],
            "gpu_info": machine["gpu"] or "",
            "backends": machine["backend"],
            "model_filename": machine["model_path"],
            "model_type": model_name(machine),
            "model_size": round(machine["weight_bytes"]),
            "model_n_params": machine["parameters"],
            "n_threads": machine["threads"],
            "tensor_parallel_size": machine.get("tensor_parallel_size", 1),  # rooftop's; results saved before it: 1
            "type_k": machine["kv_cache_dtype"],
            "type_v": machine["kv_cache_dtype"],
            "n_prompt": t.n_prompt,
            "n_gen": t.n_gen,
            "n_depth": t.n_depth,
            "n_ubatch": t.chunk,
            "test_time": machine["date"],
            "avg_ns": round(t.mean_s * 1e9),
            "stddev_ns": round(statistics.stdev(t.samples_s) * 1e9) if len(t.samples_s) > 1 else 0,
            "avg_ts": t.tokens_per_s,
            "stddev_ts": t.tokens_per_s_stdev,
            "samples_ns": [round(s * 1e9) for s in t.samples_s],
            "samples_ts": t.samples_tokens_per_s,
            "rooftop": machine["rooftop"],
            "weights_format": machine["weights_format"],
            "load_format": machine["load_format"],
            "dtype": machine["dtype"],
            "device": machine["device"],
        }
        for machine, tests in runs
        for t in tests
    ]


def write_output(fmt: str, runs: Runs, out: TextIO) -> None:
    """The results as llama-bench's `-o` prints them: md, csv (every field quoted), json (an array), jsonl or sql (a
    table `test` and one INSERT per test, for sqlite3)."""
    if fmt == "md":
        out.write(markdown(runs))
        return
    found = records(runs)
    if fmt == "json":
        out.write(json.dumps(found, indent=2) + "\n")
    elif fmt == "jsonl":
        out.writelines(json.dumps(r) + "\n" for r in found)
    elif fmt == "sql":
        out.write(sql(found))
    else:
        fields = [k for k in found[0] if k not in SAMPLES]
        writer = csv.DictWriter(out, fields, extrasaction="ignore", quoting=csv.QUOTE_ALL, lineterminator="\n")
        writer.writeheader()
        writer.writerows(found)


def sql(found: list[dict]) -> str:
    """llama-bench's `-o sql`: CREATE TABLE test, its columns typed by their values, then one INSERT per record (the
    samples' lists left out, as in csv)."""
    fields = [k for k in found[0] if k not in SAMPLES]

    def kind(field: str) -> str:
        values = [r[field] for r in found if r[field] is not None]
        if values and all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            return "INTEGER"
        return "REAL" if values and all(isinstance(v, int | float) for v in values) else "TEXT"

    def literal(value) -> str:
        if value is None:
            return "NULL"
        if isinstance(value, int | float) and not isinstance(value, bool):
            return repr(value)
        return "'" + str(value).replace("'", "''") + "'"

    columns = ",\n".join(f"  {field} {kind(field)}" for field in fields)
    inserts = "".join(
        f"INSERT INTO test ({', '.join(fields)}) VALUES ({', '.join(literal(r[f]) for f in fields)});\n" for r in found
    )
    return f"CREATE TABLE IF NOT EXISTS test (\n{columns}\n);\n\n{inserts}"
