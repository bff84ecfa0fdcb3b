"""Strategy options are typed by the strategy's constructor, in one place (orchestrator.strategies.options):
text from ``edgetrain serve -O``, TOML values from a fleet file and Python values all reach the
constructor as the type its annotation names, and a bad value is refused naming the strategy, the option
and what it accepts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from orchestrator.strategies import FedSubAvg, VaRSeL, make_strategy


@pytest.mark.parametrize("text, expected", [
    ("false", False), ("False", False), ("0", False), ("no", False), ("OFF", False),
    ("true", True), ("TRUE", True), ("1", True), ("yes", True), ("on", True),
])
def test_fedsubavg_correction_text_is_a_boolean(text: str, expected: bool):
    # -O correction=false used to leave the correction on: the text "false" is truthy.
    assert make_strategy("fedsubavg", correction=text).correction is expected


def test_fedsubavg_k_from_text_is_an_integer():
    # -O k=5 used to raise an uncaught TypeError ('<' between str and int) from the constructor.
    strategy = make_strategy("fedsubavg", k="5")
    assert isinstance(strategy, FedSubAvg) and strategy.k == 5 and type(strategy.k) is int
    assert make_strategy("fedsubavg", k="none").k is None


@pytest.mark.parametrize("options, fragments", [
    ({"correction": "maybe"}, ("'fedsubavg'", "correction", "true or false", "yes/no", "'maybe'")),
    ({"k": "five"}, ("'fedsubavg'", "option k", "integer", "'five'")),
    ({"k": "0"}, ("option k", ">= 1")),
    ({"split": "half"}, ("option split", "one of planned, zero", "'half'")),
    ({"weighting": 3}, ("option weighting", "one of samples, uniform")),
    ({"corection": "false"}, ("corection", "k, weighting, split, correction")),
])
def test_bad_fedsubavg_options_name_the_strategy_option_and_accepted_values(options, fragments):
    from orchestrator.strategies.options import StrategyOptionError

    with pytest.raises(StrategyOptionError) as info:
        make_strategy("fedsubavg", **options)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_text_typed_and_python_values_convert_alike():
    from orchestrator.strategies import strategy_options

    a = make_strategy("varsel", budget="4", exact="off", internal="a,b", seed="3")
    b = make_strategy("varsel", budget=4, exact=False, internal=["a", "b"], seed=3)
    c = VaRSeL(budget=4.0, exact=False, internal=("a", "b"), seed=3)
    for s in (a, b, c):
        assert (s.budget, s.exact, s.rule.ids, s.seed) == (4.0, False, ("a", "b"), 3)
        assert type(s.budget) is float and type(s.seed) is int
    assert strategy_options("fedalign", {"epsilon": "inf", "warmup": "2"}) == {"epsilon": float("inf"), "warmup": 2}
    with pytest.raises(ValueError, match="option warmup must be an integer"):
        strategy_options("fedalign", {"warmup": 2.5})  # a TOML float for an integer option


def test_serve_check_builds_fedsubavg_with_correction_off(tmp_path):
    out = subprocess.run([sys.executable, "-m", "edgetrain", "serve", "--check", "--strategy", "fedsubavg",
                          "-O", "correction=false", "-O", "k=5", "--store", str(tmp_path)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert '"correction": "False"' in out.stdout and '"k": "5"' in out.stdout
    bad = subprocess.run([sys.executable, "-m", "edgetrain", "serve", "--check", "--strategy", "fedsubavg",
                          "-O", "k=five", "--store", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == [
        "edgetrain serve: strategy 'fedsubavg': option k must be an integer (a whole number) >= 1, or none, "
        "got 'five'"]
