"""Write a tiny causal LM, its tokenizer and a text corpus for examples/hf_clm_style.py, offline.

    python3 examples/make_tiny_lm.py OUT     # -> OUT/train/train.txt, OUT/model/

- OUT/train/train.txt: deterministic lines of words that follow a fixed cycle (each line starts
  at a pseudo-random place in the cycle), so the next word is predictable from the previous one
  except at a line break: a 2-layer model's loss falls from ~ln(vocab) well below 1 in a few
  dozen steps.
- OUT/model/: a word-level `tokenizers` tokenizer trained on that text, saved as a
  PreTrainedTokenizerFast (tokenizer.json, tokenizer_config.json), and a 2-layer, 32-wide GPT-2
  built from a config (config.json, model.safetensors). Nothing is downloaded.

Run it with the same transformers as the job (the image's python) so the saved files match.
"""

import argparse
import os
import random

from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import AutoModelForCausalLM, GPT2Config, PreTrainedTokenizerFast, set_seed

CYCLE = (  # a 24-word cycle: each word is followed by the next one
    *("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india"),
    *("juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo"),
    *("sierra", "tango", "uniform", "victor", "whiskey", "xray"),
)
EOS, UNK = "<|endoftext|>", "<unk>"
N_POSITIONS = 64


def corpus(lines: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        start = rng.randrange(len(CYCLE))
        out.append(" ".join(CYCLE[(start + k) % len(CYCLE)] for k in range(words)))
    return out


def build_tokenizer(text: list[str]) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.WordLevel(unk_token=UNK))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.train_from_iterator(text, trainers.WordLevelTrainer(special_tokens=[EOS, UNK]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=EOS,
        eos_token=EOS,
        unk_token=UNK,
        pad_token=EOS,
        model_max_length=N_POSITIONS,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="directory for train/train.txt and model/")
    parser.add_argument("--lines", type=int, default=800)
    parser.add_argument("--words-per-line", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    text = corpus(args.lines, args.words_per_line, args.seed)
    train_dir = os.path.join(args.out, "train")
    model_dir = os.path.join(args.out, "model")
    os.makedirs(train_dir, exist_ok=True)
    with open(os.path.join(train_dir, "train.txt"), "w") as handle:
        handle.writelines(line + "\n" for line in text)

    tokenizer = build_tokenizer(text)
    set_seed(args.seed)
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=N_POSITIONS,
        n_embd=32,
        n_layer=2,
        n_head=2,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    print(f"wrote {len(text)} lines to {train_dir}; {sorted(os.listdir(model_dir))} to {model_dir}")


if __name__ == "__main__":
    main()
