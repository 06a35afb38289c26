"""How long `resmlp models` takes: the analytic counts it prints now against the measured counts it printed before
(every preset and Table 3 row built on the meta device and run under torch's FlopCounterMode), side by side.

Each round runs both in fresh interpreters, alternating, and times the whole command as a user waits for it
(interpreter start and imports included). Prints the medians and their ratio, and the host.

    python benchmarks/models_table.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANALYTIC = "from resmlp.cli import main; main(['models', '--format', 'json'])"
MEASURED = ("from resmlp.complexity import complexity\n"
            "from resmlp.models.registry import PRESETS, TABLE3_ROWS, model_config\n"
            "[complexity(model_config(n)) for n in PRESETS]\n"
            "[complexity(model_config(r.preset, **r.overrides)) for r in TABLE3_ROWS]\n")


def seconds(code: str) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, timeout=600,
                   env={"PYTHONPATH": str(ROOT / "src"), "PATH": "", "OMP_NUM_THREADS": "1"})
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    times: dict[str, list[float]] = {"analytic (now)": [], "measured (before)": []}
    for _ in range(args.rounds):
        times["analytic (now)"].append(seconds(ANALYTIC))
        times["measured (before)"].append(seconds(MEASURED))
    import torch

    medians = {k: statistics.median(v) for k, v in times.items()}
    for name, median in medians.items():
        print(f"{name}: median {median:.2f} s over {args.rounds} rounds ({', '.join(f'{t:.2f}' for t in times[name])})")
    print(f"ratio: {medians['measured (before)'] / medians['analytic (now)']:.1f}x faster; host "
          f"{torch.backends.cpu.get_cpu_capability()}, {sys.platform}")


if __name__ == "__main__":
    main()
