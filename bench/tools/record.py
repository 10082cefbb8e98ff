"""Run a bench command and record its ``--json`` output as a result file of the manual.

    python bench/tools/record.py NAME 'COMMAND'

runs COMMAND in bash, reads one JSON object per line of its standard output, and writes
``docs/results/NAME.json``: the command, the machine, the date and the rows. The file's
``title`` and ``columns`` (which figures the manual's table shows, and how) are kept from
the file already there, so re-running a reference run changes figures, never layout. The
manual's benchmark pages are rendered from these files (``docs/hooks.py``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import subprocess
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


def machine() -> str:
    """The machine in words: CPU model, cores, memory, load average at the start."""
    model = platform.processor() or platform.machine()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    memory = ""
    meminfo = pathlib.Path("/proc/meminfo")
    if meminfo.exists():
        kib = int(meminfo.read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB memory"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{model}, {os.cpu_count()} cores{memory}, load average {load} at the start"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("name", help="the result file, docs/results/NAME.json")
    parser.add_argument("command", help="a shell command that prints one JSON object a line")
    args = parser.parse_args()
    path = RESULTS / f"{args.name}.json"
    old: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
    started = datetime.datetime.now(datetime.UTC)
    where = machine()
    out = subprocess.run(
        ["bash", "-c", args.command], cwd=ROOT, capture_output=True, text=True, check=True
    )
    rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    data = {
        "title": old.get("title", args.name),
        "command": args.command,
        "machine": where,
        "date": started.strftime("%Y-%m-%d"),
        "columns": old.get("columns", [[key, key, ""] for key in rows[0]]),
        "rows": rows,
    }
    path.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{path.relative_to(ROOT)}: {len(rows)} rows")


if __name__ == "__main__":
    main()
