"""PyTorch's bf16 matrix products at the linear ops' shapes: the peer column of matmul_bench.

Run by `matmul_bench --torch PYTHON` (bench/model/matmul_bench.cpp) with the shapes it measures; prints one
JSON object: {"torch": version, "results": [{"fwd_s", "bwd_s"} per shape]}. For each shape (n, ic, oc):
forward out = x @ w.T; backward dx = dout @ w and dw = dout.T @ x in fp32 (as a bf16 product accumulated
into the fp32 gradient), each the best time of repeated runs after a warm-up.
"""

import argparse
import json
import time

import torch


def best_seconds(fn, min_time=0.2, min_reps=3):
    fn()
    best, spent, reps = float("inf"), 0.0, 0
    while reps < min_reps or spent < min_time:
        t0 = time.perf_counter()
        fn()
        dt = time.perf_counter() - t0
        best, spent, reps = min(best, dt), spent + dt, reps + 1
        if reps >= 200:
            break
    return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--shapes", required=True, help='JSON list of {"n", "ic", "oc"}')
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    results = []
    with torch.no_grad():
        for s in json.loads(args.shapes):
            n, ic, oc = s["n"], s["ic"], s["oc"]
            x = torch.randn(n, ic).to(torch.bfloat16)
            w = torch.randn(oc, ic).to(torch.bfloat16)
            dout = torch.randn(n, oc).to(torch.bfloat16)
            dw = torch.zeros(oc, ic, dtype=torch.float32)
            fwd = best_seconds(lambda: torch.matmul(x, w.t()))

            def bwd():
                torch.matmul(dout, w)
                dw.add_(torch.matmul(dout.t(), x))

            results.append({"fwd_s": fwd, "bwd_s": best_seconds(bwd)})
    print(json.dumps({"torch": torch.__version__, "results": results}))


if __name__ == "__main__":
    main()
