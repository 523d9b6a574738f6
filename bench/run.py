"""Run every bench/bench_*.py and print its figures as each ends; exit 2 if any bench failed (a
wait past its deadline, a crash; the others still run), else 1 if any target is missed.

Figures are wall-clock on a shared 2-core machine: read them with that noise in mind.
NEURON_BENCH_SMALL=1 runs every bench at a reduced size (tests/test_bench.py): the figures then
mean nothing, only that each bench runs to its end.
"""

from __future__ import annotations

import importlib
import signal
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))  # the protocol stand-ins

import scratch
from common import BenchError, print_figures


def _stop(signum: int, _frame: object) -> None:
    # SIGTERM would end the process without running the benches' `finally`: the services and
    # stand-ins a bench started would live on (one such device plugin failed a later cluster-down)
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    scratch.use_for_temporaries()
    signal.signal(signal.SIGTERM, _stop)
    wanted = set(argv)
    missed: list[str] = []
    failed: list[str] = []
    start = time.monotonic()
    for path in sorted(Path(__file__).parent.glob("bench_*.py")):
        if wanted and path.stem.removeprefix("bench_") not in wanted:
            continue
        began = time.monotonic()
        module = importlib.import_module(path.stem)
        print(f"\n-- {path.stem}: running", flush=True)
        try:
            figures = module.run()
        except BenchError as e:
            print(f"\n== {module.TITLE}\n  FAILED: {e}", flush=True)
            failed.append(f"{module.TITLE}: {e}")
            continue
        except (KeyboardInterrupt, SystemExit):
            raise
        # one bench's crash must not hide the others' figures; BaseException because the test helpers the
        # benches share (the chart's render) fail with pytest.fail, which is no Exception
        except BaseException as e:
            traceback.print_exc()
            print(f"\n== {module.TITLE}\n  FAILED: {type(e).__name__}: {e}", flush=True)
            failed.append(f"{module.TITLE}: {type(e).__name__}: {e}")
            continue
        print_figures(module.TITLE, figures)
        print(f"  ({path.stem} took {time.monotonic() - began:.0f} s)", flush=True)
        missed += [f"{module.TITLE}: {f.name}" for f in figures if f.met is False]
    print(f"\ntotal time {time.monotonic() - start:.0f} s")
    if failed:
        print("\nbenches failed:\n  " + "\n  ".join(failed))
    if missed:
        print("\ntargets missed:\n  " + "\n  ".join(missed))
    if failed:
        return 2
    if missed:
        return 1
    print("\nall targets met")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
