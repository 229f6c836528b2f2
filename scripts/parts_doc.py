"""Write docs/parts.md, every part of the catalog with its source, from cope_core/parts/data
(``python3 scripts/parts_doc.py``; tests/test_parts.py fails when the file is stale)."""
from __future__ import annotations

from pathlib import Path

from cope_core.files import write_atomic
from cope_core.parts.tables import markdown

DOC = Path(__file__).resolve().parent.parent / "docs" / "parts.md"


def main() -> None:
    write_atomic(DOC, markdown() + "\n", overwrite=True)
    print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
