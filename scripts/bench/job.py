"""The user script of `make bench` (scripts/bench): one job, run unchanged under every launcher.

Its very first statement prints `BENCH first t=<epoch>`, so the benchmark can measure
container start -> first line of the user's script without trusting any launcher's logs.

Then, in this order:
  1. --train-steps N > 0: a tiny BERT under the HF Trainer (DDP when the launcher starts more
     than one rank), printing `BENCH tick rank=R seq=N t=<epoch>` at each step end; rank 0
     writes bench-train.json with steps/s from step --warmup to the last step.
  2. an all_reduce tick every --tick-seconds (--ticks of them; 0: until stopped), each printed
     the same way (print -> stdout latency). --fail-host algo-N: that host's last local rank
     (--fail-local-rank) writes bench-fail.json (the time) and raises at tick --fail-tick.
With --ticks N > 0 the script ends after its ticks; its last statement writes
bench-end-rank-R.json (the time). SIGTERM at any point: the rank writes bench-term-rank-R.json
(the time it got the signal) and exits 143.

Results go to $BENCH_OUT, else $SM_OUTPUT_DATA_DIR, else /opt/ml/output/data.
"""

import time

FIRST = time.time()
print(f"BENCH first t={FIRST:.6f}", flush=True)

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402

OUT = os.environ.get("BENCH_OUT") or os.environ.get("SM_OUTPUT_DATA_DIR") or "/opt/ml/output/data"


def _current_host():
    """The SageMaker host name (algo-N) from resourceconfig.json: every launcher sees it."""
    try:
        with open("/opt/ml/input/config/resourceconfig.json") as handle:
            return json.load(handle)["current_host"]
    except (OSError, ValueError, KeyError):
        return os.environ.get("HOSTNAME", "localhost")


HOST = _current_host()


def write(name, data):
    os.makedirs(OUT, exist_ok=True)
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(data, handle)
    os.replace(path + ".tmp", path)


def dataset(n, seq_len, vocab):
    """`n` rows of random token ids (seed 0), labelled by their first token."""
    import torch

    class Data(torch.utils.data.Dataset):
        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.ids = torch.randint(0, vocab, (n, seq_len), generator=g)
            self.labels = (self.ids[:, 0] > vocab // 2).long()

        def __len__(self):
            return len(self.ids)

        def __getitem__(self, i):
            return {"input_ids": self.ids[i], "labels": self.labels[i]}

    return Data()


def clock(rank):
    """A Trainer callback that prints `BENCH tick` at each step end and keeps the times."""
    from transformers import TrainerCallback

    class Clock(TrainerCallback):
        def __init__(self):
            self.times = {}

        def on_step_end(self, _args, state, _control, **_kwargs):
            now = time.time()
            self.times[state.global_step] = now
            print(f"BENCH tick rank={rank} seq={state.global_step - 1} t={now:.6f}", flush=True)

    return Clock()


def trainer(args, rank):
    """A tiny BERT under the HF Trainer (DDP when the launcher started more than one rank),
    and its clock."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

    config = BertConfig(
        vocab_size=512,
        hidden_size=args.hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=64,
        num_labels=2,
    )
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    training_args = TrainingArguments(
        output_dir=os.path.join("/tmp", "bench-trainer"),
        max_steps=args.train_steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3,
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )
    timer = clock(rank)
    data = dataset(args.batch_size * args.train_steps * 8, 32, 512)
    return Trainer(model=model, args=training_args, train_dataset=data, callbacks=[timer]), timer


def train(args, rank):
    """Train; one `BENCH tick` line per step; rank 0 writes steps/s to bench-train.json.
    Returns the last step (the ticks that follow go on from it)."""
    hf_trainer, timer = trainer(args, rank)
    hf_trainer.train()
    training_args = hf_trainer.args
    last = max(timer.times)
    first = min(args.warmup, last - 1)
    rate = (last - first) / (timer.times[last] - timer.times[first])
    if training_args.process_index == 0:
        write(
            "bench-train.json",
            {
                "steps_per_second": rate,
                "steps": last - first,
                "world_size": training_args.world_size,
                "parallel_mode": str(training_args.parallel_mode),
            },
        )
    print(
        f"BENCH trained rank={rank} world={training_args.world_size} {rate:.2f} steps/s "
        f"({training_args.parallel_mode})",
        flush=True,
    )
    return last


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-steps", type=int, default=0, help="HF Trainer steps first")
    parser.add_argument("--warmup", type=int, default=10, help="steps/s counted from this step")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--ticks", type=int, default=0, help="then all_reduce ticks; 0: forever")
    parser.add_argument("--tick-seconds", type=float, default=0.25)
    parser.add_argument("--fail-host", default="", help="a rank on this host (algo-N) fails")
    parser.add_argument("--fail-local-rank", type=int, default=-1, help="which one (-1: last)")
    parser.add_argument("--fail-tick", type=int, default=4)
    args, unknown = parser.parse_known_args()
    if unknown:
        print(f"ignoring unknown arguments: {unknown}", file=sys.stderr)

    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))

    def on_term(signum, _frame):
        write(f"bench-term-rank-{rank}.json", {"rank": rank, "t": time.time()})
        os._exit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    seq = train(args, rank) if args.train_steps > 0 else 0

    import torch
    import torch.distributed as dist

    if not dist.is_initialized():  # the Trainer (Accelerate) may have made the group already
        dist.init_process_group("gloo")
    world = dist.get_world_size()
    print(f"BENCH ready rank={rank} world={world} host={HOST} t={time.time():.6f}", flush=True)
    fails = args.fail_host == HOST and local_rank == args.fail_local_rank % local_world
    ticks = 0
    while args.ticks <= 0 or ticks < args.ticks:
        if fails and ticks == args.fail_tick:
            write("bench-fail.json", {"rank": rank, "t": time.time()})
            raise RuntimeError(f"benchmark: planted failure on rank {rank} at tick {ticks}")
        dist.all_reduce(torch.ones(1))
        print(f"BENCH tick rank={rank} seq={seq} t={time.time():.6f}", flush=True)
        seq += 1
        ticks += 1
        deadline = time.time() + args.tick_seconds
        while time.time() < deadline:  # short sleeps: a signal handler runs promptly
            time.sleep(0.02)
    dist.destroy_process_group()
    write(f"bench-end-rank-{rank}.json", {"rank": rank, "t": time.time()})  # its last statement


if __name__ == "__main__":
    main()
