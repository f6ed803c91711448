"""``sweep report``: a self-contained static HTML site around :func:`analysis.report.analyze`.

The analysis writes every figure (PNG + PDF) and table (CSV + Markdown) into the output
folder; this module adds HTML pages that show them: an overview (status summary, figures,
fit tables), an instability page whose unstable runs link to their own curve pages, one page
per configuration (its loss curves, its rows of every fit table with CIs and flags, its
runs) and intervention/paired pages when the sweep has such runs. Pages use relative links
and a small inline script (sortable tables), so the folder opens from a file:// URL, a
cluster's shared disk or any static host.
"""

from __future__ import annotations

import html
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from analysis import figures, registry
from analysis.configs import config_order
from analysis.laws import N_BOOT
from analysis.registry import Item
from analysis.report import Analysis, Source, analyze_items, load_source

# Run pages (one curve figure each) are drawn for at most this many unstable runs.
MAX_RUN_PAGES = 200
# Pages of their own that registered items can ask for (Item.page); the rest: the overview.
PAGE_TITLES = registry.PAGES
RUN_COLUMNS = (
    "run_id",
    "budget",
    "d_model",
    "n_layers",
    "n_params",
    "tokens",
    "state",
    "final_val_loss",
    "min_val_loss",
    "unstable",
)
UNSTABLE_COLUMNS = (
    "run_id",
    "config",
    "budget",
    "d_model",
    "state",
    "diverged",
    "final_minus_best",
    "onset_step",
    "n_loss_spikes",
    "curve",
)

CSS = """
body{font-family:system-ui,sans-serif;margin:0 2em 3em;color:#222;max-width:1400px}
nav{position:sticky;top:0;background:#f4f4f4;padding:.5em;margin:0 -2em 1em;
border-bottom:1px solid #ccc}
nav a{margin-right:1.2em}
figure{margin:1em 0}figure img{max-width:100%;border:1px solid #ddd}
table{border-collapse:collapse;font-size:12px;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#eee;cursor:pointer}
th[data-dir=asc]::after{content:" \\25B2"}th[data-dir=desc]::after{content:" \\25BC"}
td.t{text-align:left}.note{color:#555;font-size:13px;max-width:70em}
.wrap{overflow-x:auto}
"""
# Click a header to sort by that column; numbers (data-v) sort numerically, text naturally.
SORT_JS = """
document.querySelectorAll("table.sortable th").forEach(th => th.addEventListener("click", () => {
  const table = th.closest("table"), body = table.tBodies[0], col = th.cellIndex;
  const dir = th.dataset.dir === "asc" ? -1 : 1;
  table.querySelectorAll("th").forEach(h => delete h.dataset.dir);
  th.dataset.dir = dir === 1 ? "asc" : "desc";
  const key = r => { const c = r.cells[col]; return c.dataset.v !== undefined ?
    Number(c.dataset.v) : c.textContent; };
  const rows = [...body.rows].sort((a, b) => {
    const x = key(a), y = key(b);
    if (typeof x !== typeof y) return (typeof x === "number" ? -1 : 1) * dir;
    if (typeof x === "number") return (x - y) * dir;
    return x.localeCompare(y, undefined, {numeric: true}) * dir;
  });
  rows.forEach(r => body.appendChild(r));
}));
"""


def slug(name: str) -> str:
    """A file-name-safe form of a configuration or run id."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", str(name)).strip("-") or "x"


def _cell(value: object, href: str | None = None) -> str:
    """One <td>: numbers keep their raw value in data-v for sorting."""
    attrs, text = "", ""
    if isinstance(value, bool | np.bool_):
        text, attrs = str(bool(value)), ' class="t"'
    elif isinstance(value, int | float | np.integer | np.floating):
        number = float(value)
        if math.isfinite(number):
            whole = number.is_integer() and abs(number) < 1e7
            text = f"{number:.0f}" if whole else format(number, ".4g")
            attrs = f' data-v="{number!r}"'
    elif value is not None and not (isinstance(value, float) and math.isnan(value)):
        text, attrs = str(value), ' class="t"'
    body = html.escape(text)
    if href and text:
        body = f'<a href="{html.escape(href)}">{body}</a>'
    return f"<td{attrs}>{body}</td>"


def html_table(
    frame: pd.DataFrame, links: dict[str, Callable[[object], str | None]] | None = None
) -> str:
    """A sortable HTML table of ``frame``; ``links`` maps a column to a cell's href (or None).

    An empty frame gives a short note instead: every table drawn has rows.
    """
    if frame.empty:
        return '<p class="note">(no rows)</p>'
    links = links or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for record in frame.itertuples(index=False):
        cells = []
        for column, value in zip(frame.columns, record, strict=True):
            link = links.get(column)
            cells.append(_cell(value, link(value) if link else None))
        rows.append("<tr>" + "".join(cells) + "</tr>")
    return (
        f'<div class="wrap"><table class="sortable"><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table></div>"
    )


@dataclass
class Site:
    """What the pages are built from: the source, its classified runs and the analysis files."""

    src: Source
    out: Path
    classified: pd.DataFrame
    pngs: list[Path]
    tables: list[Path]  # the .csv of each table
    analysis: Analysis
    pages: list[str]  # the extra pages present (instability, interventions, paired)
    run_pages: dict[str, str]  # run id -> page path relative to out
    config_pages: dict[str, str]

    @property
    def item_of(self) -> dict[str, Item]:
        """File stem -> the registered item that wrote it."""
        return {p.stem: item for item, paths in self.analysis.made for p in paths}

    def page_of(self, path: Path) -> str | None:
        """The page a figure/table is shown on (None: the overview)."""
        item = self.item_of.get(path.stem)
        return item.page if item else None

    def nav(self, root: str) -> str:
        links = [("index.html", "Overview")]
        links += [(f"{p}.html", PAGE_TITLES[p]) for p in self.pages]
        links.append(("index.html#configurations", "Configurations"))
        return "<nav>" + "".join(f'<a href="{root}{h}">{t}</a>' for h, t in links) + "</nav>"

    def write(self, rel: str, title: str, body: str) -> Path:
        """Write one page at ``rel`` (relative to out) with the shared head, nav and script."""
        root = "../" * rel.count("/")
        page = (
            f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f"{self.nav(root)}<h1>{html.escape(title)}</h1>{body}"
            f"<script>{SORT_JS}</script></body></html>\n"
        )
        path = self.out / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page)
        return path

    def run_link(self, root: str) -> Callable[[object], str | None]:
        return _linker(self.run_pages, root)

    def config_link(self, root: str) -> Callable[[object], str | None]:
        return _linker(self.config_pages, root)


def _linker(pages: dict[str, str], root: str) -> Callable[[object], str | None]:
    """The href of a key's page from a page ``root`` prefix (None when it has no page)."""

    def link(key: object) -> str | None:
        page = pages.get(str(key))
        return root + page if page else None

    return link


def _read_csv(csv: Path) -> pd.DataFrame:
    """A table written by the analysis; one with no columns at all reads as empty."""
    try:
        return pd.read_csv(csv)
    except pd.errors.EmptyDataError:
        return pd.DataFrame()


def _title_and_note(csv: Path) -> tuple[str, str]:
    """The title and note :func:`analysis.tables.write_table` put around the Markdown table."""
    md = csv.with_suffix(".md")
    if not md.is_file():
        return csv.stem, ""
    lines = md.read_text().splitlines()
    title = lines[0].lstrip("# ").strip() if lines else csv.stem
    after = [line for line in lines[1:] if line.strip() and not line.startswith("|")]
    return title, " ".join(after)


def _figure(site: Site, png: Path, root: str) -> str:
    pdf = png.with_suffix(".pdf")
    rel = png.name if not root else f"{root}{png.name}"
    extra = f' (<a href="{root}{pdf.name}">PDF</a>)' if pdf.is_file() else ""
    item = site.item_of.get(png.stem)
    about = f'<p class="note">{html.escape(item.description)}</p>' if item else ""
    return (
        f'<h2 id="fig-{png.stem}">{png.stem}</h2>{about}<figure><img src="{html.escape(rel)}" '
        f'alt="{png.stem}"><figcaption>{png.name}{extra}</figcaption></figure>'
    )


def _table_section(site: Site, csv: Path, root: str, frame: pd.DataFrame | None = None) -> str:
    title, note = _title_and_note(csv)
    frame = _read_csv(csv) if frame is None else frame
    links = {
        "run_id": site.run_link(root),
        "parent": site.run_link(root),
        "config": site.config_link(root),
    }
    note_html = f'<p class="note">{html.escape(note)}</p>' if note else ""
    return (
        f'<h2 id="table-{csv.stem}">{html.escape(title)}</h2>'
        f'<p class="note">{csv.stem} (<a href="{root}{csv.name}">CSV</a>)</p>'
        f"{html_table(frame, links)}{note_html}"
    )


def _status_section(site: Site) -> str:
    runs = site.classified
    counts = pd.crosstab(runs["config"], runs["state"])
    counts = counts.reindex(config_order(set(counts.index)))
    counts["total"] = counts.sum(axis=1)
    counts["unstable"] = runs.groupby("config")["unstable"].sum().reindex(counts.index)
    counts = counts.reset_index()
    budgets = sorted(runs["budget"].dropna().unique())
    states = ", ".join(f"{n} {s}" for s, n in runs["state"].value_counts().sort_index().items())
    return (
        f"<h2>Status</h2><p>{site.src.label}: {len(runs)} runs ({html.escape(states)}); "
        f"{len(budgets)} budgets from {min(budgets, default=0):.3g} to "
        f"{max(budgets, default=0):.3g} FLOPs.</p>"
        + html_table(counts, {"config": site.config_link("")})
    )


def _unstable_runs(site: Site) -> pd.DataFrame:
    unstable = site.classified[site.classified["unstable"]].copy()
    unstable["curve"] = [
        "curve" if rid in site.run_pages else "no curve logged" for rid in unstable["run_id"]
    ]
    return unstable[[c for c in UNSTABLE_COLUMNS if c in unstable]]


def _write_run_pages(site: Site) -> None:
    """One page per unstable run with curves: its loss / grad-norm curves and its facts."""
    curves = site.src.curves
    if curves is None or curves.empty or site.src.label == "paper":
        return  # the paper's curves carry logger ids that do not join onto its run table
    with_curves = set(curves["run_id"].astype(str))
    unstable = site.classified[site.classified["unstable"]]
    chosen = [rid for rid in unstable["run_id"].astype(str) if rid in with_curves]
    for run_id in chosen[:MAX_RUN_PAGES]:
        site.run_pages[run_id] = f"runs/{slug(run_id)}.html"
    for run_id, rel in site.run_pages.items():
        own = curves[curves["run_id"] == run_id]
        figures.plot_curves(own, site.out / "runs" / slug(run_id), formats=("png",))
        facts = site.classified[site.classified["run_id"].astype(str) == run_id].iloc[0]
        frame = pd.DataFrame({"field": facts.index.astype(str), "value": facts.to_numpy()})
        config = str(facts["config"])
        back = site.config_pages.get(config)
        back_html = f'<p>Configuration: <a href="../{back}">{html.escape(config)}</a></p>'
        body = (
            (back_html if back else "")
            + f'<figure><img src="{slug(run_id)}/curves.png" alt="curves of {run_id}"></figure>'
            + html_table(frame)
        )
        site.write(rel, f"Run {run_id}", body)


def _config_rows(site: Site, config: str) -> list[tuple[Path, pd.DataFrame]]:
    """This configuration's rows of every table that has a config column."""
    found = []
    for csv in site.tables:
        frame = _read_csv(csv)
        if "config" in frame and (frame["config"] == config).any():
            found.append((csv, frame[frame["config"] == config]))
    return found


def _write_config_pages(site: Site) -> None:
    curves = site.src.curves
    runs = site.classified
    for config in config_order(set(runs["config"])):
        rel = site.config_pages[config]
        body = ""
        own = curves[curves["config"] == config] if curves is not None else None
        if own is not None and len(own):
            name = Path(rel).stem
            figures.plot_curves(own, site.out / "configs" / name, formats=("png",))
            body += (
                f'<h2>Loss curves</h2><figure><img src="{name}/curves.png" '
                f'alt="curves of {html.escape(config)}"></figure>'
            )
        for csv, frame in _config_rows(site, config):
            body += _table_section(site, csv, "../", frame)
        sub = runs[runs["config"] == config]
        columns = [c for c in RUN_COLUMNS if c in sub]
        body += "<h2>Runs</h2>" + html_table(
            sub[columns].sort_values(["budget", "n_params"]), {"run_id": site.run_link("../")}
        )
        site.write(rel, f"Configuration {config}", body)


def _write_topic_pages(site: Site) -> None:
    for page in site.pages:
        body = "".join(_figure(site, p, "") for p in site.pngs if site.page_of(p) == page)
        body += "".join(_table_section(site, c, "") for c in site.tables if site.page_of(c) == page)
        if page == "instability":
            note = (
                f"{len(site.run_pages)} unstable run(s) with logged curves have a page"
                + (f" (at most {MAX_RUN_PAGES})" if len(site.run_pages) >= MAX_RUN_PAGES else "")
                + "."
            )
            body += f'<h2 id="unstable-runs">Unstable runs</h2><p class="note">{note}</p>'
            body += html_table(
                _unstable_runs(site),
                {"run_id": site.run_link(""), "config": site.config_link("")},
            )
        site.write(f"{page}.html", PAGE_TITLES[page], body)


def _write_index(site: Site) -> Path:
    body = _status_section(site)
    body += "".join(_figure(site, p, "") for p in site.pngs if site.page_of(p) is None)
    body += "".join(_table_section(site, c, "") for c in site.tables if site.page_of(c) is None)
    configs = "".join(
        f'<li><a href="{page}">{html.escape(config)}</a></li>'
        for config, page in site.config_pages.items()
    )
    body += f'<h2 id="configurations">Configurations</h2><ul>{configs}</ul>'
    body += '<h2 id="contents">Plots and tables</h2>' + html_table(_contents(site))
    if site.analysis.skipped:
        items = "".join(
            f"<li>{html.escape(f'{item.name}: {why}')}</li>" for item, why in site.analysis.skipped
        )
        body += f"<h2>Skipped</h2><ul>{items}</ul>"
    body += '<p class="note">Markdown index of the same files: <a href="index.md">index.md</a></p>'
    return site.write("index.html", f"Report: {site.src.label}", body)


def _contents(site: Site) -> pd.DataFrame:
    """Every registered plot and table: what it shows, what it needs, which files it wrote."""
    written = {(item.kind, item.name): paths for item, paths in site.analysis.made}
    why = {(item.kind, item.name): reason for item, reason in site.analysis.skipped}
    rows = []
    for kind in registry.KINDS:
        for item in registry.items(kind):
            key = (kind, item.name)
            files = ", ".join(p.name for p in written.get(key, []) if p.suffix in (".png", ".csv"))
            rows.append(
                {
                    "kind": kind,
                    "name": item.name,
                    "description": item.description,
                    "needs": item.needs.describe(),
                    "files": files if key in written else f"skipped: {why.get(key, '')}",
                }
            )
    return pd.DataFrame(rows)


def write_report(
    sweep_dir: Path | None, *, paper: bool, out_dir: Path, n_boot: int = N_BOOT
) -> Path:
    """Analyse a sweep folder (or the paper's runs) with every figure and table into
    ``out_dir`` and write the HTML site around them; return ``out_dir/index.html``.

    Raises ValueError (from the loaders) for a folder with no runs.
    """
    src = load_source(sweep_dir, paper)
    src.n_boot = n_boot
    out = Path(out_dir)
    analysis = analyze_items(src, ["all"], ["all"], out)
    pngs = [p for p in analysis.paths if p.suffix == ".png"]
    tables = [p for p in analysis.paths if p.suffix == ".csv"]
    used = {item.page for item, _ in analysis.made if item.page}
    pages = [p for p in PAGE_TITLES if p in used]
    classified = src.classified()
    config_pages: dict[str, str] = {}
    for config in config_order(set(classified["config"])):
        # Free-form sweep names could collide once made file-safe: number the later ones.
        name = slug(config)
        taken = set(config_pages.values())
        n = 1
        while f"configs/{name}.html" in taken:
            name, n = f"{slug(config)}-{n}", n + 1
        config_pages[config] = f"configs/{name}.html"
    site = Site(
        src,
        out,
        classified,
        pngs,
        tables,
        analysis,
        pages,
        run_pages={},
        config_pages=config_pages,
    )
    _write_run_pages(site)
    _write_config_pages(site)
    _write_topic_pages(site)
    return _write_index(site)
