"""Run every benchmark once, one after another, and print (or write) their tables together.

``bench/README.md``'s "Latest figures" section is this command's output, so every figure in it
comes from the same run on the same machine, with the load average beside each bench (the
load generator shares the cores with the server; a loaded machine inflates wall-clock rows).

Run from the repository root::

    python bench/run_all.py                  # print everything (about 20 min on 2 vCPU)
    python bench/run_all.py --write          # and replace the section in bench/README.md
    python bench/run_all.py --only step_cost leave_batch   # a subset (never written)

Each bench runs in its own process with its default arguments (the ones the README's command
table names), a time limit, and its own embedded server; a bench that fails is reported with
its exit status and the tail of its output, and the others still run.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

from _common import machine_line

BENCH = Path(__file__).resolve().parent
README = BENCH / "README.md"
BEGIN, END = "<!-- run_all:begin -->", "<!-- run_all:end -->"

# (script, arguments): the README command table's commands, in a cheap-to-dear order (all but
# lua_profile, a diagnostic whose per-function table would swamp the section).
BENCHES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("step_cost", ()),
    ("step_parts", ()),
    ("lua_cost", ()),
    ("leave_batch", ()),
    ("assignors", ()),
    ("offsets", ()),
    ("replica_acks", ("--seconds", "5")),
    ("read_path", ()),
    ("produce", ()),
    ("spark_write", ()),
    ("consume", ()),
    ("formation_async", ()),
    ("membership", ()),
    ("rebalance_pause", ()),
    ("scaling", ()),
    ("expiry", ()),
    ("gateway", ()),
    ("spark_pipeline", ()),
)
LIMIT_S = 900


def run_one(name: str, args: tuple[str, ...]) -> tuple[str, str]:
    """(heading, body) of one bench: its command, load, duration, and what it printed."""
    cmd = [sys.executable, str(BENCH / f"{name}.py"), *args]
    shown = " ".join(["python", f"bench/{name}.py", *args])
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    try:
        proc = subprocess.run(cmd, cwd=BENCH.parent, capture_output=True, text=True,
                              timeout=LIMIT_S, check=False)
        out, status = proc.stdout, proc.returncode
        if status != 0:
            out += "\n" + proc.stderr[-3000:]
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        status = f"killed after {LIMIT_S} s"  # type: ignore[assignment]
    took = time.monotonic() - t0
    load1 = os.getloadavg()[0]
    head = (f"### `{shown}`\n\n{took:.0f} s, load average {load0:.2f} before, {load1:.2f} after"
            + ("" if status == 0 else f"; **failed** (exit {status})"))
    return head, out.strip()


def _about(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 100 else f"{seconds / 60:.0f} min"


def table_with_durations(text: str) -> str:
    """README text whose command table's "about" column says how long each bench took in
    the generated section (a note in parentheses after the time is kept); the
    ``run_all.py --write`` row gets their sum. A hand-kept column went stale at each run."""
    took = {m[1]: float(m[2]) for m in re.finditer(
        r"^### `python bench/(\w+)\.py[^`]*`\n\n(\d+) s, load average", text, re.MULTILINE)}
    out = []
    for line in text.splitlines(keepends=True):
        row = re.match(r"\| `python bench/(\w+)\.py[^`]*` \|", line)
        if row and (row[1] in took or row[1] == "run_all") and took:
            seconds = sum(took.values()) if row[1] == "run_all" else took[row[1]]
            head, about, _ = line.rstrip("\n").rsplit("|", 2)
            note = about[about.index("("):].strip() if "(" in about else ""
            line = f"{head}| {_about(seconds)}{' ' + note if note else ''} |\n"
        out.append(line)
    return "".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these benches")
    ap.add_argument("--write", action="store_true",
                    help="replace the generated section of bench/README.md (full runs only)")
    opts = ap.parse_args()
    chosen = [b for b in BENCHES if not opts.only or b[0] in opts.only]
    unknown = set(opts.only or ()) - {b[0] for b in BENCHES}
    if unknown:
        ap.error(f"unknown bench(es): {', '.join(sorted(unknown))}")
    if opts.write and opts.only:
        ap.error("--write needs the full run: the section is one run of every bench")
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    where = f"{machine_line()}, Python {platform.python_version()}"
    parts = [(f"Generated by `python bench/run_all.py --write` ({stamp}; {where}). "
              "Every table below is one run of its command, in this order, on the machine "
              "described; wall-clock rows move with the load average shown beside each.")]
    failed = 0
    for name, args in chosen:
        print(f"== {name} ...", file=sys.stderr, flush=True)
        head, body = run_one(name, args)
        failed += "**failed**" in head
        print(f"{head}\n\n{body}\n", flush=True)
        parts.append(f"{head}\n\n{body}")
    if opts.write:
        text = README.read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{README} lacks the {BEGIN} / {END} markers")
        before, rest = text.split(BEGIN, 1)
        _, after = rest.split(END, 1)
        README.write_text(table_with_durations(
            before + BEGIN + "\n" + "\n\n".join(parts) + "\n" + END + after))
        print(f"wrote {README}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
