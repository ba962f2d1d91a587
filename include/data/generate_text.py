"""Generate the language model's shipped text files (run once; the outputs are committed).

    python include/data/generate_text.py        # rewrites corpus.txt and tokenizer/ next to it

corpus.txt: the pre-training corpus of :func:`interlude_workload.llm.corpus.generate_corpus`.
tokenizer/tokenizer.json, tokenizer/tokenizer_config.json: the byte-level BPE (512 ids) trained on it by
:func:`interlude_workload.llm.tokenizer.tokenizer_files`. Both are deterministic: a test regenerates them
and compares bytes with what is shipped. Each day's fine-tuning slice is not a file: it is a function of
the date (``finetune_text``), defined for every day.
"""

from __future__ import annotations

from pathlib import Path

from interlude_workload.llm.corpus import generate_corpus
from interlude_workload.llm.tokenizer import tokenizer_files

HERE = Path(__file__).resolve().parent
CORPUS_FILE = "corpus.txt"


def generated_files() -> dict[str, str]:
    """Every generated file, by its path relative to ``include/data/``."""
    corpus = generate_corpus()
    return {CORPUS_FILE: corpus, **{f"tokenizer/{name}": text for name, text in tokenizer_files(corpus).items()}}


def main() -> None:
    for rel, text in generated_files().items():
        path = HERE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {path} ({len(text.encode())} bytes)")


if __name__ == "__main__":
    main()
