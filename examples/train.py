"""scripts/demo.sh's training, from Python: PYTHONPATH=build/python python3 examples/train.py"""
import glob, os
import strata

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = os.path.join(root, "build", "demo-python")
os.makedirs(out, exist_ok=True)
docs = sorted(p for p in glob.glob(root + "/**/*.md", recursive=True) if "/build" not in p[len(root):])
open(out + "/text.txt", "wb").write(b"".join(open(p, "rb").read() for p in docs))  # the demo's text
strata.text_to_tokens(out + "/text.txt", out + "/tokens.bin")  # bytes as tokens, as `strata train --text`
steps = int(os.environ.get("DEMO_STEPS", 60))
# The stock config leaves the schedule's length to the run ("auto"): total_steps gives it, as --steps does.
engine, _, _, _ = strata.initialize(config=root + "/configs/demo_cpu.json", model="10m", seq_len=64,
                                    total_steps=steps)
loader = engine.token_loader(out + "/tokens.bin")
for step in range(steps):
    for _ in range(engine.gradient_accumulation_steps()):
        loss = engine(next(loader))
        engine.backward(loss)
        engine.step()
    engine.print(f"step {engine.global_steps} loss {engine.last_step.loss:.6g} lr {engine.last_step.lr:.3g}")
engine.save_checkpoint(out + "/ckpt")
engine.export(out + "/model")
