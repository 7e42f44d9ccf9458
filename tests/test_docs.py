"""The docs' Python snippets run: every ```python block of README.md and docs/*.md, in order,
one fresh interpreter per file and one namespace per file (a block may use the names an
earlier block of its file defined), as a reader who pastes them one after the other would.

A block that cannot run as written (a fragment of a file, one that needs torchrun or a GPU) is
preceded by an HTML comment ``<!-- no-run: why -->``, which renders as nothing. A failing
block's traceback names the Markdown file and the line in it.

    python tests/test_docs.py docs/ops.md   # runs one file's blocks, as the test does
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_OPEN = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`]*)$")
_NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*\S.*-->\s*$")


def python_blocks(text: str) -> list[tuple[int, str, bool]]:
    """(first code line, 1-based; code, dedented; runnable) of each ```python block, in order.
    A block is runnable unless the nearest non-blank line above its fence is a no-run
    comment."""
    lines = text.split("\n")
    blocks = []
    i = 0
    while i < len(lines):
        m = _OPEN.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info = m["fence"], m["info"].strip()
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        j = i + 1
        while j < len(lines) and not close.match(lines[j]):
            j += 1
        if info.split()[:1] == ["python"]:
            above = next((lines[k] for k in range(i - 1, -1, -1) if lines[k].strip()), "")
            code = textwrap.dedent("\n".join(lines[i + 1:j]))
            blocks.append((i + 2, code, not _NO_RUN.match(above)))
        i = j + 1
    return blocks


def run_file(path: pathlib.Path) -> None:
    """Runs the runnable blocks of one Markdown file in one namespace; line numbers in a
    traceback are the file's."""
    namespace: dict = {"__name__": "__main__"}
    for line, code, runnable in python_blocks(path.read_text()):
        if runnable:
            exec(compile("\n" * (line - 1) + code, str(path), "exec"), namespace)  # noqa: S102


def test_the_parser_finds_blocks_and_no_run_marks():
    text = textwrap.dedent("""\
        ```python
        a = 1
        ```
        ```bash
        make demo
        ```
        <!-- no-run: needs torchrun -->

        ```python
        b = 2
        ```
        * item

          ```python
          c = 3
          ```
        """)
    assert python_blocks(text) == [(2, "a = 1", True), (10, "b = 2", False), (15, "c = 3", True)]


def test_a_failing_block_names_its_file_and_line(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("text\n\n```python\nx = 1\nundefined_name\n```\n")
    with pytest.raises(NameError) as info:
        run_file(doc)
    tb = info.traceback[-1]
    assert (tb.path, tb.lineno + 1) == (doc, 5)


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_docs_python_blocks_run(path):
    blocks = python_blocks(path.read_text())
    if not any(runnable for _, _, runnable in blocks):
        pytest.skip(f"no runnable ```python block in {path.name}")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    res = subprocess.run([sys.executable, __file__, str(path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, f"a ```python block of {path.name} failed:\n{res.stderr}"


def test_the_docs_have_python_blocks():
    """Guards the parser against finding nothing (the check would then pass vacuously)."""
    runnable = sum(r for p in DOC_FILES for _, _, r in python_blocks(p.read_text()))
    assert runnable >= 4


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        run_file(pathlib.Path(arg).resolve())
