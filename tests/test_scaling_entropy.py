"""The scaling figure puts the synthetic corpus's true entropy rate next to the fitted E."""

import json

from analysis import figures
from analysis.laws import compute_laws
from analysis.load import load_sweep_runs
from analysis.synthetic import write_synthetic_sweep


def test_entropy_rate_line_on_scaling_figure(tmp_path, monkeypatch):
    write_synthetic_sweep(
        tmp_path,
        configs={"bf16_bf16": 1.0},
        budgets=[1e12, 1e13, 1e14],
        shapes=[(32, 1), (64, 1)],
        metrics=False,
    )
    for path in tmp_path.glob("runs/*/summary.json"):
        path.write_text(json.dumps({**json.loads(path.read_text()), "entropy_rate": 1.4677}))
    runs = load_sweep_runs(tmp_path)
    assert (runs["entropy_rate"] == 1.4677).all()
    drawn = {}

    def keep(fig, out_dir, name, formats=("png", "pdf")):
        drawn[name] = fig
        return []

    monkeypatch.setattr(figures, "save", keep)
    figures.plot_scaling(runs, compute_laws(runs, n_boot=0), tmp_path)
    lines = [line for ax in drawn["scaling"].axes for line in ax.get_lines()]
    entropy = [line for line in lines if line.get_label().startswith("true entropy rate H = 1.468")]
    assert len(entropy) == 1 and list(entropy[0].get_ydata()) == [1.4677, 1.4677]
    fits = [line.get_label() for line in lines if line.get_label().strip().startswith("L = ")]
    assert len(fits) == 1  # the fitted law's label carries E beside it

    # Runs that disagree on (or lack) an entropy rate get no line.
    runs.loc[runs.index[0], "entropy_rate"] = 2.0
    drawn.clear()
    figures.plot_scaling(runs, compute_laws(runs, n_boot=0), tmp_path)
    labels = [line.get_label() for ax in drawn["scaling"].axes for line in ax.get_lines()]
    assert not any(label.startswith("true entropy") for label in labels)
