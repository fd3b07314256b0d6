"""Fixed costs of the command line: import, ``llmsim run frontier.yaml``, ``llmsim validate``.

Run: python benchmarks/bench_startup.py [--repeats N] [--baseline DIR] [--no-validate]

Each measure is a fresh process (``python -c "import llmsim.cli"``, ``python -m llmsim.cli
run frontier.yaml``, ``python -m llmsim.cli validate``) on this checkout's ``simulator/``
and, with ``--baseline DIR``, on DIR's (another checkout, e.g. ``git worktree add DIR
main``), the two alternated run by run: a before/after in one run. It prints, per measure
and checkout, the least wall and the least CPU time (user + system, of the child process)
over the repeats: on a machine shared with other work the wall time of a fresh process
varies twofold and its CPU time less, and noise only ever adds time. ``validate`` runs
once per checkout (about a minute each); ``--no-validate`` leaves it out.

Compiled bytecode is written to and read from a cache of the benchmark's own
(``PYTHONPYCACHEPREFIX`` in the temporary directory), so that every timed run reads
bytecode as an installed llmsim does, even where ``PYTHONDONTWRITEBYTECODE`` is set, and
the checkouts' own folders are not written to; a first untimed run fills it.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

MEASURES = {
    "import llmsim.cli": ["-c", "import llmsim.cli"],
    "llmsim run frontier.yaml": ["-m", "llmsim.cli", "run", "frontier.yaml"],
    "llmsim validate": ["-m", "llmsim.cli", "validate"],
}
"""What is timed: the interpreter's arguments."""


def _env(checkout: Path) -> dict[str, str]:
    """The environment of a timed process on ``checkout``'s package."""
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPATH"] = str(checkout / "simulator")
    env["PYTHONPYCACHEPREFIX"] = str(Path(tempfile.gettempdir()) / "llmsim-bench-pycache"
                                     / checkout.resolve().as_posix().strip("/").replace("/", "+"))
    env["COLUMNS"] = "120"
    return env


def time_once(checkout: Path, args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one fresh process on ``checkout``, its output discarded."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=checkout, env=_env(checkout),
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: {' '.join(args)} failed:\n{done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main(argv: list[str]) -> None:
    repeats = int(argv[argv.index("--repeats") + 1]) if "--repeats" in argv else 5
    checkouts = {"this": ROOT}
    if "--baseline" in argv:
        checkouts = {"baseline": Path(argv[argv.index("--baseline") + 1]), **checkouts}
    measures = {k: v for k, v in MEASURES.items()
                if not ("--no-validate" in argv and k == "llmsim validate")}
    for checkout in checkouts.values():  # fill the bytecode cache, untimed
        time_once(checkout, MEASURES["llmsim run frontier.yaml"])
    best: dict[tuple[str, str], tuple[float, float]] = {}
    for name, args in measures.items():
        for _ in range(1 if name == "llmsim validate" else repeats):
            for label, checkout in checkouts.items():
                wall, cpu = time_once(checkout, args)
                old = best.get((name, label), (float("inf"), float("inf")))
                best[name, label] = (min(old[0], wall), min(old[1], cpu))
    load = os.getloadavg()[0]
    print(f"least of {repeats} fresh processes (validate: 1), load average {load:.1f}, "
          f"{os.cpu_count()} CPUs")
    print(f"{'measure':<26} {'checkout':<9} {'wall s':>8} {'CPU s':>8}")
    for name in measures:
        for label in checkouts:
            wall, cpu = best[name, label]
            print(f"{name:<26} {label:<9} {wall:>8.3f} {cpu:>8.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
