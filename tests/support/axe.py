"""axe-core (Deque's accessibility engine, from npm: the Makefile's ``AXE_STAMP`` installs it) run
in a page open in Chromium: its serious and critical violations, and how to say them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from selenium.webdriver.remote.webdriver import WebDriver

AXE = Path(__file__).resolve().parent.parent.parent / ".run" / "npm" / "node_modules" / "axe-core" / "axe.min.js"
#: axe-core's impacts that fail a test.
FAILING = {"serious", "critical"}


def violations(browser: WebDriver, axe_source: str) -> list[dict[str, Any]]:
    browser.execute_script(axe_source)
    result: dict[str, Any] = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "axe.run(document, {resultTypes: ['violations']}).then((r) => done(r), (e) => done({error: String(e)}));"
    )
    assert "error" not in result, result
    return [v for v in result["violations"] if v["impact"] in FAILING]


def said(page: str, width: int, found: list[dict[str, Any]]) -> str:
    lines = []
    for v in found:
        lines.append(f"{page} at {width} px: {v['id']} [{v['impact']}] {v['help']} ({v['helpUrl']})")
        for node in v["nodes"][:5]:
            summary = " ".join(node.get("failureSummary", "").split())
            lines.append(f"    {' '.join(node['target'])}: {summary[:300]}")
        if len(v["nodes"]) > 5:
            lines.append(f"    ... and {len(v['nodes']) - 5} more")
    return "\n".join(lines)
