"""Report intake assembled from parts: each part's table, and the one place the settings and the
strategy's declared capabilities choose from them (docs/architecture.md, "Report intake").

- the upload format (``UPLOAD_FORMATS``): ``plain`` unless ``secure_aggregation`` masks the uploads;
- the chain of bounds (``BOUNDS``, in this order): ``norm_bound`` and ``direction_trust`` where the
  server sees each update and no privacy mechanism releases the round (their references are data no
  accountant covers; under DP the mechanism's clip bounds each update instead), ``dp_clip`` (a
  mechanism's clip on plain uploads), ``device_clip`` (masked uploads: the clip each device applies);
- the combiner (``COMBINERS``): the one the upload format names (the strategy's fold for plain
  uploads, secure block sums for masked ones);
- the release: the combiner's result as it is, or, with ``dp``, a privacy mechanism
  (``orchestrator.aggregation.privacy.MECHANISMS``, ``dp_mechanism``; by default the format's)
  behind the run's ledger.

The tables name each implementation by ``package.module:Class``, loaded when a run uses it: secure
aggregation loads ``cryptography`` and DP ``dp-accounting`` only then.

What the strategy must be capable of is its own declaration (``Strategy.combines``): masked sums and a
privacy mechanism's release compute a weighted mean of whole blocks, so a strategy that declares one
(of ours, or ``package.module:Class`` of your own) runs under both, and any other is refused before
the first round (:func:`check_capabilities`).

Buffered asynchronous rounds (``round_mode = "buffered"``, FedBuff) take plain uploads into the
``buffer`` combiner (:mod:`orchestrator.aggregation.buffered`: each update folded with its staleness
weight, the model stepped with the server learning rate), whose round driver
(:mod:`orchestrator.server.buffered`) closes a buffer every ``buffer_size`` updates; the bounds run per
update as they do in synchronous rounds. Where the next parts plug in: a hardened secure round (per-block secrets, a
consistency round, group sums for robustness) is the secure combiner's stages
(:mod:`orchestrator.aggregation.secure.stages`) and its round's :class:`~orchestrator.aggregation.secure.round.SecureStage`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edge_sdk import protocol as p
from edge_sdk.references import load_reference
from edge_sdk.values import SettingError
from orchestrator.aggregation.intake import Intake
from orchestrator.aggregation.pipeline import Bound, Combiner, Release, UploadFormat
from orchestrator.config import ServerConfig
from orchestrator.parts import Emit, Reference, Send, Session, Work
from orchestrator.rounds import RoundState
from orchestrator.server.uploads import Uploads
from orchestrator.store import Store
from orchestrator.strategies import Strategy

if TYPE_CHECKING:  # a model is only passed through here; the command line checks settings without torch
    from edge_sdk.models import LayeredModel

__all__ = ["BOUNDS", "COMBINERS", "DEFAULT_MECHANISMS", "IntakeServices", "UPLOAD_FORMATS", "assemble_intake",
           "check_capabilities"]

#: The upload formats, by name.
UPLOAD_FORMATS: dict[str, str] = {
    "plain": "orchestrator.aggregation.formats:PlainUpload",
    "masked": "orchestrator.aggregation.secure.upload:MaskedUpload",
}
#: The combiners, by name (an upload format names the one that takes its uploads).
COMBINERS: dict[str, str] = {
    "strategy": "orchestrator.aggregation.combine:StrategyFold",
    "secure_sums": "orchestrator.aggregation.secure.sums:SecureSums",
    "buffer": "orchestrator.aggregation.buffered:BufferedFold",
}
#: The bounds, by name, in the order the chain runs them.
BOUNDS: dict[str, str] = {
    "norm_bound": "orchestrator.aggregation.bounds:NormBoundStep",
    "direction_trust": "orchestrator.aggregation.bounds:TrustStep",
    "dp_clip": "orchestrator.aggregation.privacy.clipping:ClipAndSum",
    "device_clip": "orchestrator.aggregation.secure.upload:DeviceClip",
}
#: The privacy mechanism a format releases with when ``dp_mechanism`` names none.
DEFAULT_MECHANISMS: dict[str, str] = {"plain": "gaussian", "masked": "discrete_gaussian"}


@dataclass(frozen=True)
class IntakeServices:
    """What report intake's parts reach of the server: the bytes of uploads, the revocation check, the
    server's reference update, the open round, the train instruction out to a device, the connected
    devices, how they send and report, and how they tell selection a device answered."""

    uploads: Uploads
    check_revoked: Callable[[Session], None]
    limits: p.Limits
    reference: Reference
    round_state: Callable[[], RoundState | None]
    work_of: Callable[[str], Work | None]
    sessions: Mapping[str, Session]
    send: Send
    emit: Emit
    alive: Callable[[str], None]


def _load(table: Mapping[str, str], name: str, what: str) -> Any:
    return load_reference(table[name], what)


def check_capabilities(config: ServerConfig, strategy: Strategy) -> None:
    """Refuse, in one line, settings the strategy cannot run under, by what it declares it combines
    (``Strategy.combines``): secure aggregation and DP release sums of whole blocks over a weight sum."""
    combines = strategy.combines
    if config.secure_aggregation and not combines.is_sum:
        raise SettingError("secure_aggregation", f"strategy {strategy.name} combines by {combines.describe()}; "
                                                 f"secure aggregation sums whole blocks and runs a strategy that "
                                                 f"declares a weighted mean (Strategy.combines)")
    if config.secure_aggregation and config.dp and config.secure_group_size:
        raise SettingError("secure_group_size", "secure groups reveal one sum per group; distributed noise is sized "
                                                "for one sum of the cohort: dp runs one group (secure_group_size 0)")
    if config.round_mode == "buffered":
        _check_buffered(config, combines.is_sum, combines.describe(), strategy.name)
    if config.dp:
        from orchestrator.aggregation.privacy.calibrate import check_strategy

        check_strategy(strategy.name, combines)


def _check_buffered(config: ServerConfig, is_sum: bool, rule: str, name: str) -> None:
    """Buffered rounds fold each update alone into a weighted mean of blocks, step by step: a rule of
    the strategy's own (rows, prioritized phases, a robust statistic) has no buffered form, and neither
    masked sums (a cohort that unmasks together) nor a privacy ledger of rounds account a buffer yet."""
    if not is_sum:
        raise SettingError("round_mode", f"strategy {name} combines by {rule}; buffered rounds fold each update "
                                         f"into a weighted mean of blocks and run a strategy that declares one "
                                         f"(Strategy.combines)")
    if config.secure_aggregation:
        raise SettingError("round_mode", "buffered rounds fold each update as it arrives; secure aggregation "
                                         "unmasks a cohort's sum together and runs synchronous rounds only")
    if config.dp:
        raise SettingError("round_mode", "buffered rounds release a model every buffer; the privacy ledger "
                                         "accounts synchronous rounds only, so dp runs synchronous rounds")


def _mechanism(config: ServerConfig, template: LayeredModel, format: UploadFormat) -> Any:
    """The run's privacy mechanism (``dp_mechanism``, or the format's default), checked to release
    from this upload format; None without ``dp``."""
    if not config.dp:
        return None
    from orchestrator.aggregation.privacy.mechanism import mechanism_class

    name = config.dp_mechanism or DEFAULT_MECHANISMS[format.name]
    cls = mechanism_class(name)
    if format.name not in cls.formats:
        raise SettingError("dp_mechanism", f"mechanism {name} releases from {' or '.join(sorted(cls.formats)) or 'no'} "
                                           f"uploads, not {format.name} ones"
                                           + (" (secure_aggregation masks them)" if format.name == "masked" else "")
                                           + (f": {cls.formats_why}" if cls.formats_why else ""))
    state = template.state_dict()
    mechanism = cls(config, template.block_names, {n: template.block_of(n) for n in state})
    mechanism.bind({n: tuple(t.shape) for n, t in state.items() if t.is_floating_point()})
    return mechanism


def _bounds(config: ServerConfig, template: LayeredModel, store: Store, services: IntakeServices,
            format: UploadFormat, mechanism: Any) -> list[Bound]:
    """The chain, in ``BOUNDS`` order: what sees each update where the server does and no mechanism
    releases the round; a mechanism's clip; under masking, the devices' clip."""
    chain: list[Bound] = []
    if format.sees_updates and mechanism is None:
        chain += _reading_bounds(config, template, store, services)
    if mechanism is not None and (clip := mechanism.server_clip()) is not None:
        chain.append(clip)
    if not format.sees_updates:
        chain.append(_load(BOUNDS, "device_clip", "bound")(_device_clip(config, mechanism)))
    return chain


def _reading_bounds(config: ServerConfig, template: LayeredModel, store: Store, services: IntakeServices, *,
                    sums: bool = False) -> list[Bound]:
    """``norm_bound`` and (``direction_trust``) ``direction_trust``: the bounds that read an update in the
    clear, against the server's reference update (each device's update, or with ``sums`` a secure
    group's mean, scaled up to the reference's norm only under ``secure_group_norm = "reference"``)."""
    from orchestrator.aggregation.normbound import NormBound
    from orchestrator.aggregation.trust import DirectionTrust

    norms = NormBound(config, template, store, services.reference)
    chain: list[Bound] = [_load(BOUNDS, "norm_bound", "bound")(norms)]
    if config.direction_trust:
        trust = DirectionTrust(template, config.trust_floor, config.direction_trust,
                               scales_up=not sums or config.secure_group_norm == "reference")
        chain.append(_load(BOUNDS, "direction_trust", "bound")(trust, norms))
    return chain


def _device_clip(config: ServerConfig, mechanism: Any) -> float:
    """The clip each device applies to each block under masking: the mechanism's, else ``secure_clip``."""
    return config.secure_clip if mechanism is None else mechanism.device_clip()


def assemble_intake(config: ServerConfig, template: LayeredModel, strategy: Strategy, store: Store,
                    services: IntakeServices) -> Intake:
    """Report intake for these settings and this strategy (see the module docstring)."""
    check_capabilities(config, strategy)
    format: UploadFormat = _load(UPLOAD_FORMATS, "masked" if config.secure_aggregation else "plain",
                                 "upload format")(config, template, services.limits)
    mechanism = _mechanism(config, template, format)
    bounds = _bounds(config, template, store, services, format, mechanism)
    combiner: Combiner
    if format.combiner == "secure_sums":
        from orchestrator.aggregation.secure.stages import RoundAccess

        access = RoundAccess(services.round_state, services.work_of, services.sessions, services.send, services.emit,
                             services.alive)
        # The strategy's declared weighting, unless the mechanism weighs every device 1 (its sensitivity).
        uniform = mechanism.uniform if mechanism is not None else strategy.combines.weighting == "uniform"
        plan_noise = mechanism.noise_shares if mechanism is not None else (lambda cohorts: None)
        combiner = _load(COMBINERS, "secure_sums", "combiner")(
            config, format, store, access, clip=_device_clip(config, mechanism), uniform=uniform, plan_noise=plan_noise)
    elif config.round_mode == "buffered":  # FedBuff's buffer over plain uploads (check_capabilities)
        combiner = _load(COMBINERS, "buffer", "combiner")(config, strategy, store)
    else:
        combiner = _load(COMBINERS, format.combiner, "combiner")(strategy, store)
    release: Release = Release()
    if mechanism is not None:
        from orchestrator.aggregation.privacy.release import PrivateRelease

        release = PrivateRelease(mechanism, config, store)
    # With secure groups, each group's sum is one update to the bounds that read updates (docs/security.md,
    # "Secure groups"); not under a privacy mechanism, whose noised sums no reference update may be measured
    # against. Without (secure_group_size 0) the round is today's one sum, applied as the strategy's mean.
    sum_bounds = _reading_bounds(config, template, store, services, sums=True) \
        if format.bounded_sums and mechanism is None and config.secure_group_size else []
    return Intake(config, format, bounds, combiner, release, uploads=services.uploads,
                  check_revoked=services.check_revoked, sum_bounds=sum_bounds)
