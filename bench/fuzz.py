"""Fuzz every decoder of a peer's bytes, coverage-guided (atheris / libFuzzer), for a set time.

    python bench/fuzz.py --minutes 20 [--targets a,b] [--out DIR] [--timeout-s 10] [--rss-mb 2048]

The decoders are ``pulse_node/testing/fuzz_targets.py``'s registry; each starts from real samples
its encoder made (``testing/fuzz_samples.py``) and runs in a worker process of its own (this file
with ``--worker``), one after the other, each for an equal share of ``--minutes``. Every input
must end as a typed refusal (a ``PulseError``) or a decode: any other exception is a crash (kept
under ``OUT/crashes/<target>/``, once per place it comes from, to become a regression test in
``tests/fuzz_regressions/``); an input running past ``--timeout-s`` is a hang and one taking the
worker past ``--rss-mb`` of memory an out-of-memory (libFuzzer's own watchdogs; the worker is
restarted for the rest of its share). Prints per decoder the inputs tried, the coverage reached
(libFuzzer's ``cov``: code edges, ``ft``: features), crashes, hangs and peak memory; the last
line is JSON ``{"decoders", "inputs", "crashes", "hangs", "max_rss_mb", ...}``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: modules of numba-compiled kernels: instrumented bytecode would not compile (their work is
#: native code, bounded by the statuses they return, tests/test_codec_kernels.py)
JITTED = ["pulse_node.codec.kernels", "pulse_node.codec.rans", "pulse_node.codec.fused", "pulse_node.codec.entropy",
          "pulse_node.rl.tiled_head"]


def worker(target_name: str, out: Path, libfuzzer: list[str]) -> None:
    """Fuzz one target until libFuzzer stops (it exits the process)."""
    import logging

    try:
        import atheris
    except ImportError:
        raise SystemExit("bench/fuzz.py needs atheris (coverage-guided fuzzing): pip install atheris") from None

    logging.disable(logging.CRITICAL)  # convictions and refusals are not news here
    sys.path.insert(0, str(ROOT))
    with atheris.instrument_imports(include=["pulse_node"], exclude=JITTED):
        from pulse_node.testing.fuzz_targets import TARGETS, run_one

        target = TARGETS[target_name]
        seeds = target.seeds()
        for s in seeds:  # every module the decoder needs is imported (and instrumented) here
            run_one(target, s)
    crashes = out / "crashes" / target_name
    crashes.mkdir(parents=True, exist_ok=True)
    seen: set[str] = {p.stem for p in crashes.glob("*.txt")}

    def one_input(data: bytes) -> None:
        outcome = run_one(target, data)
        if outcome.kind != "crash":
            return
        sig = hashlib.sha1(outcome.signature.encode()).hexdigest()[:16]
        with open(crashes / "log", "a") as fh:
            fh.write(sig + "\n")
        if sig not in seen:
            seen.add(sig)
            (crashes / f"{sig}.bin").write_bytes(data)
            (crashes / f"{sig}.txt").write_text(outcome.detail)

    atheris.Setup([sys.argv[0], *libfuzzer], one_input)
    atheris.Fuzz()


STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.MULTILINE)
COV = re.compile(r"cov: (\d+) ft: (\d+)")


def run_target(name: str, seconds: float, out: Path, args: argparse.Namespace) -> dict:
    """Fuzz ``name`` for ``seconds`` in worker processes (restarted after a hang or OOM)."""
    from pulse_node.testing.fuzz_targets import TARGETS

    corpus, artifacts = out / "corpus" / name, out / "artifacts" / name
    for d in (corpus, artifacts):
        d.mkdir(parents=True, exist_ok=True)
    for seed in TARGETS[name].seeds():
        (corpus / hashlib.sha1(seed).hexdigest()).write_bytes(seed)
    row = {"target": name, "inputs": 0, "cov": 0, "ft": 0, "crashes": 0, "hangs": 0, "ooms": 0, "peak_rss_mb": 0,
           "slowest_s": 0, "runs": 0}
    end = time.monotonic() + seconds
    log = out / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    while (left := end - time.monotonic()) > 2 and row["runs"] < 20:
        flags = [f"-max_total_time={int(left)}", f"-timeout={args.timeout_s}", f"-rss_limit_mb={args.rss_mb}",
                 "-print_final_stats=1", f"-artifact_prefix={artifacts}/", str(corpus)]
        proc = subprocess.run([sys.executable, __file__, "--worker", name, "--out", str(out), "--", *flags],
                              capture_output=True, text=True, timeout=left + 300, cwd=ROOT)
        text = proc.stdout + proc.stderr
        with open(log, "a") as fh:
            fh.write(text)
        _tally(row, text)
        row["runs"] += 1
    crash_log = out / "crashes" / name / "log"
    row["crashes"] = len(crash_log.read_text().split()) if crash_log.exists() else 0
    row["crash_kinds"] = len(list((out / "crashes" / name).glob("*.bin")))
    return row


def _tally(row: dict, text: str) -> None:
    """Add one worker's libFuzzer output to ``row``."""
    stats = {k: int(v) for k, v in STAT.findall(text)}
    covs = COV.findall(text)
    if covs:
        row["cov"], row["ft"] = max(row["cov"], int(covs[-1][0])), max(row["ft"], int(covs[-1][1]))
    row["inputs"] += stats.get("number_of_executed_units", 0) or _units_before_death(text)
    row["peak_rss_mb"] = max(row["peak_rss_mb"], stats.get("peak_rss_mb", 0), *_rss_seen(text))
    row["slowest_s"] = max(row["slowest_s"], stats.get("slowest_unit_time_sec", 0))
    row["hangs"] += "libFuzzer: timeout" in text
    row["ooms"] += "libFuzzer: out-of-memory" in text


def _units_before_death(text: str) -> int:
    runs = re.findall(r"^#(\d+)", text, re.MULTILINE)
    return int(runs[-1]) if runs else 0


def _rss_seen(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"rss: (\d+)Mb", text)] or [0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=1.0)
    ap.add_argument("--targets", default="", help="comma-separated names (default: every registered decoder)")
    ap.add_argument("--out", default="", help="corpus, crashes and logs (default: a temporary directory)")
    ap.add_argument("--timeout-s", type=int, default=10, help="an input running longer is a hang")
    ap.add_argument("--rss-mb", type=int, default=2048, help="a worker growing past this is out of memory")
    ap.add_argument("--worker", default="", help=argparse.SUPPRESS)
    args, rest = ap.parse_known_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="pulse-fuzz-"))
    if args.worker:
        worker(args.worker, out, [a for a in rest if a != "--"])
        return
    if importlib.util.find_spec("atheris") is None:  # each worker would fail alone and the table read all 0
        raise SystemExit("bench/fuzz.py needs atheris (coverage-guided fuzzing): pip install atheris")
    sys.path.insert(0, str(ROOT))
    from pulse_node.testing.fuzz_targets import TARGETS

    names = [n for n in args.targets.split(",") if n] or list(TARGETS)
    share = args.minutes * 60 / len(names)
    print(f"{'decoder':<16} {'inputs':>9} {'cov':>6} {'ft':>6} {'crashes':>7} {'hangs':>5} {'ooms':>4} "
          f"{'rss MB':>6} {'slowest s':>9}", flush=True)
    rows, t0 = [], time.monotonic()
    for name in names:
        r = run_target(name, share, out, args)
        rows.append(r)
        print(f"{name:<16} {r['inputs']:>9} {r['cov']:>6} {r['ft']:>6} {r['crashes']:>7} {r['hangs']:>5} "
              f"{r['ooms']:>4} {r['peak_rss_mb']:>6} {r['slowest_s']:>9}", flush=True)
    print(f"out: {out}  ({time.monotonic() - t0:.0f} s; hang bound {args.timeout_s} s per input, "
          f"memory bound {args.rss_mb} MB per worker)")
    idle = [r["target"] for r in rows if not r["inputs"]]  # a worker that never ran is a failure, not a pass
    print(json.dumps({"decoders": len(rows), "inputs": sum(r["inputs"] for r in rows), "idle": idle,
                      "crashes": sum(r["crashes"] for r in rows), "hangs": sum(r["hangs"] for r in rows),
                      "ooms": sum(r["ooms"] for r in rows), "max_rss_mb": max(r["peak_rss_mb"] for r in rows),
                      "per_decoder": {r["target"]: {k: r[k] for k in ("inputs", "cov", "ft", "crashes", "hangs")}
                                      for r in rows}}))
    if idle or any(r["crashes"] or r["hangs"] or r["ooms"] for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
