"""README.md is a front door whose every number is what the code prints today: its output blocks
and inline numbers (and docs/cli.md's example) regenerate unchanged from scripts/readme_blocks.py,
the prose outside them states no quantity of its own, and its links lead somewhere."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import readme_blocks as rb  # noqa: E402

README = ROOT / "README.md"
# a number with a unit, or any decimal: what prose must not state unless it is generated
QUANTITY = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)*\s*(?:%|×|x\b|ms\b|s\b|GiB\b|MiB\b|GB\b|min\b|minutes?\b|"
    r"seconds?\b|hours?\b|configurations?\b|candidates?\b|experts?\b|layers?\b|prompts?\b|"
    r"tokens?\b|draws?\b|slots?\b|cells?\b|trials?\b)"
    r"|(?<![\w./-])\d+\.\d+(?![\w.])")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_every_generated_part_is_what_the_code_prints_today():
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_blocks.py"), "--check"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr + r.stdout


def test_the_cheap_parts_without_running_cope():
    """The parts that need no prediction, made again in-process (the quick loop's check)."""
    text = README.read_text(encoding="utf-8")
    cheap = {n: rb.PARTS[n]() for n in ("matrix", "candidates", "python", "vram-gib", "port",
                                          "runtimes")}
    shown = {m.group(1): m.group(2) for m in rb.PART.finditer(text)}
    for name, value in cheap.items():
        assert shown.get(name) == value, name
    assert set(shown) <= set(rb.PARTS)


def test_regenerate_rewrites_marked_parts_only_and_is_idempotent(monkeypatch):
    monkeypatch.setattr(rb, "PARTS", {"n": lambda: "7", "b": lambda: "\n```\nout\n```\n"})
    text = ("a <!-- readme:n -->3<!-- /readme:n --> b, 12 ms kept as written\n"
            "<!-- readme:b -->\nold\n<!-- /readme:b -->\nend\n")
    once = rb.regenerate(text, "t.md", {})
    assert once == ("a <!-- readme:n -->7<!-- /readme:n --> b, 12 ms kept as written\n"
                    "<!-- readme:b -->\n```\nout\n```\n<!-- /readme:b -->\nend\n")
    assert rb.regenerate(once, "t.md", {}) == once
    with pytest.raises(SystemExit, match="t.md: unknown part 'zz'"):
        rb.regenerate("<!-- readme:zz -->1<!-- /readme:zz -->", "t.md", {})


def test_the_readme_is_a_front_door():
    text = README.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads[:3] == ["Two commands", "One worked answer", "The pipeline"], heads
    # the test command's opt-out for runtimes that cannot be set up (scripts/test.sh)
    assert "`COPE_ALLOW_MISSING_RUNTIMES=1 bash scripts/test.sh`" in text
    assert "COPE_ALLOW_MISSING_RUNTIMES=1" in (ROOT / "scripts" / "test.sh").read_text()
    assert "python3 scripts/readme_blocks.py" in text.split("-->")[0], \
        "the regenerating command is named at the top of README's source"
    for name in ("answer", "answer-winner", "matrix"):
        assert f"<!-- readme:{name} -->" in text, name


def test_the_prose_states_no_quantity_the_script_does_not_generate():
    text = rb.PART.sub("", README.read_text(encoding="utf-8"))
    found = [m.group(0) for m in QUANTITY.finditer(text)]
    assert not found, f"README states numbers by hand (generate them in readme_blocks.py): {found}"
    assert QUANTITY.search("22.253 ms") and QUANTITY.search("wins 100 % of draws")
    assert not QUANTITY.search("cope.profile/2 on an RTX 4090, HTTP 200")


def test_the_format_versions_it_names_are_the_code_s():
    code = "\n".join(p.read_text(encoding="utf-8") for p in (ROOT / "cope_core").rglob("*.py"))
    named = set(re.findall(r"cope\.[a-z-]+/\d+", README.read_text(encoding="utf-8")))
    assert named, "the pipeline names the file formats"
    for schema in named:
        assert f'"{schema}"' in code, schema


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to
    hyphens, a repeated one suffixed -1, -2, ... (headings inside fenced code do not count)."""
    text = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for head in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", head.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", ["README.md", *sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "docs").glob("*.md"))])
def test_every_relative_link_resolves(page):
    src = ROOT / page
    for target in LINK.findall(src.read_text(encoding="utf-8")):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        path, _, anchor = target.partition("#")
        dest = (src.parent / path).resolve() if path else src
        assert dest.exists(), f"{page}: {target}"
        if anchor:
            assert anchor in _anchors(dest.read_text(encoding="utf-8")), f"{page}: {target}"
