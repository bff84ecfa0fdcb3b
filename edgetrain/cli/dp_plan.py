"""``edgetrain dp-plan``: before a run, the noise a target epsilon needs and what it costs, per block.

For a fleet of N devices sampled at rate q (each device independently, Poisson; or exactly K per
round with ``--sampling fixed``) over R rounds, the smallest noise multiplier z whose epsilon at the
target delta meets the target (``orchestrator.aggregation.privacy.calibrate``), and the noise it puts on each
coordinate of the mean update, z C / (q N). With ``--blocks-from-fleet``, the fleet file's device
groups are planned (``force_split``, or the planner's split at the group's budget) and each block
gets its cohort, its clip and noise under per-layer clipping, and its epsilon; each split its
devices' epsilon. ``--noise distributed`` (``--dp --secure-aggregation``: the devices add the noise
inside the secure round, ``orchestrator.aggregation.privacy.distributed``) plans the same multiplier and adds
what each device's share is and what the multiplier becomes as the survivors vary: shares sized for
a share e of a block's cohort (``--expected-survivors``, by default ``--min-survivors``) give z
sqrt(s / e) with a share s surviving, no less than z sqrt(min / e) at the floor below which a block
is withheld. Numbers only: nothing is trained or served.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Optional

import typer

from edgetrain.cli import app

if TYPE_CHECKING:
    from rich.console import Console

    from emulator.fleet import Fleet


@dataclass(frozen=True)
class FleetBlocks:
    """What a fleet file says about DP: the model's blocks, devices per split, and its schedule."""

    name: str
    blocks: list[str]
    splits: dict[int, int]
    rounds: int
    rate: float
    strategy: str
    options: dict[str, Any]
    sizes: dict[str, int] = field(default_factory=dict)  # block -> its coordinates d_b


def fleet_blocks(path: str) -> FleetBlocks:
    """The fleet's blocks and its devices per split: a group's ``force_split``, else the planner's
    split for the group's budget and batch (its local samples counted when the group caps them)."""
    from edge_sdk.models.zoo import build_model
    from emulator.fleet import load_fleet
    from profiles.accounting import TrainingMemory, measure_model
    from profiles.planner import plan_split

    fleet = load_fleet(path)
    # As the server plans them: a secure run's devices with the secure round's memory.
    memory = TrainingMemory().secured() if fleet.training.secure_aggregation else TrainingMemory()
    model = build_model(fleet.model)
    cost = measure_model(model)
    splits: dict[int, int] = {}
    split_of: dict[str, int] = {}
    for d in fleet.devices():
        if d.group not in split_of:
            split_of[d.group] = d.force_split if d.force_split is not None else plan_split(
                cost, d.budget_bytes, fleet.training.batch_size, local_samples=_group_samples(fleet, d.group),
                memory=memory).split
        splits[split_of[d.group]] = splits.get(split_of[d.group], 0) + 1
    sizes = dict.fromkeys(model.block_names, 0)
    for name, t in model.state_dict().items():
        if t.is_floating_point():
            sizes[model.block_names[model.block_of(name)]] += t.numel()
    return FleetBlocks(fleet.name, list(model.block_names), splits, fleet.training.rounds, fleet.training.fraction,
                       fleet.training.strategy, dict(fleet.strategy_options), sizes)


def _group_samples(fleet: Fleet, group: str) -> int:
    return next((g.samples or 0) for g in fleet.groups if g.name == group)


def _scaled(splits: dict[int, int], devices: int) -> dict[int, int]:
    """The fleet's split shares applied to ``devices`` devices (largest remainders)."""
    total = sum(splits.values())
    exact = {s: devices * n / total for s, n in splits.items()}
    out = {s: math.floor(x) for s, x in exact.items()}
    for s in sorted(exact, key=lambda s: out[s] - exact[s])[: devices - sum(out.values())]:
        out[s] += 1
    return {s: n for s, n in out.items() if n > 0}


def _schedule(devices: Optional[int], per_round: Optional[int], rate: Optional[float], rounds: Optional[int],
              fleet: FleetBlocks | None) -> tuple[int, float, int]:
    from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError

    n = devices if devices is not None else (sum(fleet.splits.values()) if fleet else None)
    if n is None or n < 1:
        raise PrivacyPlanError("give --devices (or --blocks-from-fleet)")
    if per_round is not None and rate is not None:
        raise PrivacyPlanError("give --per-round or --rate, not both")
    if per_round is not None:
        if not 1 <= per_round <= n:
            raise PrivacyPlanError(f"--per-round must be between 1 and the {n} devices, got {per_round}")
        q = per_round / n
    else:
        q = rate if rate is not None else (fleet.rate if fleet else None)
        if q is None:
            raise PrivacyPlanError("give --per-round or --rate")
    r = rounds if rounds is not None else (fleet.rounds if fleet else None)
    if r is None:
        raise PrivacyPlanError("give --rounds")
    return n, q, r


def privacy_plan(*, devices: Optional[int], per_round: Optional[int], rate: Optional[float], rounds: Optional[int],
                 target_epsilon: float, delta: Optional[float], clip: float, fleet: FleetBlocks | None,
                 sampling: str = "poisson", accountant: str = "pld", min_cohort: int = 10, noise: str = "central",
                 min_survivors: float = 0.7, expected_survivors: Optional[float] = None,
                 mechanism: str = "gaussian", rounds_per_tree: int = 0, allocation: str = "uniform") -> dict[str, Any]:
    """The plan as plain data (what ``--json`` prints); settings that cannot work are listed in
    ``refusals``, each one line."""
    from orchestrator.aggregation.privacy import calibrate as cal
    from orchestrator.aggregation.privacy.accountant import epsilon_for

    n, q, r = _schedule(devices, per_round, rate, rounds, fleet)
    if not clip > 0:
        raise cal.PrivacyPlanError(f"--clip must be > 0, got {clip:g}")
    if sampling not in ("poisson", "fixed"):
        raise cal.PrivacyPlanError(f"--sampling must be poisson or fixed, got {sampling!r}")
    if noise not in ("central", "distributed"):
        raise cal.PrivacyPlanError(f"--noise must be central or distributed, got {noise!r}")
    expected = min_survivors if expected_survivors is None else expected_survivors
    if not 0 < min_survivors <= expected <= 1:
        raise cal.PrivacyPlanError(f"survivors: 0 < --min-survivors ({min_survivors:g}) <= --expected-survivors "
                                   f"({expected:g}) <= 1")
    d = cal.check_delta(delta if delta is not None else cal.default_delta(n), n)
    fixed = n if sampling == "fixed" else None
    spend, ftrl = None, _ftrl(mechanism, noise, n, q, r, rounds_per_tree, target_epsilon, d)
    if ftrl is not None:
        z, spend, sampling, accountant = ftrl.pop("z"), ftrl.pop("spend"), "tree", "rdp"
    else:
        z = cal.noise_multiplier(target_epsilon, q, r, d, accountant=accountant, fleet=fixed)
    plan: dict[str, Any] = {
        "devices": n, "rate": q, "expected_cohort": q * n, "rounds": r, "target_epsilon": target_epsilon,
        "delta": d, "delta_is_default": delta is None, "sampling": sampling,
        "accountant": "rdp" if fixed else accountant, "clip": clip, "noise_multiplier": z,
        "epsilon": spend(z) if spend else epsilon_for(z, q, r, d, accountant=accountant, fleet=fixed),
        "mechanism": mechanism, "ftrl": ftrl,
        "sum_stddev": z * clip, "mean_stddev": cal.noise_per_coordinate(z, clip, q * n),
        "noise": noise, "fleet": None, "blocks": [], "splits": [], "refusals": [], "allocation": None,
    }
    if noise == "distributed":
        plan["distributed"] = _distributed(z, q, r, d, accountant, fixed, min_survivors, expected)
    checks: list[tuple[float, str]] = [(q * n, "the round")]
    if fleet is not None:
        splits = _scaled(fleet.splits, n) if devices is not None else fleet.splits
        per_block = [(b, sum(c for s, c in splits.items() if s <= i)) for i, b in enumerate(fleet.blocks)]
        allocated = _allocation(allocation, z, clip, per_block, fleet.sizes, q)
        plan["allocation"] = allocated
        by_name = allocated["multipliers"] if allocated else None
        blocks = cal.plan_blocks(z, clip, per_block, q, r, d, accountant=accountant, fleet=fixed, spend=spend,
                                 multipliers=by_name)
        if noise == "distributed":  # each device's share: the block's sum noise over sqrt(e m_b) devices
            plan["distributed"]["share_stddev"] = {b.block: b.sum_stddev / math.sqrt(expected * b.cohort)
                                                   for b in blocks}
        plan.update(fleet=fleet.name, blocks=[asdict(b) for b in blocks],
                    splits=[asdict(s) for s in cal.plan_splits(
                        z, len(fleet.blocks), splits, q, r, d, accountant=accountant, fleet=fixed, spend=spend,
                        multipliers=[by_name.get(b, math.inf) for b in fleet.blocks] if by_name else None)])
        checks += [(b.cohort, f"block {b.block}") for b in blocks]
        try:
            from orchestrator.strategies import make_strategy

            cal.check_strategy(fleet.strategy, make_strategy(fleet.strategy, **fleet.options).combines)
        except (cal.PrivacyPlanError, ValueError) as exc:
            plan["refusals"].append(str(exc))
    for cohort, what in checks:
        try:
            cal.check_cohort(cohort, what, min_cohort)
        except cal.PrivacyPlanError as exc:
            plan["refusals"].append(str(exc))
    return plan


def _allocation(allocation: str, z: float, clip: float, per_block: list[tuple[str, int]], sizes: dict[str, int],
                q: float) -> dict[str, Any] | None:
    """``--allocation utility`` (the server's ``dp_allocation``): each released block's multiplier
    from ``calibrate.allocate_multipliers`` (weights d_b C_b^2 / m_b^2), and the objective it
    minimises, the expected squared norm of the noise on the mean update, against uniform noise's.
    None: uniform."""
    from orchestrator.aggregation.privacy import calibrate as cal

    if allocation not in ("uniform", "utility"):
        raise cal.PrivacyPlanError(f"--allocation must be uniform or utility, got {allocation!r}")
    released = [(b, n) for b, n in per_block if n > 0]
    if allocation == "uniform" or not released:
        return None
    c_b = clip / math.sqrt(len(released))
    weights = {b: sizes.get(b, 0) * c_b**2 / (q * n) ** 2 for b, n in released}
    multipliers = cal.allocate_multipliers(z, weights)
    uniform = dict.fromkeys(weights, z * math.sqrt(len(released)))
    return {"multipliers": multipliers, "objective": cal.allocation_objective(multipliers, weights),
            "uniform_objective": cal.allocation_objective(uniform, weights)}


def _ftrl(mechanism: str, noise: str, n: int, q: float, r: int, rounds_per_tree: int, target: float,
          d: float) -> dict[str, Any] | None:
    """DP-FTRL's plan (``--mechanism ftrl``, ``orchestrator.aggregation.privacy.ftrl``): K = ceil(q N)
    devices a round, the server's rounds per tree (``calibrate.ftrl_epoch``), the trees, the multiplier
    per tree node and its epsilon (``spend``). None: the sampled Gaussian."""
    from orchestrator.aggregation.privacy import calibrate as cal
    from orchestrator.aggregation.privacy.accountant import tree_epsilon

    if mechanism not in ("gaussian", "ftrl"):
        raise cal.PrivacyPlanError(f"--mechanism must be gaussian or ftrl, got {mechanism!r}")
    if mechanism == "gaussian":
        return None
    if noise == "distributed":
        raise cal.PrivacyPlanError("--mechanism ftrl plans central noise only: the devices do not add tree noise "
                                   "shares under secure aggregation yet")
    cohort = min(n, max(1, math.ceil(q * n - 1e-9)))
    epoch = cal.ftrl_epoch(n, cohort, r, rounds_per_tree)
    trees = cal.trees(r, epoch)
    return {"cohort": cohort, "rounds_per_tree": epoch, "trees": trees,
            "z": cal.tree_multiplier(target, r, epoch, d), "spend": lambda z: tree_epsilon(z, trees, d)}


def _distributed(z: float, q: float, r: int, d: float, accountant: str, fixed: Optional[int], floor: float,
                 expected: float) -> dict[str, Any]:
    """What the devices' noise gives (``orchestrator.aggregation.privacy.distributed``): the multiplier and the
    epsilon of R rounds like it with all of a block's devices surviving, with the expected share, and
    at the floor (``min_survivors``; fewer and the block is withheld). Shares ceil() per block in a run;
    here, as fractions of the expected cohort."""
    from orchestrator.aggregation.privacy.accountant import epsilon_for

    def at(share: float) -> dict[str, float]:
        m = z * math.sqrt(share / expected)
        return {"survivors": share, "noise_multiplier": m,
                "epsilon": epsilon_for(m, q, r, d, accountant=accountant, fleet=fixed)}

    return {"min_survivors": floor, "expected_survivors": expected,
            "cases": [at(share) for share in dict.fromkeys((1.0, expected, floor))], "share_stddev": None}


@app.command("dp-plan", epilog="Examples: edgetrain dp-plan --devices 10000 --per-round 500 --rounds 200 "
                               "--target-epsilon 8; edgetrain dp-plan --blocks-from-fleet embracingfl-16s-112w "
                               "--devices 10000 --rate 0.05 --rounds 300 --target-epsilon 8 --clip 0.5")
def dp_plan(
    devices: Optional[int] = typer.Option(None, help="Devices in the fleet (N). With --blocks-from-fleet: its "
                                                     "devices, or this many in the fleet's proportions."),
    per_round: Optional[int] = typer.Option(None, "--per-round", help="Devices per round (K): rate K / N."),
    rate: Optional[float] = typer.Option(None, help="Sampling rate q: each device's chance of being in a round."),
    rounds: Optional[int] = typer.Option(None, help="Rounds (R). Default with a fleet: its rounds."),
    target_epsilon: float = typer.Option(..., "--target-epsilon", help="Epsilon the whole run may spend."),
    delta: Optional[float] = typer.Option(None, help="Delta (default min(1e-5, 1 / N^1.1), as the server; must be below 1 / N)."),
    clip: float = typer.Option(1.0, help="L2 clip C of one device's whole update (split over the blocks)."),
    blocks_from_fleet: Optional[str] = typer.Option(None, "--blocks-from-fleet",
                                                    help="A fleet file (or shipped fleet name): plan per block."),
    sampling: str = typer.Option("poisson", help="poisson (each device independently) or fixed (exactly K)."),
    accountant: str = typer.Option("pld", help="pld (tighter) or rdp; fixed sampling always uses rdp."),
    min_cohort: int = typer.Option(10, help="Refuse blocks expecting fewer devices per round."),
    noise: str = typer.Option("central", help="central (the server adds the noise: --dp) or distributed (the devices "
                                              "do, inside secure aggregation: --dp --secure-aggregation)."),
    min_survivors: float = typer.Option(0.7, "--min-survivors", help="distributed: the share of a block's cohort "
                                        "that must survive for it to be revealed (dp_min_survivors)."),
    expected_survivors: Optional[float] = typer.Option(None, "--expected-survivors", help="distributed: the share "
                                                       "the devices' noise is sized for (dp_expected_survivors; "
                                                       "default --min-survivors)."),
    mechanism: str = typer.Option("gaussian", help="gaussian (DP-SGD with sampling: --dp) or ftrl (DP-FTRL, tree "
                                                   "aggregation without sampling: --dp-mechanism ftrl)."),
    rounds_per_tree: int = typer.Option(0, "--rounds-per-tree", help="ftrl: rounds per tree (dp_ftrl_epoch; "
                                        "0: floor(N / K), as the server)."),
    allocation: str = typer.Option("uniform", help="uniform (z sqrt(L) on every block) or utility (per-block "
                                                   "multipliers minimising the noise on the mean update for the same "
                                                   "model epsilon: dp_allocation)."),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """The noise multiplier that meets a target epsilon, and the noise it costs, per block."""
    from edgetrain.cli import console as wide_console
    from orchestrator.aggregation.privacy.calibrate import PrivacyPlanError

    fleet = fleet_blocks(blocks_from_fleet) if blocks_from_fleet else None
    plan = privacy_plan(devices=devices, per_round=per_round, rate=rate, rounds=rounds, target_epsilon=target_epsilon,
                        delta=delta, clip=clip, fleet=fleet, sampling=sampling, accountant=accountant,
                        min_cohort=min_cohort, noise=noise, min_survivors=min_survivors,
                        expected_survivors=expected_survivors, mechanism=mechanism,
                        rounds_per_tree=rounds_per_tree, allocation=allocation)
    if as_json:
        typer.echo(json.dumps(plan, indent=2))
        if plan["refusals"]:
            raise typer.Exit(code=1)
        return
    _print(wide_console(), plan)
    if plan["refusals"]:
        more = f" (and {len(plan['refusals']) - 1} more above)" if len(plan["refusals"]) > 1 else ""
        raise PrivacyPlanError(plan["refusals"][0] + more)


def _print(console: Console, plan: dict[str, Any]) -> None:
    from rich import box
    from rich.table import Table

    delta = f"{plan['delta']:.3g}" + (" (min(1e-5, 1/N^1.1))" if plan["delta_is_default"] else "")
    console.print(f"{plan['devices']} devices, rate {plan['rate']:.4g} ({plan['sampling']} sampling, expected "
                  f"cohort {plan['expected_cohort']:.4g}), {plan['rounds']} rounds")
    console.print(f"target epsilon {plan['target_epsilon']:g} at delta {delta}, accountant {plan['accountant']}")
    console.print(f"noise multiplier [bold]{plan['noise_multiplier']:.4f}[/bold]: epsilon {plan['epsilon']:.3f}; "
                  f"noise std {plan['sum_stddev']:.4g} on a sum clipped to {plan['clip']:g}, "
                  f"[bold]{plan['mean_stddev']:.4g}[/bold] per coordinate of the mean update")
    if plan["noise"] == "distributed":
        dist = plan["distributed"]
        console.print(f"distributed noise: each device adds its share, sized for {dist['expected_survivors']:.0%} of a "
                      f"block's cohort surviving; a block with fewer than {dist['min_survivors']:.0%} is withheld")
        for case in dist["cases"]:
            console.print(f"  {case['survivors']:.0%} of each cohort surviving: multiplier {case['noise_multiplier']:.4f},"
                          f" epsilon {case['epsilon']:.3f} after {plan['rounds']} rounds like it")
    elif plan["ftrl"]:
        f = plan["ftrl"]
        console.print(f"DP-FTRL: {f['cohort']} devices a round, trees of {f['rounds_per_tree']} rounds "
                      f"({len(f['trees'])} trees), each device at most once per tree; no sampling assumed; the "
                      f"multiplier is per tree node")
    else:
        console.print("central noise: the server adds it to each block's clipped sum")
    if plan["blocks"]:
        alloc = plan["allocation"]
        how = ("per-layer clipping, noise allocated per block (expected squared noise norm on the mean "
               f"{alloc['objective']:.4g}, uniform: {alloc['uniform_objective']:.4g})" if alloc
               else "per-layer clipping, equal noise on every block")
        table = Table(title=f"Per block (fleet {plan['fleet']}): {how}",
                      title_justify="left", box=box.SIMPLE_HEAVY)
        shares = plan["distributed"]["share_stddev"] if plan["noise"] == "distributed" else None
        for col in ("block", "devices", "cohort", "clip", "multiplier", "noise std (sum)", "noise std (mean)",
                    *(("a device's share (std)",) if shares else ()), "epsilon"):
            table.add_column(col, justify="left" if col == "block" else "right")
        for b in plan["blocks"]:
            table.add_row(b["block"], str(b["devices"]), f"{b['cohort']:.4g}", f"{b['clip']:.4g}",
                          f"{b['noise_multiplier']:.4g}", f"{b['sum_stddev']:.4g}", f"{b['mean_stddev']:.4g}",
                          *((f"{shares[b['block']]:.4g}",) if shares else ()), f"{b['epsilon']:.3f}")
        console.print(table)
        splits = Table(title="Per split: a device training blocks [split, L)", title_justify="left",
                       box=box.SIMPLE_HEAVY)
        for col in ("split", "devices", "blocks trained", "multiplier", "epsilon"):
            splits.add_column(col, justify="right")
        for s in plan["splits"]:
            splits.add_row(str(s["split"]), str(s["devices"]), str(s["blocks"]), f"{s['noise_multiplier']:.4g}",
                           f"{s['epsilon']:.3f}")
        console.print(splits)
    for refusal in plan["refusals"]:
        console.print(f"[red]refused:[/red] {refusal}")
