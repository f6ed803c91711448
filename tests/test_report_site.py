"""`sweep report`: the static HTML site, checked as files and rendered in headless Chromium."""

import json
import os
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
from chromium import Browser, find_chromium

from analysis.site import write_report
from analysis.synthetic import BATCH, SEQ_LEN, write_metrics, write_synthetic_sweep

pytestmark = pytest.mark.slow  # one report for the module: ~30 s of CPU (matplotlib)

CONFIGS = {"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.6}
UNSTABLE = {"fp8_e4m3_fp8_e4m3": 1e14}
CHROMIUM = find_chromium()
needs_browser = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="chromium is not installed (CI installs it: apt-get install chromium)",
)


def _add_branches_and_twin(sweep_dir: Path) -> str:
    """Make the sweep look like one that was intervened on and has a paired run: two arms
    branched from an unstable run, and an FP32 twin's series logged next to another run."""
    runs = sweep_dir / "runs"
    parent = "fp8_e4m3_fp8_e4m3-1.000e14-32-0"
    loss = runs / parent / "metrics" / "part-00000.parquet"
    import pyarrow.parquet as pq

    curve = pq.read_table(loss).to_pandas()
    curve = curve[curve["name"] == "train/loss"].sort_values("step")["value"].to_numpy()
    n = len(curve)
    for arm, tail in (("control", curve[n // 2 :]), ("bf16_weights", np.full(n - n // 2, 3.0))):
        run_id = f"{parent}-{arm}"
        run_dir = runs / run_id
        spec = json.loads((runs / parent / "spec.json").read_text())
        spec["branch"] = {"parent": parent, "step": int((n // 2) * 10), "arm": arm}
        run_dir.mkdir()
        (run_dir / "spec.json").write_text(json.dumps(spec))
        summary = json.loads((runs / parent / "summary.json").read_text())
        (run_dir / "summary.json").write_text(json.dumps({**summary, "run_id": run_id}))
        values = np.concatenate([curve[: n // 2], tail])
        write_metrics(
            run_dir / "metrics" / "part-00000.parquet",
            run_id,
            {"train/loss": values},
            BATCH * SEQ_LEN,
            1.0,
        )
    twin = "bf16_bf16-1.000e13-64-0"
    write_metrics(
        runs / twin / "metrics" / "part-00001.parquet",
        twin,
        {
            "paired/fp32_loss": np.linspace(5.0, 2.5, n),
            "paired/grad_zeta": np.full(n, 0.01),
            "paired/grad_cos": np.full(n, 0.999),
        },
        BATCH * SEQ_LEN,
        1.0,
    )
    return parent


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    sweep_dir = tmp_path_factory.mktemp("sweep")
    write_synthetic_sweep(
        sweep_dir,
        configs=CONFIGS,
        budgets=[1e12, 1e13, 1e14],
        shapes=[(32, 1), (64, 1), (128, 2)],
        n_points=60,
        unstable=UNSTABLE,
    )
    _add_branches_and_twin(sweep_dir)
    out = tmp_path_factory.mktemp("report")
    index = write_report(sweep_dir, paper=False, out_dir=out, n_boot=4)
    return index


class _Refs(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.refs: list[str] = []
        self.tables = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "table":
            self.tables += 1
        for key in ("href", "src"):
            if attrs.get(key):
                self.refs.append(attrs[key])


def _target(page: Path, ref: str) -> Path | None:
    """The local file a relative reference points at (None for external/anchor-only)."""
    parts = urlsplit(ref)
    if parts.scheme or not parts.path:
        return None
    return (page.parent / unquote(parts.path)).resolve()


def test_every_page_reference_resolves(report):
    """Static check: every href/src of every page names a file inside the report."""
    root = report.parent.resolve()
    pages = sorted(root.rglob("*.html"))
    assert len(pages) >= 8
    for page in pages:
        parser = _Refs()
        parser.feed(page.read_text())
        for ref in parser.refs:
            target = _target(page, ref)
            assert target is None or (target.is_file() and root in target.parents), (page, ref)


def test_report_pages_and_what_they_show(report):
    root = report.parent
    index = report.read_text()
    for name in ("scaling", "contours", "curves", "frontier", "isoflop"):
        assert f'src="{name}.png"' in index
    assert "fits_compute.csv" in index and "fits_chinchilla" in index
    assert "20 runs (20 done)" in index  # 18 grid runs + 2 arms
    # Exactly the unstable runs get a run page, linked from the instability page: the
    # injected blow-ups (fp8 at 1e14) and the two arms branched from one of them.
    run_pages = sorted(p.name for p in (root / "runs").glob("*.html"))
    blown = [f"fp8_e4m3_fp8_e4m3-1.000e14-{d}-0" for d in (128, 32, 64)]
    arms = [f"{blown[1]}-{arm}" for arm in ("bf16_weights", "control")]
    assert run_pages == sorted(f"{run}.html" for run in blown + arms)
    instability = (root / "instability.html").read_text()
    for page in run_pages:
        assert f'href="runs/{page}"' in instability
    assert 'src="instability.png"' in instability
    config_page = (root / "configs" / "fp8_e4m3_fp8_e4m3.html").read_text()
    assert 'src="fp8_e4m3_fp8_e4m3/curves.png"' in config_page
    assert "L(C) fits per configuration" in config_page and "CI" in config_page
    # Its rows of the shared tables, none of another configuration's.
    own = '<td class="t"><a href="../configs/fp8_e4m3_fp8_e4m3.html">fp8_e4m3_fp8_e4m3</a></td>'
    assert config_page.count(own) >= 5
    assert 'href="../configs/bf16_bf16.html"' not in config_page
    interventions = (root / "interventions.html").read_text()
    assert 'src="interventions.png"' in interventions and "bf16_weights" in interventions
    assert "averted" in interventions or "diverged" in interventions
    paired = (root / "paired.html").read_text()
    assert 'src="paired.png"' in paired and "bf16_bf16-1.000e13-64-0" in paired


def test_cli_report_errors_exit_2(tmp_path, repo_root):
    def sweep(*args):
        return subprocess.run(
            [sys.executable, "-m", "sweep.cli", "report", *args],
            cwd=repo_root,
            capture_output=True,
            text=True,
            timeout=120,
        )

    both = sweep()
    assert both.returncode == 2 and "SWEEP_DIR or --paper" in both.stderr
    (tmp_path / "runs").mkdir()
    empty = sweep(str(tmp_path), "--out", str(tmp_path / "out"))
    assert empty.returncode == 2 and "no runs" in empty.stderr


# --- in a real browser ------------------------------------------------------------------

PAGE_FACTS = """(async () => {
  const imgs = [...document.images];
  await Promise.all(imgs.map(i => i.complete ? null :
    new Promise(r => { i.onload = r; i.onerror = r; })));
  return {
    images: imgs.map(i => ({src: i.src, width: i.naturalWidth})),
    tables: [...document.querySelectorAll("table")].map(t => t.tBodies[0].rows.length),
    links: [...document.querySelectorAll("a[href]")].map(a => a.href),
  };
})()"""


def check_site(browser: Browser, index: Path) -> tuple[list[str], int]:
    """Open every page reachable from index.html; return (problems, pages visited).

    A problem: an image that did not load (naturalWidth 0), a table without rows, or a link
    to a local file that does not exist.
    """
    root = index.parent.resolve()
    todo, seen, problems = [index.resolve().as_uri()], set(), []
    while todo:
        url = todo.pop()
        if url in seen:
            continue
        seen.add(url)
        browser.open(url)
        facts = browser.evaluate(PAGE_FACTS)
        page = unquote(urlsplit(url).path)
        problems += [
            f"{page}: image {i['src']} did not load" for i in facts["images"] if not i["width"]
        ]
        problems += [
            f"{page}: table {k} has no rows" for k, n in enumerate(facts["tables"]) if not n
        ]
        for link in facts["links"]:
            parts = urlsplit(link)
            if parts.scheme != "file":
                continue
            target = Path(unquote(parts.path))
            if not target.is_file():
                problems.append(f"{page}: broken link {link}")
            elif target.suffix == ".html" and root in target.parents:
                todo.append(target.as_uri())
    return problems, len(seen)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        pytest.fail("CI is set but chromium is not installed (.ci/run installs it)")
    with Browser(CHROMIUM) as b:
        yield b


@needs_browser
def test_report_renders_in_chromium(report, browser, tmp_path):
    problems, visited = check_site(browser, report)
    assert problems == []
    assert visited == len(list(report.parent.rglob("*.html")))
    browser.open(report.resolve().as_uri())
    n_images = browser.evaluate("document.images.length")
    assert n_images >= 5
    shot = browser.screenshot(tmp_path / "index.png")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
    # Sorting: click the status table's "total" header twice, read the column each time.
    column = """(() => { const t = document.querySelector("table.sortable");
      const col = [...t.tHead.rows[0].cells].findIndex(c => c.textContent === "config");
      return [...t.tBodies[0].rows].map(r => r.cells[col].textContent); })()"""
    click = """document.querySelector("table.sortable").tHead.rows[0].cells[0].click()"""
    browser.evaluate(click)
    ascending = browser.evaluate(column)
    browser.evaluate(click)
    descending = browser.evaluate(column)
    assert ascending == sorted(ascending) and descending == ascending[::-1]
    assert len(ascending) == 2


@needs_browser
def test_broken_link_and_missing_image_are_caught(report, browser, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(report.parent, broken)
    (broken / "isoflop.png").unlink()
    page = broken / "instability.html"
    page.write_text(page.read_text().replace('href="runs/', 'href="gone/', 1))
    problems, _ = check_site(browser, broken / "index.html")
    assert any("isoflop.png did not load" in p for p in problems), problems
    assert any("broken link" in p and "/gone/" in p for p in problems), problems
    assert len(problems) == 2, problems


def test_report_of_a_barely_started_sweep(tmp_path):
    """One finished run and one pending: what cannot be drawn is listed as skipped, and
    empty tables become a note instead of a table without rows."""
    write_synthetic_sweep(
        tmp_path / "s", configs={"bf16_bf16": 1.0}, budgets=[1e12], shapes=[(32, 1)], n_points=20
    )
    pending = tmp_path / "s" / "runs" / "pending-run"
    pending.mkdir()
    (pending / "spec.json").write_text(
        json.dumps({"precision": {"w_fmt": "bf16", "a_fmt": "bf16"}})
    )
    index = write_report(tmp_path / "s", paper=False, out_dir=tmp_path / "r", n_boot=2)
    text = index.read_text()
    assert "2 runs (1 done, 1 pending)" in text and "<h2>Skipped</h2>" in text
    for page in (tmp_path / "r").rglob("*.html"):
        assert "<tbody></tbody>" not in page.read_text(), page
