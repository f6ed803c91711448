"""Analysis of MX scaling sweeps: loading, scaling-law fits, instabilities, tables, figures.

Modules: ``load`` (tidy run frame from sweeps or the paper's table, step metrics),
``fit`` (Chinchilla / Kaplan / L(C) fits, bootstrap), ``joint`` (precision-aware joint law,
leave-one-budget-out), ``laws`` (fits per configuration), ``isoflop`` (IsoFLOP parabolas,
N_opt ∝ C^a), ``transfer`` (loss-to-loss transfer between configurations, held-out
tests; figure in ``transfer_plot``), ``instability`` (detectors and frequency tables),
``tables``, ``figures``, ``index``, ``report`` (``analyze``, the CLI's entry point) and
``synthetic`` (sweep folders with a known law, for tests and benchmarks).
Never imports torch, mx, models or sweep, so it runs anywhere pandas and matplotlib do.
"""
