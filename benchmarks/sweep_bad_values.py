"""Sweep bad values through every field of the catalog scenarios and report what is not
a one-sentence refusal: a traceback, a message of several lines, one that quotes a whole
entry (``{'``) or runs past 400 characters, a run over its CPU limit or out of memory.

For each scenario, every field (the validated scenario's fields, defaults included) is set
in turn to each of ``--values``; every mapping gets an unknown key; every key of the
resolved file is deleted once. With ``--run``, the numeric settings that load are run
through ``llmsim run`` in this process (one per field and value, on the first scenario
that accepts it), each under a CPU-time limit, the process under an address-space limit.

On 94b35b5 this found, among others: entry dumps in every model rule's message, a
TypeError for ``system.groups: -1``, a hang for ``model.layers: 2**53`` on a MoE model,
ZeroDivisionErrors for a zero FP8 peak fraction or ring bandwidth fraction and for a
power limit below the static power, numpy ValueErrors from the calendar for 1e300 tokens
and a seed of -1, a MemoryError for ``model.mtp_depth: 2**53``. It prints nothing but its
counts where every input gives a result or one sentence.

    PYTHONPATH=simulator python benchmarks/sweep_bad_values.py            # load only
    PYTHONPATH=simulator python benchmarks/sweep_bad_values.py --run selene-gpt3
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import resource
import signal
import sys
import traceback
from collections.abc import Iterator
from typing import Any

from llmsim import catalog, load_scenario
from llmsim.cli import main as cli_main
from llmsim.errors import UserError
from llmsim.loader import _resolve, apply_system_set, read_yaml, scenario_path

VALUES = (-1, 0, 1e300, 10**40, 2**53, 1e-300, "zz", [], {}, None, True, float("nan"))
"""The bad values each field is set to (a float outside the arithmetic's range, a whole
number past 2^53, zero, negative, the wrong type)."""


def fields(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every (dotted path, value) below ``node``, mappings included, through string keys
    without a dot (``--set`` cannot name a key with one, such as a source's
    ``gemm.peak_fraction``)."""
    if isinstance(node, dict):
        if path:
            yield path, node
        for key, value in node.items():
            if isinstance(key, str) and "." not in key:
                yield from fields(value, (*path, key))
    else:
        yield path, node


def problem(message: str) -> str | None:
    """What is wrong with a refusal's message, or None."""
    if "\n" in message:
        return "several lines"
    if "{'" in message:
        return "quotes an entry"
    if len(message) > 400:
        return f"{len(message)} characters"
    return None


def sweep_load(name: str, values: tuple[Any, ...]) -> tuple[int, list[str], list[tuple]]:
    """Trials, problems and the accepted numeric (path, value) settings of one scenario."""
    found, accepted, trials = [], [], 0
    for path, current in fields(load_scenario(name).model_dump()):
        dotted = ".".join(path)
        tries = [(dotted, v) for v in values]
        if isinstance(current, dict):
            tries.append((dotted + ".zz_unknown", 1))
        for key, value in tries:
            trials += 1
            try:
                load_scenario(name, {key: value})
            except UserError as exc:
                if why := problem(str(exc)):
                    found.append(f"{name} {key}={value!r}: {why}: {str(exc)[:200]}")
                continue
            except Exception:
                found.append(f"{name} {key}={value!r}: {traceback.format_exc(limit=-2)}")
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                accepted.append((name, key, value))
    source = scenario_path(name)
    raw = apply_system_set(_resolve(read_yaml(source), source.parent), source.name)
    for path, _ in fields(raw):
        trials += 1
        changed = copy.deepcopy(raw)
        node = changed
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
        try:
            load_scenario(changed)
        except UserError as exc:
            if why := problem(str(exc)):
                found.append(f"{name} without {'.'.join(path)}: {why}: {str(exc)[:200]}")
        except Exception:
            found.append(f"{name} without {'.'.join(path)}: {traceback.format_exc(limit=-2)}")
    return trials, found, accepted


class _OverTime(BaseException):
    """Raised by the CPU-time alarm."""


def _alarm(signum: int, frame: Any) -> None:
    raise _OverTime


def run_cli(args: list[str], cpu_s: float) -> str | None:
    """``llmsim ARGS`` in this process: None for a result or one sentence, else why not."""
    signal.setitimer(signal.ITIMER_PROF, cpu_s)
    err = io.StringIO()
    old, sys.argv = sys.argv, ["llmsim", *args]
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            cli_main()
    except SystemExit as exc:
        if exc.code not in (0, 2, None):
            return f"exit {exc.code}"
    except _OverTime:
        return f"over {cpu_s:g} CPU s"
    except MemoryError:
        return "out of memory"
    except Exception:
        return traceback.format_exc(limit=-2)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        sys.argv = old
    return "traceback on stderr" if "Traceback" in err.getvalue() else None


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("scenarios", nargs="*", help="catalog scenarios (default: all)")
    parser.add_argument("--run", action="store_true", help="also run what loads")
    parser.add_argument("--cpu-s", type=float, default=20.0, help="CPU limit of a run")
    parser.add_argument("--memory-gb", type=float, default=6.0,
                        help="address-space limit of this process with --run")
    args = parser.parse_args(argv)
    names = args.scenarios or sorted(catalog.names("scenarios"))
    trials, found, accepted = 0, [], {}
    for name in names:
        n, problems, ok = sweep_load(name, VALUES)
        trials += n
        found += problems
        for scenario, key, value in ok:
            accepted.setdefault((key, repr(value)), (scenario, key, value))
    print(f"{trials:,} settings loaded or refused over {len(names)} scenarios")
    if args.run:
        limit = int(args.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        signal.signal(signal.SIGPROF, _alarm)
        for scenario, key, value in accepted.values():
            if why := run_cli(["run", scenario, "--set", f"{key}={value!r}"], args.cpu_s):
                found.append(f"run {scenario} --set {key}={value!r}: {why}")
        print(f"{len(accepted):,} accepted numeric settings run")
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
