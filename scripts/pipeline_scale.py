"""Catalog-scale benchmark of the pipeline alone: `hpd extract --decoder dry-run` on generated records.

    python scripts/pipeline_scale.py --rows 100000 1000000 10000000 --out benchmarks/pipeline-scale

For each size it writes titles-only records (10 categories) with planted duplicates (the last row
repeats the id of row 0, millions of rows after it when the size is in the millions; two more in
between), runs a fresh `hpd extract` with its own local Ray, and samples the peak memory of the
whole process tree: the sum of proportional set sizes (PSS: shared pages counted once) of the driver
and every process it started. It checks that every row is accounted for and that exactly the later
occurrences were rejected as duplicates, then writes ``scale.json`` and ``scale.md`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
CATEGORIES = {f"Category {i}": ["Brand", "Color", "Size"] for i in range(10)}
SAMPLE_SECONDS = 1.0


def planted_duplicates(rows: int) -> dict[int, int]:
    """later row -> the earlier row whose product id it repeats."""
    if rows < 10:
        return {}
    return {rows - 1: 0, rows // 2: 1, rows - 2: rows // 3}


def product_id(row: int) -> str:
    return f"p{row:010d}"


def write_records(path: Path, rows: int) -> None:
    duplicates = planted_duplicates(rows)
    with open(path, "w") as out:
        for start in range(0, rows, 100_000):
            lines = []
            for row in range(start, min(start + 100_000, rows)):
                first = duplicates.get(row)
                record = {
                    "product_id": product_id(row if first is None else first),
                    "category": f"Category {row % 10}",
                    "title": f"duplicate at row {row}" if first is not None else f"Product {row} red cotton shirt size M",
                }
                lines.append(json.dumps(record))
            out.write("\n".join(lines) + "\n")


def kind(process: psutil.Process, root: psutil.Process, detail: bool = False) -> str:
    """What a process of the tree is, for the memory breakdown: the driver, a Ray actor or task by its
    name (``ray::ExtractStage``; with ``detail``, also the function a Ray Data task runs:
    ``ray::MapBatches(prepare_shards)``), or the executable (``raylet``, ``gcs_server``, ...)."""
    if process.pid == root.pid:
        return "driver"
    name = process.name() if not detail else " ".join(process.cmdline()[:1]) or process.name()
    if name.startswith("ray::"):
        return (name.split(")")[0] + ")" if detail and "(" in name else name.split("(")[0].split(".")[0])[:60]
    return name[:40]


def sample_tree(root: psutil.Process, cpu_seconds: dict[int, float], cpu_by_kind: dict[str, float]) -> list[tuple[int, str, int]]:
    """(PSS, kind, pid) of each process of the tree now. Updates each one's CPU time seen so far, and
    adds the CPU time each used since the last sample to what it is now (a Ray worker changes kind
    from task to task: ``ray::IDLE``, ``ray::MapBatches(write_chunk)``, ...)."""
    processes = []
    for process in [root, *root.children(recursive=True)]:
        try:
            processes.append((process.memory_full_info().pss, kind(process, root), process.pid))
            times = process.cpu_times()
            seen = max(cpu_seconds.get(process.pid, 0.0), times.user + times.system)
            detail = kind(process, root, detail=True)
            cpu_by_kind[detail] = cpu_by_kind.get(detail, 0.0) + seen - cpu_seconds.get(process.pid, 0.0)
            cpu_seconds[process.pid] = seen
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return processes


def smaps_rollup(pid: int) -> dict[str, int]:
    """Pss split by where the pages live (anonymous heap, shared memory such as Ray's object store,
    mapped files), in bytes, from /proc/PID/smaps_rollup; empty where it cannot be read."""
    try:
        text = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return {}
    fields = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("Pss_Anon", "Pss_Shmem", "Pss_File"):
            fields[name] = int(rest.split()[0]) * 1024
    return fields


def trace_line(elapsed: float, processes: list[tuple[int, str, int]], output: Path) -> dict:
    """One line of ``--trace``: the whole tree's PSS split into anonymous memory, shared memory (Ray's
    object store) and mapped files, the same split per kind of process (MiB), and the chunks
    committed so far."""
    split, kinds = {"Pss_Anon": 0, "Pss_Shmem": 0, "Pss_File": 0}, {}
    for pss, key, pid in processes:
        fields = smaps_rollup(pid)
        entry = kinds.setdefault(key, [0, 0, 0])
        entry[0] += pss
        entry[1] += fields.get("Pss_Anon", 0)
        entry[2] += fields.get("Pss_Shmem", 0)
        for name, value in fields.items():
            split[name] += value
    committed = sum(1 for _ in (output / "_commits").rglob("*.json")) if (output / "_commits").exists() else 0
    mib = lambda value: round(value / 2**20)  # noqa: E731
    return {"t": round(elapsed), "chunks_committed": committed,
            "total_mib": mib(sum(pss for pss, _, _ in processes)),
            **{name.lower(): mib(value) for name, value in split.items()},
            "by_kind_pss_anon_shmem": {k: [mib(v) for v in entry] for k, entry in
                                       sorted(kinds.items(), key=lambda kv: -kv[1][0]) if entry[0] >= 20 << 20}}


def growth(trace: list[dict], kinds: tuple[str, ...] = ("ray::MapWorker", "driver", "gcs_server")) -> list[dict]:
    """What each kind of process (``kinds``; ``ray::MapWorker`` is the extract actor pool) grew by
    over the second half of a traced run, split into anonymous memory (its own heap) and shared
    memory (pages of Ray's object store it has mapped, bounded by the store's size), in KiB per
    committed chunk; from the trace lines that have committed chunks."""
    rows = []
    for name in kinds:  # the lines where the kind is alive (the actors exit before the job's last lines)
        lines = [line for line in trace if line["chunks_committed"] and name in line["by_kind_pss_anon_shmem"]]
        if len(lines) < 3:
            continue
        middle, last = lines[len(lines) // 2], lines[-1]
        chunks = last["chunks_committed"] - middle["chunks_committed"]
        start, end = middle["by_kind_pss_anon_shmem"][name], last["by_kind_pss_anon_shmem"][name]
        if chunks <= 0:
            continue
        per_chunk = lambda i: round((end[i] - start[i]) * 1024 / chunks, 1)  # noqa: E731
        rows.append({"kind": name, "pss_mib": [start[0], end[0]], "anon_mib": [start[1], end[1]],
                     "shmem_mib": [start[2], end[2]], "chunks": chunks, "pss_kib_per_chunk": per_chunk(0),
                     "anon_kib_per_chunk": per_chunk(1), "shmem_kib_per_chunk": per_chunk(2)})
    return rows


def by_kind(processes: list[tuple[int, str, int]]) -> dict[str, int]:
    """The summed PSS of each kind of process, largest first."""
    kinds: dict[str, int] = {}
    for pss, key, _ in processes:
        kinds[key] = kinds.get(key, 0) + pss
    return dict(sorted(kinds.items(), key=lambda kv: -kv[1]))


def machine() -> dict:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor())
    return {"cpu": model, "cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
            "python": platform.python_version(), "platform": platform.platform()}


def split_records(source: Path, files: int) -> Path:
    """The records of ``source`` as ``files`` files of consecutive rows (in the same order: the job
    reads files in path order), in a folder beside it."""
    folder = source.with_name(f"{source.stem}-in-{files}")
    if not folder.exists():
        lines = source.read_bytes().splitlines(keepends=True)
        parts = folder.with_name(folder.name + ".tmp")
        subprocess.run(["rm", "-rf", str(parts)], check=True)  # left by an interrupted split
        parts.mkdir()
        step = -(-len(lines) // files)
        for part in range(files):
            (parts / f"part-{part:05d}.jsonl").write_bytes(b"".join(lines[part * step : (part + 1) * step]))
        parts.rename(folder)
    return folder


def run_one(work: Path, rows: int, extra: list[str], trace_seconds: float = 0, trace_dir: Path | None = None,
            files: int = 1) -> dict:  # fmt: skip
    source = work / f"records-{rows}.jsonl"
    if not source.exists():
        write_records(source, rows)
    if files > 1:
        source = split_records(source, files)
    attributes = work / "attributes.json"
    attributes.write_text(json.dumps(CATEGORIES))
    output = work / f"out-{rows}"
    subprocess.run(["rm", "-rf", str(output)], check=True)
    command = [sys.executable, "-m", "jobs.cli", "extract", "--input", str(source), "--attributes", str(attributes),
               "--output", str(output), "--decoder", "dry-run", "--address", "local", *extra]
    log = open(work / f"log-{rows}.txt", "wb")
    started = time.time()
    driver = subprocess.Popen(command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)
    root, peak, samples, cpu_seconds, cpu_by_kind, at_peak = psutil.Process(driver.pid), 0, 0, {}, {}, []
    trace, traced = (open((trace_dir or work) / f"trace-{rows}.jsonl", "w") if trace_seconds else None), -trace_seconds
    traced_lines: list[dict] = []
    while driver.poll() is None:
        processes = sample_tree(root, cpu_seconds, cpu_by_kind)
        total = sum(pss for pss, _, _ in processes)
        if total > peak:
            peak, at_peak = total, processes
        samples += 1
        if trace and time.time() - started - traced >= trace_seconds:
            traced = time.time() - started
            traced_lines.append(trace_line(traced, processes, output))
            trace.write(json.dumps(traced_lines[-1]) + "\n")
            trace.flush()
        time.sleep(SAMPLE_SECONDS)
    wall = time.time() - started
    cpu = sum(cpu_seconds.values())  # up to the last sample of each process
    if driver.returncode != 0:
        raise RuntimeError(f"hpd extract failed ({driver.returncode}); see {log.name}")
    report = json.loads((output / "_report.json").read_text())
    return {"rows": rows, "wall_seconds": round(wall, 1), "job_wall_seconds": report["wall_seconds"],
            "products_out": report["products_out"], "products_per_second": round(report["products_out"] / wall, 1),
            "cpu_seconds": round(cpu, 1), "products_per_cpu_second": round(report["products_out"] / cpu, 1),
            "cpu_seconds_by_process": {k: round(v, 1) for k, v in sorted(cpu_by_kind.items(), key=lambda kv: -kv[1])
                                       if v >= 1},
            "load_average_1min": round(os.getloadavg()[0], 1),
            "peak_pss_mib": round(peak / 2**20), "pss_samples": samples,
            "peak_pss_mib_by_process": {k: round(v / 2**20) for k, v in by_kind(at_peak).items()},
            "largest_processes_at_peak": [{"kind": k, "pid": pid, "pss_mib": round(pss / 2**20)}
                                          for pss, k, pid in sorted(at_peak, reverse=True)[:8]],
            "rejected_by_stage": report["rejected_by_stage"],
            "duplicates_checked": check_duplicates(output, rows, report),
            **({"growth_second_half": growth(traced_lines)} if trace_seconds else {})}


def check_duplicates(output: Path, rows: int, report: dict) -> int:
    """Every row accounted for; exactly the planted later occurrences rejected as duplicates."""
    import pyarrow.parquet as pq

    duplicates = planted_duplicates(rows)
    if report["rows_in"] != rows or report["products_out"] + report["rows_rejected"] != rows:
        raise RuntimeError(f"rows do not add up: {report}")
    rejected = [row for path in sorted((output / "rejected").glob("*.parquet")) for row in pq.read_table(path).to_pylist()]
    titles = sorted(json.loads(row["record"])["title"] for row in rejected)
    expected = sorted(f"duplicate at row {row}" for row in duplicates)
    if titles != expected or any(row["reason"] != "duplicate product_id" for row in rejected):
        raise RuntimeError(f"duplicates: expected {expected} rejected, got {[(r['record'], r['reason']) for r in rejected]}")
    return len(duplicates)


def render(result: dict) -> str:
    lines = [
        "# Pipeline at catalog scale (dry-run decoder)",
        "",
        f"Machine: {result['machine']['cpu']}, {result['machine']['cores']} cores, "
        f"{result['machine']['memory_gib']} GiB; {result['note']}",
        "",
        "| rows | wall (s) | products/s | CPU-seconds (process tree) | products per CPU-second "
        "| peak PSS of the process tree (MiB) | duplicates rejected as planted | load average at the end |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in result["runs"]:
        lines.append(f"| {run['rows']:,} | {run['wall_seconds']} | {run['products_per_second']:,.0f} "
                     f"| {run['cpu_seconds']:,.0f} | {run['products_per_cpu_second']:,.0f} | {run['peak_pss_mib']:,} "
                     f"| {run['duplicates_checked']} | {run['load_average_1min']} |")
    lines += [
        "",
        "Products/s is products out over the wall time of the whole command (Ray start-up included). The",
        "CPU-seconds are those of the driver and every process it started (sampled every second), so",
        "products per CPU-second does not depend on what else ran on the machine; two dedicated cores",
        "give at most twice that per second.",
        "",
        f"Command: `{result['command']}`",
        "",
    ]
    for run in result["runs"]:
        if run.get("growth_second_half"):
            lines += [
                f"Growth over the second half of the {run['rows']:,}-row run (`--trace`; MiB of PSS at its start and "
                "end, KiB per committed chunk; anonymous memory is the process's own heap, shared memory the pages "
                "of Ray's object store it has touched, which the store's size bounds):",
                "",
                "| process | chunks | PSS (MiB) | anonymous (MiB) | shared (MiB) | PSS KiB/chunk | anonymous KiB/chunk "
                "| shared KiB/chunk |",
                "|---|---:|---|---|---|---:|---:|---:|",
            ]
            for g in run["growth_second_half"]:
                span = lambda pair: f"{pair[0]} -> {pair[1]}"  # noqa: E731
                lines.append(f"| {g['kind']} | {g['chunks']} | {span(g['pss_mib'])} | {span(g['anon_mib'])} "
                             f"| {span(g['shmem_mib'])} | {g['pss_kib_per_chunk']} | {g['anon_kib_per_chunk']} "
                             f"| {g['shmem_kib_per_chunk']} |")
            lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--out", type=Path, required=True, help="where scale.json and scale.md go")
    parser.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "hpd-pipeline-scale",
                        help="inputs and outputs (about 1.5 GB at 10M rows; inputs are kept and reused)")
    parser.add_argument("--note", default="", help="a line about the machine or the run, for scale.md")
    parser.add_argument("--trace", type=float, default=0, metavar="SECONDS",
                        help="also write OUT/trace-ROWS.jsonl: memory by kind of process (and anonymous against "
                             "shared memory) every SECONDS, to see what grows with the rows")
    parser.add_argument("--files", type=int, default=1,
                        help="write the records as this many files of consecutive rows (shards: one each)")
    parser.add_argument("extra", nargs="*", help="more `hpd extract` arguments (after --)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    for rows in args.rows:
        runs.append(run_one(args.work, rows, args.extra, args.trace, args.out, args.files))
        print(json.dumps(runs[-1]), flush=True)
    result = {"machine": machine(), "note": args.note, "runs": runs,
              "command": " ".join(["python scripts/pipeline_scale.py", *(argv if argv is not None else sys.argv[1:])])}
    (args.out / "scale.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "scale.md").write_text(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
