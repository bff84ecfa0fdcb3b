"""The benchmarks' one harness: a case, its runs, one results schema, fleets built as objects.

- :mod:`bench.harness.case`: :class:`Case` (what a benchmark measures: its name, options and run),
  :class:`Context` (one run of it: the options parsed once, the results written), :func:`interleave`
  (lanes side by side in every repeat);
- :mod:`bench.harness.results`: the results document every benchmark writes to
  ``bench/results/<case>.json`` (command, machine, date, commit, per-run records, summaries);
- :mod:`bench.harness.timeline`: accuracy over wall-clock time from a server's round events (time to target);
- :mod:`bench.harness.fleets`: fleets as :class:`emulator.fleet.Fleet` values and the one writer of
  fleet files.

bench/README.md, "The harness", says how to add a case.
"""

from bench.harness.case import RESULTS, Case, Context, interleave, parse_list
from bench.harness.results import SCHEMA, ratio_summary, report_of, runs_of, stats, summarise

__all__ = ["RESULTS", "SCHEMA", "Case", "Context", "interleave", "parse_list", "ratio_summary", "report_of",
           "runs_of", "stats", "summarise"]
