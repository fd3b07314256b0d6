"""The command line's process settings (``llmsim.cli.main``): no BLAS worker threads, while
importing llmsim as a library leaves the user's BLAS settings alone; the collector frozen
at exit.

OpenBLAS's workers busy-wait for about 0.1 s after numpy's import, and the interpreter's
last collections pass over every live object: CPU time that a short command in a fresh
process paid beside its own (issue #37's start-up targets).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

LIBRARY = ("import os, llmsim, llmsim.simulation, numpy; "
           "print(os.environ.get('OPENBLAS_NUM_THREADS', 'unset'), "
           "len(os.listdir('/proc/self/task')))")
"""Imports llmsim and numpy as a library user does; prints the setting and the threads."""

COMMAND = ("import os, llmsim.cli as cli; cli.app = lambda **kw: __import__('numpy'); "
           "cli.main(); print(os.environ.get('OPENBLAS_NUM_THREADS', 'unset'), "
           "len(os.listdir('/proc/self/task')))")
"""Runs the command line's entry point with an app that only imports numpy, as every
command that simulates does; prints the setting and the threads."""

needs_proc = pytest.mark.skipif(not Path("/proc/self/task").is_dir(),
                                reason="needs Linux's /proc")


def _openblas() -> bool:
    """Whether numpy's BLAS is OpenBLAS (the wheels on PyPI), whose workers the test counts."""
    import numpy

    blas = numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]
    return "openblas" in str(blas.get("name", "")).lower()


def _probe(code: str, env_extra: dict[str, str]) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"} | env_extra
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                         text=True, env=env).stdout.split()
    return out[0], int(out[1])


@needs_proc
def test_the_command_line_starts_one_thread() -> None:
    assert _probe(COMMAND, {}) == ("1", 1)


@needs_proc
def test_importing_llmsim_leaves_blas_alone() -> None:
    setting, threads = _probe(LIBRARY, {})
    assert setting == "unset"
    if (os.cpu_count() or 1) >= 2 and _openblas():
        assert threads >= 2  # OpenBLAS's own default: a worker per core


@pytest.mark.skipif(not Path("/proc/self/task").is_dir() or (os.cpu_count() or 1) < 2
                    or not _openblas(), reason="needs Linux's /proc, two cores, OpenBLAS")
def test_a_users_setting_wins() -> None:
    setting, threads = _probe(COMMAND, {"OPENBLAS_NUM_THREADS": "2"})
    assert setting == "2" and threads == 2


FROZEN_AT_EXIT = ("import atexit, gc, sys, llmsim.cli as cli; "
                  "atexit.register(lambda: print(gc.get_freeze_count())); "
                  "cli.app = lambda **kw: sys.exit(0); cli.main()")
"""Prints, at exit after the entry point's own exit handlers, how many objects are frozen."""


def test_the_command_line_freezes_the_collector_at_exit() -> None:
    out = subprocess.run([sys.executable, "-c", FROZEN_AT_EXIT], check=True,
                         capture_output=True, text=True).stdout
    assert int(out) > 10_000  # the modules, the app: everything alive when it exits


def test_freezing_is_registered_once(monkeypatch) -> None:
    import atexit
    import gc

    from llmsim import cli

    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    monkeypatch.setattr(atexit, "unregister", lambda f: registered.remove(f)
                        if f in registered else None)
    monkeypatch.setattr(cli, "app", lambda **kw: None)
    cli.main()
    cli.main()
    assert registered == [gc.freeze]


def _commands():
    """Every function typer turns into a command or callback of ``llmsim``."""
    from llmsim import cli

    yield cli.app.registered_callback.callback
    yield from (c.callback for c in cli.app.registered_commands)
    for group in cli.app.registered_groups:
        yield from (c.callback for c in group.typer_instance.registered_commands)


def test_commands_carry_evaluated_annotations():
    """typer reads each command's parameter types when the app is built, at every start:
    a string annotation (``from __future__ import annotations``) it evaluates twice
    (``inspect.signature`` and ``get_type_hints``), 320 compiles for its 13 functions, about
    35 ms of CPU of each ``llmsim`` start; an annotation already evaluated costs nothing."""
    import inspect

    functions = list(_commands())
    assert len(functions) >= 13
    strings = {f"{fn.__module__}.{fn.__name__}: {name}"
               for fn in functions for name, annotation in inspect.get_annotations(fn).items()
               if isinstance(annotation, str)}
    assert not strings
