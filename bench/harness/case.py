"""A benchmark case: what is measured (a name, its options, how a run is done) and its runs.

A bench script declares one :class:`Case` and hands its command line to :meth:`Case.main`::

    CASE = Case("transport", __doc__, run, arguments=add_arguments, repeats=15,
                quick={"sizes": "1", "repeats": 2})

    def main(argv=None):
        return CASE.main(argv)

The harness builds the parser (the first paragraph of the docstring as its description), adds the
common options the case takes, then the case's own (``arguments``), parses the command line once and
calls ``run`` with a :class:`Context`. The common options, the same on every script:

- ``--out PATH``: the results file (default ``bench/results/<case>.json``; a case whose file name
  depends on its options gives ``results``);
- ``--repeats N`` (where the case gives ``repeats``, its default): runs of each lane;
- ``--seeds 0,1,2`` (where the case gives ``seeds``): the seeds, as a list of ints in ``ctx.seeds``;
- ``--data-root DIR`` (where ``data_root``): the datasets folder, default ``$EDGETRAIN_DATA``; a given
  one is exported as ``$EDGETRAIN_DATA`` for this process and its children;
- ``--quick`` (where the case gives ``quick``): the case's smallest form, those option values for
  every option not given on the command line.

``run`` measures and ends with :meth:`Context.write`: the per-run records, the case's report, and the
summary the harness computes over the case's ``metrics`` (results.py has the schema).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.harness import results

__all__ = ["RESULTS", "Case", "Context", "interleave", "parse_list"]

RESULTS = Path(__file__).resolve().parents[1] / "results"


def parse_list(text: str | Sequence, kind: Callable[[str], Any] = str) -> list:
    """A comma-separated option (``"0,1,2"``) as a list (already a list: each item converted)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    return [kind(s.strip()) if isinstance(s, str) else kind(s) for s in items if not isinstance(s, str) or s.strip()]


def interleave(lanes: Sequence[str], repeats: int, *, rotate: bool = True) -> Iterator[tuple[int, str]]:
    """(repeat, lane) in the order to run them: every lane once per repeat, side by side, the order
    rotated by one each repeat so that no lane always runs first (after a quiet spell) or last."""
    lanes = list(lanes)
    for rep in range(repeats):
        shift = rep % len(lanes) if rotate and lanes else 0
        for lane in lanes[shift:] + lanes[:shift]:
            yield rep, lane


@dataclass(frozen=True)
class Case:
    """One benchmark: its name (the results file's stem), its docstring, and how a run is done."""

    name: str
    doc: str
    run: Callable[[Context], Any]
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    repeats: int | None = None
    seeds: str | None = None
    data_root: bool = False
    quick: Mapping[str, Any] = field(default_factory=dict)
    results: Callable[[argparse.Namespace], str] | None = None  # the results name from the options (its
    #                                                               docstring: the pattern --help shows)
    metrics: tuple[str, ...] = ()  # the run records' numbers the summary covers
    group_by: tuple[str, ...] = ()  # the run records' keys that name a group (a lane, a size, ...)
    script: str | None = None  # how the command line names the script (default: bench/<name>.py)

    def parser(self) -> argparse.ArgumentParser:
        """The case's parser: the common options it takes, then its own."""
        ap = argparse.ArgumentParser(description=self.doc.strip().split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        common = ap.add_argument_group("common benchmark options (bench/harness)")
        named = self.name if self.results is None else (self.results.__doc__ or f"{self.name}-...").strip()
        common.add_argument("--out", type=Path, default=None, help=f"results file (default: bench/results/{named}.json)")
        if self.repeats is not None:
            common.add_argument("--repeats", type=int, default=self.repeats,
                                help=f"runs of each lane, interleaved (default {self.repeats})")
        if self.seeds is not None:
            common.add_argument("--seeds", default=self.seeds, help=f"comma-separated seeds (default {self.seeds})")
        if self.data_root:
            common.add_argument("--data-root", default=os.environ.get("EDGETRAIN_DATA"),
                                help="folder holding the datasets (default: $EDGETRAIN_DATA)")
        if self.quick:
            shown = " ".join(f"--{k.replace('_', '-')} {v}" if v is not True else f"--{k.replace('_', '-')}"
                             for k, v in self.quick.items())
            common.add_argument("--quick", action="store_true",
                                help=f"the smallest run, for a check that it works: {shown} (given options win)")
        if self.arguments is not None:
            self.arguments(ap)
        return ap

    def parse(self, argv: Sequence[str] | None = None) -> Context:
        """The command line parsed once (``--quick`` applied), ``$EDGETRAIN_DATA`` set from ``--data-root``."""
        argv = list(sys.argv[1:] if argv is None else argv)
        ap = self.parser()
        args = ap.parse_args(argv)
        if getattr(args, "quick", False):
            ap.set_defaults(**self.quick)
            args = ap.parse_args(argv)
        if self.data_root and args.data_root:
            args.data_root = str(Path(args.data_root).expanduser().resolve())
            os.environ["EDGETRAIN_DATA"] = args.data_root
        name = self.results(args) if self.results else self.name
        if args.out is None:
            args.out = RESULTS / f"{name}.json"
        return Context(self, args, argv, ap, name)

    def main(self, argv: Sequence[str] | None = None) -> Any:
        ctx = self.parse(argv)
        return self.run(ctx)


@dataclass
class Context:
    """One run of a case: its parsed options and what it writes."""

    case: Case
    args: argparse.Namespace
    argv: list[str]
    parser: argparse.ArgumentParser
    name: str
    started: float = field(default_factory=time.time)

    @property
    def out(self) -> Path:
        return Path(self.args.out)

    @property
    def seeds(self) -> list[int]:
        return parse_list(self.args.seeds, int)

    @property
    def repeats(self) -> int:
        return int(self.args.repeats)

    @property
    def quick(self) -> bool:
        return bool(getattr(self.args, "quick", False))

    @property
    def data_root(self) -> str | None:
        return getattr(self.args, "data_root", None)

    @property
    def command(self) -> str:
        script = self.case.script or f"bench/{self.case.name}.py"
        return " ".join(["python", script, *map(shlex.quote, self.argv)])

    def document(self, runs: Sequence[Mapping[str, Any]] = (), report: Mapping[str, Any] | None = None,
                 summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The results document (results.py's schema); ``summary`` adds to the harness's own."""
        auto = results.summarise(runs, self.case.metrics, self.case.group_by) if self.case.metrics else {}
        return results.document(self.name, command=self.command, options=vars(self.args), started=self.started,
                                runs=runs, summary={**auto, **(summary or {})}, report=report)

    def write(self, runs: Sequence[Mapping[str, Any]] = (), report: Mapping[str, Any] | None = None,
              summary: Mapping[str, Any] | None = None, *, out: Path | None = None, quiet: bool = False
              ) -> dict[str, Any]:
        """Write the results document to ``out`` (default ``--out``) and return it."""
        doc = self.document(runs, report, summary)
        path = results.write(out or self.out, doc)
        if not quiet:
            print(f"wrote {path}", flush=True)
        return doc
