"""analyze(): the walking skeleton's acceptance path and its error messages."""

import pytest

from analysis.index import write_root_index
from analysis.load import load_paper_runs
from analysis.report import analyze
from analysis.synthetic import write_synthetic_sweep
from analysis.tables import mitigations_table

CONFIGS = {"bf16_bf16": 1.0, "fp8_e4m3_fp8_e4m3": 0.6}


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("sweep")
    write_synthetic_sweep(
        root,
        configs=CONFIGS,
        budgets=[1e12, 1e13, 1e14],
        shapes=[(32, 1), (64, 1), (128, 2)],
        n_points=60,
        unstable={"fp8_e4m3_fp8_e4m3": 1e14},
    )
    return root


def test_acceptance_scaling_plot(sweep, tmp_path):
    paths = analyze(sweep, paper=False, plots=["scaling"], tables=[], out_dir=tmp_path)
    assert tmp_path / "scaling.png" in paths and tmp_path / "scaling.pdf" in paths
    assert (tmp_path / "scaling.png").stat().st_size > 20_000
    index = (tmp_path / "index.md").read_text()
    assert "scaling.png" in index


def test_all_tables_on_sweep(sweep, tmp_path):
    paths = analyze(
        sweep, paper=False, plots=["instability"], tables=["all"], out_dir=tmp_path, n_boot=4
    )
    names = {p.name for p in paths}
    assert {"fits_compute.md", "fits_chinchilla.csv", "instability.md", "mitigations.csv"} <= names
    table = (tmp_path / "instability.md").read_text()
    # The injected blow-ups: every fp8 run at 1e14 and nothing else.
    assert "| fp8_e4m3_fp8_e4m3 | 0/3 | 0/3 | 3/3 | 3/9 |" in table
    assert "| bf16_bf16 | 0/3 | 0/3 | 0/3 | 0/9 |" in table
    by_shape = (tmp_path / "instability_by_shape.md").read_text()
    assert "| fp8_e4m3_fp8_e4m3 | 1/3 | 1/3 | 1/3 | 3/9 |" in by_shape
    compute = (tmp_path / "fits_compute.md").read_text()
    assert "under-determined (3 pts/3 params)" in compute


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"plots": ["scatter"], "tables": []}, "unknown plot"),
        ({"plots": [], "tables": ["nope"]}, "unknown table"),
    ],
)
def test_unknown_names_raise(sweep, tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        analyze(sweep, paper=False, out_dir=tmp_path, **kwargs)


def test_source_errors(tmp_path):
    with pytest.raises(ValueError, match="no runs"):
        analyze(tmp_path, paper=False, plots=["scaling"], tables=[], out_dir=tmp_path / "o")
    with pytest.raises(ValueError, match="exactly one source"):
        analyze(tmp_path, paper=True, plots=["scaling"], tables=[], out_dir=tmp_path / "o")


def test_curves_need_metrics(tmp_path):
    write_synthetic_sweep(
        tmp_path, configs={"bf16_bf16": 1.0}, budgets=[1e12], shapes=[(32, 1)], metrics=False
    )
    with pytest.raises(ValueError, match="needs step metrics"):
        analyze(tmp_path, paper=False, plots=["curves"], tables=[], out_dir=tmp_path / "o")


def test_paper_mitigations_bf16_activations_match_baseline():
    table = mitigations_table(load_paper_runs()).set_index("config")
    # The paper: MX weights with bf16 activations track bf16; fully-MX E5M2 does not.
    assert abs(table.loc["fp8_e5m2_bf16", "median_delta_final"]) < 0.01
    assert table.loc["fp8_e5m2_fp8_e5m2", "mean_delta_final"] > 0.03
    assert table["matched"].min() > 20


def test_all_skips_what_the_source_lacks_but_named_raises(tmp_path):
    write_synthetic_sweep(
        tmp_path,
        configs={"fp8_e4m3_fp8_e4m3": 1.0},
        budgets=[1e12, 1e13],
        shapes=[(32, 1), (64, 1)],
        n_points=30,
    )
    with pytest.raises(ValueError, match="baseline configuration 'bf16_bf16' has no runs"):
        analyze(tmp_path, paper=False, plots=[], tables=["mitigations"], out_dir=tmp_path / "o")
    paths = analyze(
        tmp_path, paper=False, plots=["frontier"], tables=["all"], out_dir=tmp_path / "o", n_boot=0
    )
    assert tmp_path / "o" / "instability.md" in paths
    index = (tmp_path / "o" / "index.md").read_text()
    assert "## Skipped" in index and "mitigations: baseline configuration" in index
    root = write_root_index(tmp_path)
    assert "[o](o/index.md)" in root.read_text()
