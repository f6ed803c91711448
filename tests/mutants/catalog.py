"""The curated one-line mutants: plausible bugs the suite must catch.

Each names the file, the exact line (compared without surrounding whitespace; it must occur
once, or first after the unique ``after`` line), its replacement, and the test files or
test ids that must fail with it. Keep the tests fast: each mutant runs them with ``-x``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str
    after: str | None = None


TRAIN = "tests/test_oracles_train.py"
RESUME = f"{TRAIN}::test_resume_continues_from_the_altered_checkpoint_on_disk"
ADAMW = f"{TRAIN}::test_updates_match_a_hand_written_adamw_with_clipping"
LR = f"{TRAIN}::test_logged_lr_follows_the_documented_schedule"
NAMES = f"{TRAIN}::test_documented_metric_names_are_logged"
CLI = "tests/test_cli_promises.py"
STATUS = "tests/test_oracles_status.py"

MUTANTS: tuple[Mutant, ...] = (
    # --- the table ------------------------------------------------------------
    Mutant(
        "resume_ignores_checkpoint",
        "models/train.py",
        "state = load_latest(self.ckpt_dir)",
        "state = None",
        (RESUME, f"{TRAIN}::test_resumed_attempt_is_shorter_than_a_rerun"),
        "Trainer.resume retrains from step 0",
    ),
    Mutant(
        "nan_divergence_rule_removed",
        "models/train.py",
        "if not math.isfinite(loss) or self.above_initial >= window:",
        "if self.above_initial >= window:",
        (f"{TRAIN}::test_nan_injected_at_a_known_step_ends_the_run_diverged_there",),
        "a NaN loss does not end the run",
    ),
    Mutant(
        "rope_removed",
        "models/transformer.py",
        "q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)",
        "pass",
        ("tests/test_oracles_transformer.py",),
        "attention without positions",
    ),
    Mutant(
        "instability_tau_zero",
        "analysis/instability.py",
        "tau: float = 0.05",
        "tau: float = 0.0",
        ("tests/test_oracles_analysis.py::test_paper_table_instability_counts_are_the_readmes",),
        "any rise after the best loss counts as non-recovery",
    ),
    Mutant(
        "instability_tau_0_07",
        "analysis/instability.py",
        "tau: float = 0.05",
        "tau: float = 0.07",
        ("tests/test_oracles_analysis.py::test_paper_table_instability_counts_are_the_readmes",),
        "a looser non-recovery threshold",
    ),
    Mutant(
        "mx_ceil_is_floor_plus_one",
        "mx/quantizer.py",
        "exp = e8m0_ceil_exponent(bits) - E8M0_BIAS - fmt.emax",
        "exp = ((bits >> 23) & _EXP_MASK) - E8M0_BIAS - fmt.emax + 1",
        ("tests/test_oracles_mx.py",),
        "CEIL bumps exact powers of two",
    ),
    Mutant(
        "mx_even_is_floor",
        "mx/quantizer.py",
        "bits = bits + (1 << (22 - fmt.mbits))",
        "bits = bits",
        ("tests/test_oracles_mx.py",),
        "EVEN does not round the block max first",
    ),
    Mutant(
        "huber_is_least_squares",
        "analysis/fit.py",
        "DELTA = 1e-3",
        "DELTA = 1e3",
        (
            "tests/test_oracles_analysis.py::test_huber_fit_ignores_outliers_that_pull_least_squares_away",
        ),
        "Huber delta so large the fit is plain least squares",
    ),
    Mutant(
        "preempted_run_exits_1",
        "sweep/run.py",
        "return EXIT_PREEMPTED",
        "return EXIT_FAILED",
        ("tests/test_cli_run_signals.py",),
        "`sweep run` exits 1 instead of 75 on preemption",
        after='writer.write("preempted", step, reason=str(stop))',
    ),
    # --- optimizer, schedule, clipping, metrics --------------------------------------
    Mutant(
        "adam_betas_swapped",
        "models/train.py",
        "betas=(cfg.beta1, cfg.beta2),",
        "betas=(cfg.beta2, cfg.beta1),",
        (ADAMW,),
        "AdamW betas in the wrong order",
    ),
    Mutant(
        "adam_eps_ignored",
        "models/train.py",
        "eps=cfg.eps,",
        "eps=1e-8,",
        (ADAMW,),
        "train.eps not passed to AdamW",
    ),
    Mutant(
        "weight_decay_ignored",
        "models/train.py",
        "weight_decay=cfg.weight_decay,",
        "weight_decay=0.0,",
        (ADAMW,),
        "train.weight_decay not passed to AdamW",
    ),
    Mutant(
        "clipping_off",
        "models/train.py",
        "max_norm = self.cfg.grad_clip if self.cfg.grad_clip > 0 else math.inf",
        "max_norm = math.inf",
        (ADAMW,),
        "gradients never clipped",
    ),
    Mutant(
        "schedule_linear_decay",
        "models/train.py",
        "cosine = 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))",
        "cosine = 1 - min(1.0, progress)",
        (LR,),
        "linear instead of cosine decay",
    ),
    Mutant(
        "warmup_from_zero",
        "models/train.py",
        "frac = cfg.warmup_init_frac + (1 - cfg.warmup_init_frac) * step / warmup",
        "frac = step / warmup",
        (LR,),
        "warmup starts at 0 instead of 0.1·lr",
    ),
    Mutant(
        "logged_lr_off_by_one",
        "models/train.py",
        'values.update({"train/loss": loss_value, "train/lr": lr_at(update - 1, cfg)})',
        'values.update({"train/loss": loss_value, "train/lr": lr_at(update, cfg)})',
        (LR,),
        "train/lr logs the next step's lr",
    ),
    Mutant(
        "default_beta2",
        "models/config.py",
        "beta2: float = 0.95",
        "beta2: float = 0.999",
        (f"{TRAIN}::test_paper_defaults_are_the_documented_ones",),
        "not the paper's beta2",
    ),
    Mutant(
        "metric_name_grad_norm",
        "models/train.py",
        'values.update({"optim/grad_norm": total_norm.item(), **self._stats(grad_norms)})',
        'values.update({"optim/gradnorm": total_norm.item(), **self._stats(grad_norms)})',
        (NAMES,),
        "a documented metric renamed",
    ),
    Mutant(
        "metric_name_clip",
        "models/train.py",
        'rates = {f"mx/clip/{k}": v for k, v in self.mx.clip_rates(self.model).items()}',
        'rates = {f"mx/clip_{k}": v for k, v in self.mx.clip_rates(self.model).items()}',
        (NAMES,),
        "the clip-rate metrics renamed",
    ),
    # --- files, exit codes, states -----------------------------------------------------
    Mutant(
        "atomic_write_in_place",
        "runfolder/atomic.py",
        "write(tmp)",
        "write(str(path))",
        ("tests/test_oracles_atomic.py",),
        "writes go straight into the target file",
    ),
    Mutant(
        "atomic_copy_instead_of_rename",
        "runfolder/atomic.py",
        "os.replace(tmp, path)",
        "Path(path).write_bytes(Path(tmp).read_bytes())",
        ("tests/test_oracles_atomic.py",),
        "the temp file is copied over the target, not renamed",
    ),
    Mutant(
        "bad_input_exits_1",
        "sweep/cli.py",
        "raise typer.Exit(2)",
        "raise typer.Exit(1)",
        (f"{CLI}::test_each_bad_grid_class_exits_2_and_launches_nothing",),
        "configuration errors exit 1",
    ),
    Mutant(
        "status_stale_never",
        "sweep/store.py",
        'fresh = now - marker.get("heartbeat", 0.0) < STALE_AFTER_S',
        "fresh = True",
        (STATUS,),
        "an old heartbeat never makes a run stale",
    ),
    Mutant(
        "status_requeued_preempted_not_queued",
        "sweep/store.py",
        'if state == "preempted" and scheduler in ("queued", "running"):',
        'if state == "preempted" and scheduler == "running":',
        (STATUS,),
        "a preempted run the scheduler requeued is not shown queued",
    ),
    Mutant(
        "status_ignores_newer_submission",
        "sweep/store.py",
        'newer_submission = submitted and submitted.get("attempt", 0) > marker_attempt',
        "newer_submission = False",
        (STATUS,),
        "a resubmitted run shows its previous attempt's state",
    ),
    Mutant(
        "cancelled_run_ends_preempted",
        "sweep/run.py",
        'writer.write("cancelled", step, reason="cancelled by `sweep cancel`")',
        'writer.write("preempted", step, reason=str(stop))',
        (f"{CLI}::test_cancel_stops_a_running_run_as_cancelled",),
        "a run stopped by `sweep cancel` records itself preempted (it would resume)",
    ),
)
