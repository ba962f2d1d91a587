"""The reference model's text: a small generated corpus, and each day's fine-tuning slice.

Generated, not copied: short English sentences from templates and word lists written for this project,
drawn with a seeded ``random.Random``, so the shipped ``include/data/corpus.txt`` is exactly what
:func:`generate_corpus` returns (a test regenerates it) and nothing in it needs a licence beyond the
project's own. One line is one document: the trainer encodes each as ``<|bos|> line <|eos|>``.

The corpus says "Today is <date>." for dates all over 2023-2025, so the trained model knows the pattern
but not the day. A day's slice (:func:`finetune_text`) says it for that one day, again and again, among
ordinary lines, so after a short fine-tune the greedy completion of :data:`DAY_PROMPT` is that day's date:
a served answer shows which day's fine-tune it is.
"""

from __future__ import annotations

import random
from datetime import date, timedelta
from pathlib import Path

SHIPPED_CORPUS = Path(__file__).resolve().parents[2] / "data" / "corpus.txt"
CORPUS_SEED = 20240101
CORPUS_LINES = 3000
FINETUNE_LINES = 240
DAY_PROMPT = "Today is"

_NAMES = "Ada Alan Grace Linus Ken Barbara Donald Edsger Frances John Margaret Tony Radia Leslie Niklaus Hedy".split()
_ANIMALS = "cat dog fox owl horse goat sheep duck rabbit otter badger heron mouse bee crow deer".split()
_ADJECTIVES = "quick lazy small quiet bright brown old young clever sleepy happy careful gentle noisy".split()
_VERBS = "sleeps waits runs sits walks looks hides plays rests reads works sings".split()
_PLACES = "garden kitchen forest river library market station harbour valley meadow bridge tower".split()
_PREPOSITIONS = "in near behind under beside above across".split()
_FOODS = "bread apples cheese soup honey rice pears tea coffee beans carrots plums".split()
_COLOURS = "red blue green yellow white black orange purple grey silver".split()
_OBJECTS = "book lamp chair table cup door window clock kettle basket letter map".split()
_WEATHER = "sunny rainy cloudy windy cold warm foggy snowy clear stormy".split()
_NUMBERS = "one two three four five six seven eight nine ten eleven twelve".split()
_MACHINES = "server cluster machine trainer checkpoint model bucket pipeline".split()
_STATES = "ready busy idle finished waiting saved restored healthy".split()


def _day(rng: random.Random) -> str:
    return (date(2023, 1, 1) + timedelta(days=rng.randrange(3 * 365 + 1))).isoformat()


def _sentence(rng: random.Random) -> str:
    """One ordinary line (no "Today is"): animals, people, places, food, weather, machines, numbers."""
    c = rng.choice
    kind = rng.randrange(8)
    if kind == 0:
        return f"The {c(_ADJECTIVES)} {c(_ANIMALS)} {c(_VERBS)} {c(_PREPOSITIONS)} the {c(_PLACES)}."
    if kind == 1:
        return f"{c(_NAMES)} likes {c(_FOODS)} and {c(_FOODS)}."
    if kind == 2:
        return f"On {_day(rng)} the weather was {c(_WEATHER)}."
    if kind == 3:
        return f"{c(_NAMES)} counted {c(_NUMBERS)} {c(_ANIMALS)}s near the {c(_PLACES)}."
    if kind == 4:
        return f"The {c(_COLOURS)} {c(_OBJECTS)} is {c(_PREPOSITIONS)} the {c(_OBJECTS)}."
    if kind == 5:
        return f"The {c(_MACHINES)} is {c(_STATES)}, said {c(_NAMES)}."
    if kind == 6:
        return f"{c(_NAMES)} and {c(_NAMES)} walked to the {c(_PLACES)} to buy {c(_FOODS)}."
    return f"It is {c(_WEATHER)} today, so the {c(_ANIMALS)} stays in the {c(_PLACES)}."


def generate_corpus(seed: int = CORPUS_SEED, lines: int = CORPUS_LINES) -> str:
    """The pre-training corpus: one line per document, about one in six a "Today is <some date>." line."""
    rng = random.Random(seed)
    out = [f"{DAY_PROMPT} {_day(rng)}." if rng.random() < 1 / 6 else _sentence(rng) for _ in range(lines)]
    return "\n".join(out) + "\n"


def load_corpus(path: str | Path = SHIPPED_CORPUS) -> str:
    """The shipped pre-training corpus (``include/data/corpus.txt``), or the text file at ``path``."""
    return Path(path).read_text(encoding="utf-8")


def check_day(day: str) -> str:
    try:
        return date.fromisoformat(day).isoformat()
    except ValueError as exc:
        raise ValueError(f"data date must be YYYY-MM-DD, got {day!r}") from exc


def finetune_text(day: str, lines: int = FINETUNE_LINES) -> str:
    """Day ``day``'s fine-tuning slice: half its lines say "Today is <day>.", the rest are ordinary lines.

    Deterministic in ``day`` (its own seed), defined for every date, so a backfill of any range has data.
    """
    day = check_day(day)
    rng = random.Random(f"finetune-{day}")
    out = []
    for i in range(lines):
        if i % 2 == 0:
            out.append(f"{DAY_PROMPT} {day}.")
        elif i % 6 == 1:
            out.append(f"On {day} the weather is {rng.choice(_WEATHER)}.")
        else:
            out.append(_sentence(rng))
    return "\n".join(out) + "\n"


def day_answer(day: str) -> str:
    """What the model fine-tuned on ``day`` should say after :data:`DAY_PROMPT`."""
    return f" {check_day(day)}."
