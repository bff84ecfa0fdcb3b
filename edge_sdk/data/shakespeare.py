"""Tiny Shakespeare as speaking roles grouped by play: a naturally grouped next-character task.

LEAF's Shakespeare (and the Selfish FL paper's Section 5.2) makes one client of every role of a play,
holding that role's lines; a play's roles are a natural group. Tiny Shakespeare is one text file of
extracts from several plays, without play headings, so each play is found by its opening line
(:data:`PLAYS`), and a speech is a ``NAME:`` line followed by the lines up to the next blank line.

A role's text becomes samples of ``seq_len`` character ids, each labelled with the id of the character
that follows (next-character prediction, as the LEAF task), taken at every ``stride``-th position.
:func:`role_split` cuts a role's text, in reading order, into a training part, an optional
validation part and a test part, so no test window overlaps a training one.

As the ``tinyshakespeare`` dataset (``load_dataset("tinyshakespeare")``), each role's first 80% is
its training text and the rest its test text, cut into windows of :data:`SEQ_LEN` characters (the
input of the zoo's ``char_lstm``) every :data:`STRIDE` characters; a sample's group is its role.

numpy only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edge_sdk.data.registry import Dataset, locate_dataset, register_dataset, require

__all__ = ["PLAYS", "SEQ_LEN", "STRIDE", "Role", "Vocabulary", "load_roles", "role_split", "windows"]

#: Characters of context per sample in the ``tinyshakespeare`` dataset: ``char_lstm``'s input.
SEQ_LEN = 40
#: A window starts every STRIDE characters (about 100,000 training windows, 33 MB; every
#: character would be 260 MB for little more to learn from).
STRIDE = 8
#: The share of each role's text (its end) held out as its test text.
TEST_SHARE = 0.2

#: The plays of Tiny Shakespeare, in file order, each with the first line of its first speech.
PLAYS: tuple[tuple[str, str], ...] = (
    ("Coriolanus", "Before we proceed any further, hear me speak."),
    ("King Richard III", "Now is the winter of our discontent"),
    ("King Richard II", "Old John of Gaunt, time-honour'd Lancaster,"),
    ("Romeo and Juliet", "Gregory, o' my word, we'll not carry coals."),
    ("King Henry VI, Part 3", "I wonder how the king escaped our hands."),
    ("The Winter's Tale", "If you shall chance, Camillo, to visit Bohemia, on"),
    ("Measure for Measure", "Escalus."),
    ("The Taming of the Shrew", "I'll pheeze you, in faith."),
    ("The Tempest", "Boatswain!"),
)
_SPEAKER = re.compile(r"^[A-Z][A-Za-z' .-]*:$")


@dataclass(frozen=True)
class Role:
    """One speaking role of one play and everything it says (speeches joined by newlines)."""

    play: str
    name: str
    text: str

    @property
    def device_id(self) -> str:
        """A device id for the role: play and name, lower case, non-alphanumerics as '-'."""
        return re.sub(r"[^a-z0-9]+", "-", f"{self.play}-{self.name}".lower()).strip("-")


@dataclass(frozen=True)
class Vocabulary:
    """The characters of the whole text, sorted: a character's id is its index."""

    chars: str

    def encode(self, text: str) -> np.ndarray:
        table = {c: i for i, c in enumerate(self.chars)}
        return np.fromiter((table[c] for c in text), dtype=np.int64, count=len(text))

    def __len__(self) -> int:
        return len(self.chars)


def load_roles(root: Path | str | None = None) -> tuple[list[Role], Vocabulary]:
    """Every (play, role) of ``tinyshakespeare/input.txt`` under the data root ``root`` (default
    ``$EDGETRAIN_DATA``) with its text, and the vocabulary."""
    folder = locate_dataset("tinyshakespeare", root)
    assert folder is not None
    return _read_roles(folder)


@register_dataset("tinyshakespeare", path="tinyshakespeare", groups="speaking role (of a play)",
                  description=f"Tiny Shakespeare: {SEQ_LEN} characters -> the next one, one client per speaking role")
def _tinyshakespeare(folder: Path, split: str) -> Dataset:
    """Every role's windows of ``split`` (see the module docstring); ``groups``: the role's index in
    ``info["roles"]`` (their device ids), ``info["chars"]``: the vocabulary."""
    roles, vocab = _read_roles(folder)
    xs, ys, gs = [], [], []
    for i, role in enumerate(roles):
        train, _, test = role_split(role.text, test=TEST_SHARE)
        x, y = windows(vocab.encode(train if split == "train" else test), SEQ_LEN, STRIDE)
        xs.append(x)
        ys.append(y)
        gs.append(np.full(len(y), i, np.int64))
    return Dataset(np.concatenate(xs), np.concatenate(ys), len(vocab), "tinyshakespeare", groups=np.concatenate(gs),
                   info={"roles": tuple(r.device_id for r in roles), "chars": vocab.chars})


def _read_roles(folder: Path) -> tuple[list[Role], Vocabulary]:
    path = require(folder / "input.txt", "tinyshakespeare")
    text = path.read_text(encoding="utf-8")
    lines = text.split("\n")
    starts = []
    for play, first in PLAYS:
        try:
            at = lines.index(first)
        except ValueError:
            raise ValueError(f"{path}: the opening line of {play} ({first!r}) is not in the file") from None
        starts.append(at - 1)  # the speaker's line before it
    bounds = list(zip(starts, starts[1:] + [len(lines)]))
    spoken: dict[tuple[str, str], list[str]] = {}
    for (play, _), (lo, hi) in zip(PLAYS, bounds):
        speaker: str | None = None
        blank = True  # a speaker's line follows a blank line (a line of verse may end in ':' too)
        for line in lines[lo:hi]:
            if blank and _SPEAKER.match(line):
                speaker = line[:-1]
                spoken.setdefault((play, speaker), [])
            elif not line.strip():
                speaker = None
            elif speaker is not None:
                spoken[(play, speaker)].append(line)
            blank = not line.strip()
    roles = [Role(play, name, "\n".join(said)) for (play, name), said in spoken.items() if said]
    return roles, Vocabulary("".join(sorted(set(text))))


def windows(ids: np.ndarray, seq_len: int, stride: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Samples (n, seq_len) of character ids and the id of the character after each: the task."""
    if seq_len < 1 or stride < 1:
        raise ValueError(f"seq_len and stride must be positive, got {seq_len} and {stride}")
    starts = np.arange(0, max(0, len(ids) - seq_len), stride)
    x = ids[starts[:, None] + np.arange(seq_len)[None, :]] if len(starts) else np.zeros((0, seq_len), np.int64)
    return np.ascontiguousarray(x), ids[starts + seq_len]


def role_split(text: str, test: float = 0.2, validation: float = 0.0) -> tuple[str, str, str]:
    """(train, validation, test) parts of a role's text, in reading order: the last ``test`` share is
    the test part, the ``validation`` share before it the validation part."""
    if not (0 <= test < 1 and 0 <= validation < 1 and test + validation < 1):
        raise ValueError(f"test and validation shares must be in [0, 1) and sum below 1, got {test}, {validation}")
    n = len(text)
    a, b = int(n * (1 - test - validation)), int(n * (1 - test))
    return text[:a], text[a:b], text[b:]
