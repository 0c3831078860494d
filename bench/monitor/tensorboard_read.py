#!/usr/bin/env python3
"""Reads the event files `strata train` writes for DeepSpeed's tensorboard monitor with TensorBoard's own
loader, and prints every scalar series it finds: the check that TensorBoard shows what Strata writes.

Optional: needs the `tensorboard` package (not a dependency of the build or the tests), e.g.
  python3 -m venv /tmp/tb && /tmp/tb/bin/pip install tensorboard
  /tmp/tb/bin/python3 bench/monitor/tensorboard_read.py OUTPUT_PATH/JOB_NAME [--expect-steps N]

Exit status 0 when every event file loads and, with --expect-steps N, Train/Samples/train_loss has N points
with increasing steps; 1 otherwise.
"""

import argparse
import sys

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("logdir", help="the job's folder: tensorboard.output_path/tensorboard.job_name")
    ap.add_argument("--expect-steps", type=int, default=0, help="train_loss points expected (0: any)")
    a = ap.parse_args()
    acc = EventAccumulator(a.logdir, size_guidance={"scalars": 0})  # 0: keep every point
    acc.Reload()
    tags = acc.Tags()["scalars"]
    if not tags:
        print(f"FAIL: no scalars in {a.logdir}")
        return 1
    for tag in sorted(tags):
        pts = acc.Scalars(tag)
        print(f"{tag}: {len(pts)} points, steps {[p.step for p in pts]}, values {[round(p.value, 6) for p in pts]}")
    if a.expect_steps:
        loss = acc.Scalars("Train/Samples/train_loss") if "Train/Samples/train_loss" in tags else []
        steps = [p.step for p in loss]
        if len(loss) != a.expect_steps or steps != sorted(steps):
            print(f"FAIL: Train/Samples/train_loss has steps {steps}, expected {a.expect_steps} increasing")
            return 1
    print(f"PASS: TensorBoard reads {len(tags)} scalar series from {a.logdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
