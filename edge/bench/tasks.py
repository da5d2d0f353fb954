"""Task workloads for `edge bench http --workload`: requests whose answers repeat their prompt.

Speculative decoding by prompt lookup pays where the output copies the input: a summary
that quotes its document, code rewritten with a small change, an answer quoted from a
passage. `story` is the free-form control where guessing from the prompt fails. Every
request is drawn from the built-in texts by the same seeded generator as the word prompts,
so every target of a run gets the very same requests.
"""

from __future__ import annotations

import random
from typing import Literal

TaskName = Literal["words", "story", "summarise", "rewrite", "quote"]
TASKS: tuple[str, ...] = ("words", "story", "summarise", "rewrite", "quote")

DOCUMENTS: tuple[str, ...] = (
    "The city council met on Tuesday evening to discuss the new bicycle lanes on Market Street. "
    "The lanes were added last spring after two years of planning. Since then, the number of people "
    "riding to work has doubled, according to counts taken every month by volunteers. Shop owners on "
    "the street were worried at first that fewer parking spaces would mean fewer customers. The council "
    "heard from twelve of them. Nine said their sales had stayed the same or grown, two said sales had "
    "fallen, and one had just opened and could not compare. The council also heard from the fire "
    "department, which said its trucks could still reach every building on the street in the same "
    "time as before. The council voted seven to two to keep the lanes and to add a second set on River "
    "Road next year. The two members who voted against said they wanted another year of counts first.",
    "The school garden started as a small patch of grass behind the library. In the first year the "
    "students planted beans, tomatoes and sunflowers, and most of the plants died in a dry summer. In "
    "the second year a parent built a rain barrel that collects water from the library roof, and the "
    "students learned to water the plants early in the morning. The harvest that year filled forty "
    "baskets. The school kitchen now uses the vegetables for lunch twice a week in the autumn. The "
    "students keep a notebook of what they plant, when it grows and how much they pick. Teachers use "
    "the notebook in science and mathematics lessons. Next year the students want to add a small "
    "greenhouse so that they can start seeds in the winter and grow herbs all year.",
    "The old stone bridge over the river was built more than two hundred years ago. It has five "
    "arches and was made for horses and carts, not for heavy trucks. Engineers found last winter that "
    "water had washed away some of the stones under the middle arch. The bridge was closed to trucks "
    "at once, and cars may cross only one at a time. Repairs will start in the summer, when the river "
    "is low. Workers will put new stones under the arch and fill the gaps with a strong mortar that "
    "matches the old one in colour. The work will take about four months. During that time the bridge "
    "will be open only to people on foot and on bicycles. A ferry will carry cars across the river "
    "every twenty minutes from six in the morning until ten at night.",
)

CODE: tuple[str, ...] = (
    '''def parse_config(path):
    """Read a simple key = value file into a dict."""
    config = {}
    with open(path) as handle:
        for number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"line {number}: expected key = value")
            key, value = line.split("=", 1)
            config[key.strip()] = value.strip()
    return config


def get_int(config, key, default=0):
    value = config.get(key)
    if value is None:
        return default
    return int(value)
''',
    '''class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, count):
        if count <= 0:
            raise ValueError("count must be positive")
        self.items[name] = self.items.get(name, 0) + count

    def remove(self, name, count):
        have = self.items.get(name, 0)
        if count > have:
            raise ValueError(f"only {have} of {name} left")
        self.items[name] = have - count
        if self.items[name] == 0:
            del self.items[name]

    def total(self):
        return sum(self.items.values())
''',
    '''function groupByDay(events) {
  const days = {};
  for (const event of events) {
    const day = event.time.slice(0, 10);
    if (!days[day]) {
      days[day] = [];
    }
    days[day].push(event);
  }
  for (const day of Object.keys(days)) {
    days[day].sort((a, b) => a.time.localeCompare(b.time));
  }
  return days;
}
''',
)

RENAMES: tuple[tuple[str, str], ...] = (
    ("config", "settings"), ("items", "stock"), ("days", "byDay"), ("value", "raw"), ("count", "amount"),
    ("event", "entry"), ("handle", "stream"), ("name", "label"),
)

QUESTIONS: tuple[tuple[int, str], ...] = (
    (0, "How did the council vote, and what did the two members who voted against want?"),
    (0, "What did the shop owners tell the council about their sales?"),
    (1, "How did the students solve the problem of the dry summer?"),
    (1, "What do the students want to add next year, and why?"),
    (2, "What will the repairs to the bridge involve?"),
    (2, "How will cars cross the river while the bridge is being repaired?"),
)

TOPICS: tuple[str, ...] = (
    "a lighthouse keeper who finds a message in a bottle", "a robot learning to bake bread",
    "two friends lost in a snowstorm", "a cat that runs a small bookshop", "the last train of the night",
    "a child who can talk to birds", "a farmer and a very old tree", "a ship that sails through the sky",
)


def task_prompt(task: str, rng: random.Random) -> str:
    """The user message of one request of `task` (not `words`, which workload.py makes)."""
    if task == "story":
        return f"Write a short story about {rng.choice(TOPICS)}."
    if task == "summarise":
        doc = rng.choice(DOCUMENTS)
        return f"Summarise the following report in a few sentences, using its own words.\n\n{doc}"
    if task == "rewrite":
        code = rng.choice(CODE)
        present = [(a, b) for a, b in RENAMES if a in code]
        old, new = rng.choice(present)
        return (f"Rewrite this code, renaming `{old}` to `{new}` everywhere. Reply with the whole code "
                f"and nothing else.\n\n{code}")
    if task == "quote":
        i, question = rng.choice(QUESTIONS)
        return (f"Answer the question by quoting the passage's own sentences.\n\nPassage:\n{DOCUMENTS[i]}"
                f"\n\nQuestion: {question}")
    raise ValueError(f"unknown task {task!r}")
