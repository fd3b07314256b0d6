"""The README's Python example and every ``llmsim ...`` command in README.md and docs/*.md
run as written.

Commands come from fenced code blocks (``$ llmsim ...`` or ``llmsim ...`` lines, ``\\``
continuations joined, ``#`` comments dropped) and from inline code spans that start with
``llmsim ``. A command is skipped, with the reason, when it is a template (``SCENARIO``,
``[a|b]``), when it needs a file the docs ask the user to bring, or when it is slow
(``llmsim validate`` simulates every published run; tests/test_validation.py covers it).
"""

from __future__ import annotations

import itertools
import re
import shlex
import sys
from pathlib import Path

import pytest

from llmsim.cli import main

ROOT = Path(__file__).parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`(llmsim [^`]+)`(?!`)")
FILE_ARG = re.compile(r"\.(ya?ml|csv|txt|json)$")
SLOW = {"validate": "slow: simulates every published run (~50 s); test_validation covers it",
        "search": "slow: prices every layout of a machine (minutes); test_search runs it on a "
                  "small space",
        "gpt4": "slow: searches six machines (~2-4 min); tests/test_gpt4.py covers it"}
GROUPS = ("calibrate", "schedule")  # commands whose subcommand comes next


def _fenced_commands(text: str) -> list[str]:
    commands = []
    for _, body in FENCE.findall(text):
        joined = re.sub(r"\\\n\s*", " ", body)
        for line in joined.splitlines():
            line = line.strip().removeprefix("$ ").strip()
            if line.startswith("llmsim "):
                commands.append(line)
    return commands


def doc_commands() -> list[tuple[str, str]]:
    """(page, command) for every distinct ``llmsim`` command in the pages (``frontier``
    and ``frontier.yaml`` are the same scenario; comments do not count)."""
    seen, out = set(), []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        inline = [" ".join(c.split()) for c in INLINE.findall(FENCE.sub("", text))]
        for command in _fenced_commands(text) + inline:
            try:
                key = tuple(a.removesuffix(".yaml") for a in shlex.split(command, comments=True))
            except ValueError:
                key = (command,)
            if key not in seen:
                seen.add(key)
                out.append((page.name, command))
    return out


def why_skip(args: list[str]) -> str | None:
    """The reason not to run a command, or None."""
    if any(re.fullmatch(r"[A-Z]{3,}", a) or re.search(r"[\[\]|…]|\.\.\.", a) for a in args):
        return "a template, not a command"
    if args[1] in SLOW:
        return SLOW[args[1]]
    if len(args) <= (3 if args[1] in GROUPS else 2) and args[1] in (*GROUPS, "run", "compare",
                                                                    "sweep"):
        return "names the command in prose; it needs arguments"
    for before, arg in itertools.pairwise(args[1:]):
        if before in ("--out", "--csv"):
            continue  # written, not read
        if FILE_ARG.search(arg) and not Path(arg).exists() and not (ROOT / arg).exists():
            name = Path(arg).name.removesuffix(".yaml")
            if not (ROOT / "workloads" / "scenarios" / f"{name}.yaml").exists():
                return f"needs {arg}, a file the user brings"
    return None


@pytest.mark.parametrize(("page", "command"), doc_commands(),
                         ids=[f"{p}: {c}" for p, c in doc_commands()])
def test_documented_command_runs(page, command, tmp_path, monkeypatch, capsys):
    args = shlex.split(command, comments=True)
    reason = why_skip(args)
    if reason:
        pytest.skip(reason)
    monkeypatch.chdir(tmp_path)  # commands that write (--out) write here
    monkeypatch.setattr(sys, "argv", args)
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    err = capsys.readouterr().err
    assert code == 0, f"{page}: `{command}` exited {code}: {err}"


def test_some_commands_are_found_and_run():
    runnable = [c for _, c in doc_commands() if why_skip(shlex.split(c, comments=True)) is None]
    assert len(runnable) >= 8, runnable


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_python_example_runs(page, tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    text = (ROOT / page).read_text(encoding="utf-8")
    blocks = [body for lang, body in FENCE.findall(text) if lang == "python"]
    assert blocks, f"{page} has no Python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, object] = {}
    exec(compile(blocks[0], f"{page}'s Python example", "exec"), namespace)
    result = namespace["result"]
    assert result.step_time_s > 0  # type: ignore[attr-defined]
    assert (tmp_path / "timeline.png").stat().st_size > 10_000  # the figure it saves
