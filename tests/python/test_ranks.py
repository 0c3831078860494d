"""Two ranks under mpirun (docs/python.md, "Several ranks"): engine.print writes once, every rank knows
the world, the losses are those of one rank that sees the same samples per step (bit for bit, as
tests/ranks/engine_ranks_test.cpp checks for the C++ engine), checkpoints reshard, and DistributedSampler
shards."""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import strata_support as sup

STEPS = 4
SAMPLER_N = 11

RANK_SCRIPT = """
    import json, sys
    import strata

    config_path, tokens, out_dir = sys.argv[1:4]
    info = strata.init_distributed()
    engine, _, _, _ = strata.initialize(config_path, "tiny", seq_len={seq_len})
    loader = engine.token_loader(tokens)
    losses, norms = [], []
    for _ in range({steps}):
        for _ in range(engine.gradient_accumulation_steps()):
            loss = engine(next(loader))
            engine.backward(loss)
            engine.step()
        losses.append(engine.last_step.loss)
        norms.append(engine.last_step.grad_norm)
        engine.print("step", engine.global_steps, "loss", repr(engine.last_step.loss))
    engine.print(f"world {{engine.world_size}} printed by rank {{engine.rank}}")
    engine.save_checkpoint(f"{{out_dir}}/ckpt", client_state={{"world": engine.world_size}}, data_loader=loader)

    sampler = strata.DistributedSampler({sampler_n}, seed=5)
    epochs = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        epochs.append(list(sampler))
    with open(f"{{out_dir}}/rank{{engine.rank}}.json", "w") as f:
        json.dump({{"info": [info.rank, info.world_size, info.local_rank, info.local_size, info.launched],
                   "rank": engine.rank, "world_size": engine.world_size,
                   "local_rank": engine.local_rank, "is_main_process": engine.is_main_process,
                   "train_batch_size": engine.train_batch_size(), "losses": losses, "norms": norms,
                   "sampler_len": len(sampler), "sampler_epochs": epochs, "out_dir": out_dir}}, f)
"""


def micro_one(accumulation):
    """The demo config at micro-batch 1 and the given accumulation (train_batch_size inferred), one compute
    thread per process: the 2-rank job and the 1-rank reference then differ in the rank count alone (by
    default each of 2 ranks would get half the cores the reference gets)."""
    cfg = sup.accumulating(sup.demo_config(), accumulation)
    cfg["train_micro_batch_size_per_gpu"] = 1
    cfg["strata"]["threads"] = 1
    return cfg


@pytest.fixture(scope="module")
def two_ranks(token_file, tmp_path_factory):
    """One `mpirun -np 2` run of RANK_SCRIPT (micro-batch 1, accumulation 1, so train_batch_size 2):
    its stdout and each rank's record."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not on PATH (Open MPI runs the 2-rank tests)")
    work = tmp_path_factory.mktemp("ranks")
    (work / "ds_config.json").write_text(json.dumps(micro_one(1)))
    script = work / "train.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT.format(seq_len=sup.SEQ_LEN, steps=STEPS,
                                                         sampler_n=SAMPLER_N)))
    env = sup.child_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "--oversubscribe", "-np", "2", sys.executable, str(script), str(work / "ds_config.json"),
           str(token_file), str(work)]
    p = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    records = [json.loads((work / f"rank{r}.json").read_text()) for r in range(2)]
    return p.stdout, records


def test_engine_print_writes_once(two_ranks):
    """Every engine.print line appears exactly once in the job's output, and rank 0 printed it."""
    stdout, _ = two_ranks
    lines = stdout.splitlines()
    for step in range(1, STEPS + 1):
        assert sum(line.startswith(f"step {step} loss ") for line in lines) == 1, stdout
    assert lines.count("world 2 printed by rank 0") == 1, stdout
    assert "printed by rank 1" not in stdout


def test_each_rank_knows_its_place(two_ranks):
    """rank, world_size, local_rank, is_main_process and init_distributed()'s DistInfo on each rank."""
    _, records = two_ranks
    for r, rec in enumerate(records):
        assert (rec["rank"], rec["world_size"], rec["local_rank"]) == (r, 2, r)
        assert rec["is_main_process"] == (r == 0)
        assert rec["info"] == [r, 2, r, 2, True]  # rank, world_size, local_rank, local_size, launched


def test_train_batch_size_counts_every_ranks_samples(two_ranks):
    """train_batch_size() is micro-batch 1 x accumulation 1 x 2 ranks."""
    _, records = two_ranks
    assert [rec["train_batch_size"] for rec in records] == [2, 2]


def test_every_rank_reports_the_steps_loss_over_all_ranks(two_ranks, token_file):
    """last_step.loss and grad_norm on each rank are those of the whole step (the mean over both ranks'
    samples): the one rank that sees the same samples per step reports them, bit for bit."""
    _, records = two_ranks
    one = sup.train_python(micro_one(2), token_file, STEPS)
    for rec in records:
        assert rec["losses"] == sup.field(one, "loss")
        assert rec["norms"] == sup.field(one, "grad_norm")


def test_printed_losses_are_the_steps(two_ranks):
    """The printed repr of each step's loss is rank 0's last_step.loss."""
    stdout, records = two_ranks
    printed = [line.split(" loss ")[1] for line in stdout.splitlines() if line.startswith("step ")]
    assert printed == [repr(x) for x in records[0]["losses"]]


def test_two_ranks_train_as_one_rank_with_the_same_samples(two_ranks, token_file):
    """2 ranks x micro-batch 1 give the losses and norms of 1 rank x micro-batch 1 x accumulation 2,
    bit for bit (the ranks' shares interleave into the one rank's order)."""
    _, records = two_ranks
    one = sup.train_python(micro_one(2), token_file, STEPS)
    assert records[0]["losses"] == sup.field(one, "loss")
    assert records[0]["norms"] == sup.field(one, "grad_norm")


def test_one_rank_resumes_the_two_ranks_checkpoint(two_ranks, token_file):
    """The 2 ranks' save_checkpoint (collective, with the loader), loaded by 1 rank at accumulation 2 with
    its loader: the next steps are those of the 1-rank run that never stopped (resharded state, and the
    data position carried across the rank count)."""
    _, records = two_ranks
    ckpt = records[0]["out_dir"] + "/ckpt"
    reference = sup.train_python(micro_one(2), token_file, STEPS + 2)
    engine = sup.new_engine(micro_one(2))
    loader = engine.token_loader(str(token_file))
    _, client_state = engine.load_checkpoint(ckpt, data_loader=loader)
    assert client_state == {"world": 2}
    assert sup.run_steps(engine, loader, 2) == reference[STEPS:]


def test_sampler_shares_cover_the_dataset(two_ranks):
    """DistributedSampler(11) under 2 ranks: 6 indices each (ceil(11 / 2)), together all of range(11)."""
    _, records = two_ranks
    assert [rec["sampler_len"] for rec in records] == [6, 6]
    for epoch in range(2):
        a, b = (rec["sampler_epochs"][epoch] for rec in records)
        assert len(a) == len(b) == 6
        assert set(a) | set(b) == set(range(SAMPLER_N))


def test_sampler_shares_are_the_single_process_ones(two_ranks):
    """num_replicas and rank default to the launcher's: rank r's indices == DistributedSampler(11,
    num_replicas=2, rank=r) in one process."""
    import strata

    _, records = two_ranks
    for r, rec in enumerate(records):
        s = strata.DistributedSampler(SAMPLER_N, num_replicas=2, rank=r, seed=5)
        assert rec["sampler_epochs"][0] == list(s)


def test_sampler_set_epoch_changes_the_order_on_every_rank(two_ranks):
    """Epoch 1's order differs from epoch 0's."""
    _, records = two_ranks
    for rec in records:
        assert rec["sampler_epochs"][0] != rec["sampler_epochs"][1]


BAD_BATCH_SCRIPT = """
    import json, sys, time
    import numpy as np
    import strata

    config_path, tokens, out_dir, mode = sys.argv[1:5]
    engine, _, _, _ = strata.initialize(config_path, "tiny", seq_len={seq_len})
    batch = np.asarray(next(engine.token_loader(tokens)))
    if engine.rank == 1:
        if mode == "batch":
            batch = batch[:, :1]  # one token a row: refused by the batch checks
        elif mode == "call":
            engine._core.backward()  # no forward: refused inside a call the others make together
        else:
            raise KeyError("rank 1 stops on purpose")  # the script's own error, uncaught
    t0 = time.monotonic()
    try:
        loss = engine(batch)
        engine.backward(loss)
        engine.step()
        outcome = "trained"
    except ValueError as e:
        outcome = "ValueError: " + str(e)
    with open(f"{{out_dir}}/rank{{engine.rank}}.json", "w") as f:
        json.dump({{"outcome": outcome, "seconds": time.monotonic() - t0}}, f)
"""


def run_bad_batch(token_file, tmp_path, mode):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not on PATH (Open MPI runs the 2-rank tests)")
    (tmp_path / "ds_config.json").write_text(json.dumps(micro_one(1)))
    script = tmp_path / "bad.py"
    script.write_text(textwrap.dedent(BAD_BATCH_SCRIPT.format(seq_len=sup.SEQ_LEN)))
    env = sup.child_env(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [mpirun, "--oversubscribe", "-np", "2", sys.executable, str(script), str(tmp_path / "ds_config.json"),
           str(token_file), str(tmp_path), mode]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)


def test_a_batch_refused_on_one_rank_raises_on_every_rank(token_file, tmp_path):
    """Note [Errors at several ranks]: rank 1's batch is refused; rank 1 raises its reason and rank 0
    raises too, instead of waiting in the forward's collectives for ever; the job ends normally."""
    p = run_bad_batch(token_file, tmp_path, "batch")
    assert p.returncode == 0, f"exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r1["outcome"].startswith("ValueError: engine(input_ids, labels): input_ids rows hold 1 token")
    assert r0["outcome"].startswith("ValueError: engine(input_ids, labels): the batch of another rank")
    assert r0["seconds"] < 30


@pytest.mark.parametrize("mode, message", [
    ("call", "strata: error on rank 1 of 2 in engine.backward(loss)"),
    ("python", "KeyError: 'rank 1 stops on purpose'"),
])
def test_an_error_on_one_rank_ends_the_job(token_file, tmp_path, mode, message):
    """An error on one rank inside a call the ranks make together, or an exception the script leaves
    uncaught, ends the whole job within seconds (the 60 s limit of run_bad_batch), its message printed,
    rather than leaving rank 0 in a collective."""
    p = run_bad_batch(token_file, tmp_path, mode)
    assert p.returncode != 0
    assert message in p.stderr + p.stdout
    assert not (tmp_path / "rank0.json").exists() or "trained" not in (tmp_path / "rank0.json").read_text()
