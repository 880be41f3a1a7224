"""The A/B gate's power on this machine (``make ab-power``): how often ``crossrl ab`` flags a planted slowdown,
and how often it flags identical code.

Runs ``crossrl ab HEAD`` ``--runs`` times with ``--plant-slowdown`` (the head's evaluators burn that
fraction more CPU per sample call) and ``--runs`` times without, alternating the two kinds so both see the
same stretch of the machine's load; each gate run is a fresh command with the gate's defaults. Writes
``runs.jsonl`` (one line per gate run) and ``power.md`` (the table and the two rates) under ``--out``.

    python tests/bench/ab_power.py --runs 10 --plant 0.05 --out crossrl-results/ab-power
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def gate(out: Path, name: str, plant: float, extra: list[str]) -> dict:
    js = out / f"{name}.json"
    cmd = [sys.executable, "-m", "crossrl.cli", "ab", "HEAD", "--json", str(js), "--no-store", *extra]
    if plant:
        cmd += ["--plant-slowdown", repr(plant)]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.monotonic() - t0
    (out / f"{name}.log").write_text(done.stdout + done.stderr)
    if done.returncode not in (0, 1) or not js.exists():
        raise SystemExit(f"{name}: crossrl ab exited {done.returncode}; see {out / (name + '.log')}")
    data = json.loads(js.read_text())
    (cell,) = data["cells"]
    return {
        "run": name, "planted": plant, "exit": done.returncode, "verdict": cell["verdict"],
        "ratio": cell["ratio"]["ratio"], "lo": cell["ratio"]["lo"], "hi": cell["ratio"]["hi"],
        "wall_ratio": cell["wall_ratio"]["ratio"], "pairs": len(cell["pairs"]),
        "draws": cell.get("draws"), "processes": cell.get("processes"), "stop": data["stop_reason"],
        "gate_s": round(wall, 1), "commit": data["head_commit"][:12],
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=10, help="gate runs of each kind")
    ap.add_argument("--plant", type=float, default=0.05, help="the planted slowdown (0.05: 5 %% more CPU)")
    ap.add_argument("--out", type=Path, default=Path("crossrl-results/ab-power"))
    ap.add_argument("gate_args", nargs="*", help="more `crossrl ab` options, after --")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with open(args.out / "runs.jsonl", "a") as log:
        for i in range(args.runs):
            for plant in (args.plant, 0.0):
                row = gate(args.out, f"{'planted' if plant else 'same'}-{i + 1}", plant, args.gate_args)
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
                print(json.dumps(row), flush=True)
    planted = [r for r in rows if r["planted"]]
    same = [r for r in rows if not r["planted"]]
    hit = sum(r["verdict"] == "REGRESSION" for r in planted)
    false = sum(r["verdict"] == "REGRESSION" for r in same)
    lines = [
        f"planted {args.plant:.0%} slowdown flagged as a regression: {hit} of {len(planted)}; "
        f"identical code flagged: {false} of {len(same)}; longest gate run {max(r['gate_s'] for r in rows):.0f} s",
        "",
        "| run | verdict | ratio [95 % CI] | wall ratio | pairs | draws | process pairs | gate s | stopped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['run']} | {r['verdict']} | {r['ratio']:.3f} [{r['lo']:.3f}, {r['hi']:.3f}] | "
            f"{r['wall_ratio']:.3f} | {r['pairs']} | {r['draws']} | {r['processes']} | {r['gate_s']:.0f} | {r['stop']} |"
        )
    (args.out / "power.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
