"""`make gpu-check`: the GPU paths of a run, checked once on one GPU (or small on CPU).

    python -m bench.gpu_check [--out DIR] [--device cuda|cpu] [--quick] [--batch N]

1. LM training steps (d_model 1024, seq 512) in bf16 and MXFP8 E4M3 under bf16 autocast:
   tokens/s, the MX/bf16 step-time ratio and peak memory.
2. The MX quantizer's GB/s on an 8192x8192 tensor against a device copy.
3. A short paired proxy run (width 512, batch 2048, 500 steps): both losses finite and the
   FP32 twin identical to a plain FP32 run.
4. A one-rank process group (NCCL on CUDA, gloo on CPU) through the multi-rank code path:
   one FSDP step with bf16 parameters, the same loss as without a group.
5. The short runs again: bit-identical metrics (promised on CPU, reported on GPU).

Prints a table and writes DIR/gpu_check.json; exits 1 when a required check fails.
``--device cpu --quick`` runs the same code small (CI runs it so the script cannot rot).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch
import torch.distributed as dist

import mx
from models.config import LMConfig, ProxyConfig, Resources, RunSpec, SyntheticData, TrainConfig
from models.distributed import backend
from models.runner import train_run
from models.train import Trainer
from mx import fast

E4M3 = mx.PrecisionSpec(w_fmt="fp8_e4m3", a_fmt="fp8_e4m3", elementwise="bf16", ln="bf16")
LM_PRECISIONS = {"bf16": mx.PrecisionSpec(), "mxfp8_e4m3": E4M3}


@dataclass(frozen=True)
class Sizes:
    """Problem sizes of one mode (full on a GPU, quick for CPU/CI)."""

    d_model: int
    seq_len: int
    vocab: int
    batch: int
    lm_steps: int
    quant_n: int
    proxy_width: int
    proxy_batch: int
    proxy_steps: int


FULL = Sizes(1024, 512, 32000, 32, 20, 8192, 512, 2048, 500)
QUICK = Sizes(64, 64, 256, 4, 4, 1024, 32, 64, 20)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def lm_spec(sizes: Sizes, precision: mx.PrecisionSpec, device: str, **resources) -> RunSpec:
    """An LM run of the check's size under bf16 autocast."""
    return RunSpec(
        model=LMConfig(d_model=sizes.d_model, vocab_size=sizes.vocab, seq_len=sizes.seq_len),
        data=SyntheticData(),
        precision=precision,
        train=TrainConfig(
            steps=sizes.lm_steps + 2, batch_size=sizes.batch, device=device, autocast="bf16"
        ),
        resources=Resources(**resources),
    )


def lm_steps(spec: RunSpec, steps: int, warmup: int) -> dict:
    """Time ``steps`` training steps after ``warmup``; losses, tokens/s and peak memory."""
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(spec, Path(run_dir), None)
        device = trainer.device
        losses = []
        for index in range(warmup + steps):
            if index == warmup:
                _sync(device)
                if device.type == "cuda":
                    torch.cuda.reset_peak_memory_stats(device)
                start = time.perf_counter()
            loss, _ = trainer.train_step(stats=False)
            trainer.step += 1
            losses.append(loss.item())
        _sync(device)
        step_s = (time.perf_counter() - start) / steps
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "step_s": step_s,
        "tokens_per_s": spec.tokens_per_step / step_s,
        "peak_mem_gib": peak,
        "losses": losses,
    }


def check_lm(sizes: Sizes, device: str) -> dict:
    """(1) bf16 vs MXFP8 E4M3 LM steps."""
    runs = {
        name: lm_steps(lm_spec(sizes, p, device), sizes.lm_steps, 2)
        for name, p in LM_PRECISIONS.items()
    }
    ratio = runs["mxfp8_e4m3"]["step_s"] / runs["bf16"]["step_s"]
    finite = all(math.isfinite(v) for run in runs.values() for v in run["losses"])
    return {"ok": finite, "runs": runs, "mx_over_bf16": ratio, "goal_ratio": 1.3}


def _rate(fn: Callable[[], object], nbytes: int, device: torch.device, repeats: int) -> float:
    fn()
    _sync(device)
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return nbytes * repeats / (time.perf_counter() - start) / 1e9


def check_quantizer(sizes: Sizes, device: torch.device) -> dict:
    """(2) quantizer GB/s (8 bytes moved per element) vs a plain device copy."""
    x = torch.randn(sizes.quant_n, sizes.quant_n, device=device)
    nbytes = 8 * x.numel()
    start = time.perf_counter()
    quantized = mx.quantize(x, "fp8_e4m3")
    _sync(device)
    first_s = time.perf_counter() - start
    mode = fast.get_mode()
    fast.set_mode("off")
    exact = torch.equal(quantized, mx.quantize(x, "fp8_e4m3"))
    fast.set_mode(mode)
    quant = _rate(lambda: mx.quantize(x, "fp8_e4m3"), nbytes, device, 5)
    copy = _rate(x.clone, nbytes, device, 5)
    return {
        "ok": exact,
        "gb_per_s": quant,
        "copy_gb_per_s": copy,
        "fraction_of_copy": quant / copy,
        "first_call_s": first_s,
        "bit_identical_to_eager": exact,
    }


def proxy_specs(sizes: Sizes, device: str) -> tuple[RunSpec, RunSpec]:
    """A paired MX E4M3 proxy run and the plain FP32 run its twin must equal."""
    model = ProxyConfig(width=sizes.proxy_width, depth=4, paired=True)
    train = TrainConfig(
        steps=sizes.proxy_steps,
        batch_size=sizes.proxy_batch,
        lr=6e-4,
        schedule="constant",
        warmup_frac=0,
        log_every=1,
        stats_every=max(1, sizes.proxy_steps // 5),
        eval_every=sizes.proxy_steps,
        device=device,
        autocast="bf16",
    )
    paired = RunSpec(model=model, train=train, precision=E4M3)
    plain = RunSpec(
        model=model.model_copy(update={"paired": False}),
        train=train.model_copy(update={"autocast": "none"}),
    )
    return paired, plain


def _metrics(run_dir: Path) -> dict[tuple[str, int], float]:
    table = pq.read_table(run_dir / "metrics").to_pandas()
    table["name"] = table["name"].astype(str)
    table = table[~table["name"].str.startswith("perf/")]
    return {
        (n, int(s)): float(v) for n, s, v in zip(table.name, table.step, table.value, strict=True)
    }


def _series(metrics: dict[tuple[str, int], float], name: str) -> list[float]:
    return [v for (n, _), v in sorted(metrics.items(), key=lambda kv: kv[0][1]) if n == name]


def check_proxy(sizes: Sizes, device: str, work: Path) -> dict:
    """(3) paired proxy: finite losses, twin == plain FP32 run bit for bit."""
    paired, plain = proxy_specs(sizes, device)
    start = time.perf_counter()
    train_run(paired, work / "paired")
    paired_s = time.perf_counter() - start
    train_run(plain, work / "plain")
    got, ref = _metrics(work / "paired"), _metrics(work / "plain")
    mx_loss, twin = _series(got, "train/loss"), _series(got, "paired/fp32_loss")
    finite = all(math.isfinite(v) for v in mx_loss + twin)
    same = twin == _series(ref, "train/loss")
    return {
        "ok": finite and same and len(twin) == sizes.proxy_steps,
        "losses_finite": finite,
        "twin_equals_fp32": same,
        "final_mx_loss": mx_loss[-1],
        "final_fp32_loss": twin[-1],
        "paired_run_s": paired_s,
    }


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_process_group(sizes: Sizes, device: str) -> dict:
    """(4) one FSDP step (bf16 params) in a one-rank process group vs no group."""
    small = Sizes(**{**sizes.__dict__, "d_model": min(sizes.d_model, 256), "lm_steps": 1})
    spec = lm_spec(small, E4M3, device, strategy="fsdp")
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"param_dtype": "bf16"})})
    alone = lm_steps(spec, 1, 0)["losses"]
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(0)
    dist.init_process_group(
        backend(cuda), init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
    )
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            trainer = Trainer(spec, Path(run_dir), None)
            sharded = type(trainer.main.net).__name__
            loss, _ = trainer.train_step(stats=False)
            grouped = loss.item()
    finally:
        dist.destroy_process_group()
    return {
        "ok": "FSDP" in sharded and grouped == alone[0],
        "backend": backend(cuda),
        "wrapper": sharded,
        "loss_in_group": grouped,
        "loss_alone": alone[0],
    }


def check_determinism(sizes: Sizes, device: str, work: Path, lm: dict) -> dict:
    """(5) the proxy run and the MX LM steps again, compared bit for bit."""
    paired, _ = proxy_specs(sizes, device)
    train_run(paired, work / "again")
    proxy_same = _metrics(work / "paired") == _metrics(work / "again")
    rerun = lm_steps(lm_spec(sizes, E4M3, device), sizes.lm_steps, 2)["losses"]
    lm_same = rerun == lm["runs"]["mxfp8_e4m3"]["losses"]
    promised = device == "cpu"
    return {
        "ok": (proxy_same and lm_same) or not promised,
        "promised": promised,
        "proxy_identical": proxy_same,
        "lm_identical": lm_same,
    }


def _table(report: dict) -> str:
    checks = report["checks"]
    lm, quant, proxy = checks["lm_steps"], checks["quantizer"], checks["paired_proxy"]
    group, again = checks["process_group"], checks["determinism"]
    rows = [("check", "result", "ok")]
    for name, run in lm["runs"].items():
        mem = "n/a" if run["peak_mem_gib"] is None else f"{run['peak_mem_gib']:.1f} GiB"
        rows.append((f"1 LM {name}", f"{run['tokens_per_s']:,.0f} tok/s, peak {mem}", ""))
    rows.append(("1 MX/bf16 step time", f"{lm['mx_over_bf16']:.2f}x (goal <= 1.3x)", lm["ok"]))
    rows.append(
        (
            "2 quantizer",
            f"{quant['gb_per_s']:.1f} GB/s = {quant['fraction_of_copy']:.0%} of copy",
            quant["ok"],
        )
    )
    rows.append(
        (
            "3 paired proxy",
            f"finite {proxy['losses_finite']}, twin == FP32 {proxy['twin_equals_fp32']}",
            proxy["ok"],
        )
    )
    rows.append(("4 1-rank group", f"{group['backend']} {group['wrapper']}", group["ok"]))
    rows.append(
        (
            "5 determinism",
            f"proxy {again['proxy_identical']}, LM {again['lm_identical']}"
            f" (promised: {again['promised']})",
            again["ok"],
        )
    )
    width = max(len(r[0]) for r in rows)
    body = max(len(str(r[1])) for r in rows)
    return "\n".join(f"{a:<{width}}  {b!s:<{body}}  {c}" for a, b, c in rows)


def main(argv: list[str] | None = None) -> int:
    """Run the five checks, print the table, write gpu_check.json; 0 when all pass."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("."))
    parser.add_argument("--device", choices=["cuda", "cpu"], default=None)
    parser.add_argument("--quick", action="store_true", help="small sizes (CPU, CI)")
    parser.add_argument("--batch", type=int, default=None, help="LM batch (sequences)")
    args = parser.parse_args(argv)
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: --device cuda but no CUDA device is available", file=sys.stderr)
        return 2
    sizes = QUICK if args.quick else FULL
    if args.batch:
        sizes = Sizes(**{**sizes.__dict__, "batch": args.batch})
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    fast.keep_freed_memory()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        lm = check_lm(sizes, device)
        checks = {
            "lm_steps": lm,
            "quantizer": check_quantizer(sizes, torch.device(device)),
            "paired_proxy": check_proxy(sizes, device, work),
            "process_group": check_process_group(sizes, device),
            "determinism": check_determinism(sizes, device, work, lm),
        }
    name = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    report = {
        "device": device,
        "device_name": name,
        "torch": torch.__version__,
        "quick": args.quick,
        "sizes": sizes.__dict__,
        "wall_s": time.perf_counter() - start,
        "ok": all(check["ok"] for check in checks.values()),
        "checks": checks,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_check.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"gpu_check on {name} ({'quick' if args.quick else 'full'}), {report['wall_s']:.0f} s")
    print(_table(report))
    print(f"{'all checks passed' if report['ok'] else 'SOME CHECKS FAILED'}; wrote {path}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
