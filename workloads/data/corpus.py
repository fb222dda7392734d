"""The shipped training corpus: hand-written passages plus deterministic generated English.

``workloads/data/corpus.txt`` is produced by ``python -m workloads.data.corpus`` (seeded, so the file
is reproducible) and ships with the package; nothing is downloaded. :func:`load_corpus` reads it.
"""

from __future__ import annotations

import argparse
import random
from importlib import resources
from pathlib import Path

CORPUS_FILE = "corpus.txt"

PASSAGES = [
    "A tensor processing unit is a chip built to multiply matrices. Many chips joined by a fast "
    "interconnect form a slice, and a slice is scheduled as one unit: every host of it starts "
    "together, or none of them does.",
    "The river was low that summer. Children walked across the stones to the island, where the "
    "old boat lay on its side among the reeds, and nobody remembered who had left it there.",
    "To bake bread, mix flour, water, salt and a little yeast. Knead the dough until it is smooth, "
    "let it rise in a warm place for two hours, shape it, and bake it in a hot oven until the "
    "crust is brown and the loaf sounds hollow when you tap it.",
    "The train left the station at seven in the morning. By noon it had crossed the mountains, and "
    "the passengers watched the snow give way to green valleys and small villages of stone.",
    "A good experiment changes one thing at a time. Write down what you expect before you start, "
    "measure carefully, and believe the numbers more than your hopes.",
    "In the library the clocks were always wrong, but the readers did not mind. They came for the "
    "quiet, for the smell of paper, and for the long tables by the windows.",
    "When the storm arrived, the fishermen pulled their boats high onto the beach and waited in "
    "the harbor inn, telling stories about storms that had been worse.",
    "Learning a language takes patience. Read a little every day, listen to people speak, and do "
    "not be afraid of mistakes: every mistake is a lesson you will not need to learn again.",
]

SUBJECTS = [
    "the old teacher",
    "a young engineer",
    "my neighbor",
    "the small dog",
    "the captain",
    "a quiet student",
    "the baker",
    "our team",
    "the gardener",
    "a tired traveler",
    "the doctor",
    "the children",
    "the farmer",
    "a curious cat",
    "the musician",
    "the scientist",
    "my sister",
    "the pilot",
    "the mayor",
    "a stranger",
]
VERBS = [
    "found",
    "carried",
    "painted",
    "repaired",
    "watched",
    "opened",
    "cleaned",
    "measured",
    "described",
    "built",
    "forgot",
    "remembered",
    "borrowed",
    "sold",
    "studied",
    "followed",
    "wrote about",
    "looked for",
    "talked about",
    "planted",
]
OBJECTS = [
    "a red bicycle",
    "the wooden bridge",
    "an old map",
    "the broken clock",
    "a letter",
    "the garden wall",
    "a bowl of soup",
    "the new machine",
    "a heavy box",
    "the kitchen window",
    "a blue notebook",
    "the village square",
    "a basket of apples",
    "the tall tree",
    "a strange song",
    "the empty house",
    "a paper boat",
    "the long road",
    "the evening sky",
    "a small boat",
]
PLACES = [
    "near the river",
    "in the morning",
    "after the rain",
    "at the market",
    "behind the school",
    "before dinner",
    "on the hill",
    "in the city",
    "by the sea",
    "during the winter",
    "under the bridge",
    "at the station",
    "in the forest",
    "after midnight",
    "on a quiet street",
]
ADVERBS = ["slowly", "carefully", "happily", "quickly", "quietly", "again", "together", "alone"]
CONNECTIVES = ["and then", "but", "so", "because", "while", "although", "before", "after"]
FEELINGS = [
    "everyone was surprised",
    "nobody said a word",
    "the day felt longer",
    "it started to snow",
    "the lights went out",
    "the birds began to sing",
    "we laughed for a long time",
    "the work was finally done",
    "the town was quiet",
    "the wind grew colder",
]
QUESTIONS = [
    "Where did {s} go {p}?",
    "Why had {s} {v} {o}?",
    "Who {v} {o} {p}?",
    "Did {s} really see {o}?",
]


def _sentence(rng: random.Random) -> str:
    s, v, o, p = (
        rng.choice(SUBJECTS),
        rng.choice(VERBS),
        rng.choice(OBJECTS),
        rng.choice(PLACES),
    )
    form = rng.randrange(6)
    if form == 0:
        text = f"{s} {v} {o} {p}."
    elif form == 1:
        text = (
            f"{s} {rng.choice(ADVERBS)} {v} {o}, {rng.choice(CONNECTIVES)} {rng.choice(FEELINGS)}."
        )
    elif form == 2:
        text = f"{p.capitalize()}, {s} {v} {o}."
    elif form == 3:
        text = rng.choice(QUESTIONS).format(s=s, v=v, o=o, p=p)
    elif form == 4:
        count = rng.choice(["two", "three", "four", "five", "seven", "ten", "twelve"])
        text = f"{s} counted {count} birds {p} and wrote the number in a notebook."
    else:
        text = f"{rng.choice(FEELINGS)} when {s} {v} {o}."
    return text[0].upper() + text[1:]


def generate(size_bytes: int = 300_000, seed: int = 0) -> str:
    """Deterministic English text of about ``size_bytes`` bytes: passages between paragraphs."""
    rng = random.Random(seed)
    paragraphs: list[str] = []
    total = 0
    while total < size_bytes:
        if rng.random() < 0.15:
            paragraph = rng.choice(PASSAGES)
        else:
            paragraph = " ".join(_sentence(rng) for _ in range(rng.randint(3, 7)))
        paragraphs.append(paragraph)
        total += len(paragraph) + 2
    return "\n\n".join(paragraphs) + "\n"


def load_corpus() -> str:
    """The shipped corpus text (ASCII)."""
    return resources.files("workloads.data").joinpath(CORPUS_FILE).read_text(encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description="regenerate workloads/data/corpus.txt")
    parser.add_argument("--size", type=int, default=300_000, help="bytes (default 300000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).parent / CORPUS_FILE, help="output"
    )
    args = parser.parse_args()
    args.out.write_text(generate(args.size, args.seed), encoding="utf-8")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
