"""A tiny, unmodified-style Hugging Face Trainer script (integration tests and the demo).

Nothing here knows about devices or DDP: the launcher (torchrun) and the environment decide.
Hyperparameters arrive as ``--key value``; unknown ones are tolerated. Every rank writes
``rank-<RANK>.json`` into $SUMMARY_DIR or $SM_OUTPUT_DATA_DIR.

    python examples/hf_trainer_tiny.py --write-data DIR   # write DIR/data.jsonl and exit
"""

import argparse
import glob
import json
import os
import socket
import sys
import tempfile

import torch
import torch.distributed as dist
from transformers import AutoConfig, AutoModelForSequenceClassification, Trainer, TrainingArguments
from transformers import set_seed as hf_set_seed

VOCAB, SEQ_LEN, N_EXAMPLES = 64, 16, 512
A, B = 5, 6  # label = 1 when token A appears more often than token B
BERT_LIKE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
TINY = {  # small configs per model type: built from scratch, nothing is downloaded
    "bert": dict(BERT_LIKE, max_position_embeddings=32),
    "roberta": dict(BERT_LIKE, max_position_embeddings=34, pad_token_id=1),
    "distilbert": dict(dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32),
    "gpt2": dict(n_embd=32, n_layer=2, n_head=2, n_positions=32, pad_token_id=0),
}


def make_examples(n=N_EXAMPLES, seed=1234):
    """Deterministic rows: filler tokens 7..63 plus 0-7 copies each of A and B (never equal)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        n_a, n_b = torch.randperm(8, generator=g)[:2].tolist()
        ids = torch.randint(7, VOCAB, (SEQ_LEN,), generator=g)
        ids[torch.randperm(SEQ_LEN, generator=g)[: n_a + n_b]] = torch.tensor([A] * n_a + [B] * n_b)
        rows.append({"input_ids": ids.tolist(), "label": int(n_a > n_b), "id": i})
    return rows


def write_data(directory):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "data.jsonl")
    with open(path, "w") as handle:
        handle.writelines(json.dumps(row) + "\n" for row in make_examples())
    return path


def load_examples():
    """Rows from $SM_CHANNEL_TRAIN/*.jsonl (data.jsonl first) if any, else generated ones."""
    channel = os.environ.get("SM_CHANNEL_TRAIN")
    files = sorted(glob.glob(os.path.join(channel, "*.jsonl"))) if channel else []
    files.sort(key=lambda p: os.path.basename(p) != "data.jsonl")
    if not files:
        return make_examples(), "generated"
    rows = []
    for path in files:
        with open(path) as handle:
            rows += [json.loads(line) for line in handle if line.strip()]
    return rows, ",".join(files)


class JsonlDataset(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        row = self.rows[i]
        return {"input_ids": torch.tensor(row["input_ids"]), "labels": torch.tensor(row["label"])}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--learning-rate", "--learning_rate", type=float, default=5e-3)
    parser.add_argument(
        "--per-device-train-batch-size", "--per_device_train_batch_size", type=int, default=8
    )
    parser.add_argument("--model-type", "--model_type", default="bert", choices=sorted(TINY))
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--write-data", metavar="DIR", help="write DIR/data.jsonl and exit")
    args, unknown = parser.parse_known_args()
    if args.write_data:
        print(write_data(args.write_data))
        return
    if unknown:
        print(f"ignoring unknown arguments: {unknown}", file=sys.stderr)

    out_base = os.environ.get("SM_OUTPUT_DATA_DIR") or os.path.join(tempfile.gettempdir(), "tiny")
    training_args = TrainingArguments(
        output_dir=os.path.join(out_base, "trainer"),
        num_train_epochs=args.epochs,
        learning_rate=args.learning_rate,
        per_device_train_batch_size=args.per_device_train_batch_size,
        seed=args.seed,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        disable_tqdm=True,
    )
    hf_set_seed(args.seed)
    config = AutoConfig.for_model(
        args.model_type, vocab_size=VOCAB, num_labels=2, **TINY[args.model_type]
    )
    model = AutoModelForSequenceClassification.from_config(config)
    rows, source = load_examples()
    trainer = Trainer(model=model, args=training_args, train_dataset=JsonlDataset(rows))
    metrics = trainer.train().metrics
    trainer.save_model(os.environ.get("SM_MODEL_DIR", os.path.join(out_base, "model")))

    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    initialized = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if initialized else 0
    world_size = dist.get_world_size() if initialized else 1
    host = os.environ.get("CURRENT_HOST") or os.environ.get("SM_CURRENT_HOST")
    summary = {
        "rank": rank,
        "local_rank": int(os.environ.get("LOCAL_RANK", 0)),
        "world_size": world_size,
        "args_world_size": training_args.world_size,
        "args_process_index": training_args.process_index,
        "parallel_mode": str(training_args.parallel_mode),
        "device": str(training_args.device),
        "argv": sys.argv[1:],
        "data": source,
        "num_examples": len(rows),
        "steps": trainer.state.global_step,
        "train_runtime": metrics.get("train_runtime"),
        "train_steps_per_second": metrics.get("train_steps_per_second"),
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "host": host or socket.gethostname(),
    }
    summary_dir = os.environ.get("SUMMARY_DIR") or out_base
    os.makedirs(summary_dir, exist_ok=True)
    with open(os.path.join(summary_dir, f"rank-{rank}.json"), "w") as handle:
        json.dump(summary, handle, indent=1)
    first, last = (f"{losses[i]:.4f}" if losses else "n/a" for i in (0, -1))
    print(
        f"rank {rank}/{world_size} host {summary['host']} first_loss {first} last_loss {last}",
        flush=True,
    )


if __name__ == "__main__":
    main()
