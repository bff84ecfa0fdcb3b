"""User-level differential privacy on the server: the mechanisms, the ledger, the noise, the clips
(docs/security.md, "Differential privacy: accounting and noise").

- :mod:`~orchestrator.aggregation.privacy.mechanism`: :class:`PrivacyMechanism`, what a way of adding
  noise does (its plan for a cohort, its clip, the noise on the sums or the devices' shares, the
  accountant's event), and :func:`register_mechanism`; the mechanisms: central Gaussian noise
  (:mod:`.gaussian`) and the devices' discrete Gaussian shares under secure aggregation (:mod:`.distributed`),
  both planned by :mod:`.central` (the multiplier, delta and per-block clips of a run's settings).
- :mod:`~orchestrator.aggregation.privacy.release`: :class:`PrivateRelease`, the one owner of a run's
  ledger (created or resumed, the target checked, each release recorded and journaled, the summary).
- :mod:`~orchestrator.aggregation.privacy.accountant`: :class:`PrivacyLedger`, (epsilon, delta) per block and
  for the model after every round, with ``dp-accounting``; its state is plain JSON.
- :mod:`~orchestrator.aggregation.privacy.calibrate`: the noise multiplier for a target epsilon, the noise per
  coordinate it costs, per-block plans under partial training, and the settings refused up front.
- :mod:`~orchestrator.aggregation.privacy.noise`: central Gaussian noise on a block's sum, from the OS CSPRNG.
- :mod:`~orchestrator.aggregation.privacy.clipping`: the per-block clip (the devices' rule), per-layer clips,
  adaptive clipping (Andrew et al., 2021), and the server's clip-and-sum step of a report's bounds.

The devices' side (their clip and their discrete noise shares under secure aggregation) is
:mod:`edge_sdk.dp`. This module imports nothing: the settings (:mod:`orchestrator.config`) read the
tables below without loading ``dp-accounting``.
"""

__all__ = ["ACCOUNTANTS", "ALLOCATIONS", "MECHANISMS", "PrivacyBudgetSpent", "SAMPLINGS"]

#: The privacy mechanisms, by name: where each one's class lives (``package.module:Class``), loaded
#: when a run uses it (:func:`~orchestrator.aggregation.privacy.mechanism.mechanism_class`). A new
#: mechanism is one module plus one row here, or ``@register_mechanism(name)`` on a class of your own
#: (``dp_mechanism = "package.module:Class"`` works without either).
MECHANISMS: dict[str, str] = {
    "gaussian": "orchestrator.aggregation.privacy.gaussian:CentralGaussian",
    "discrete_gaussian": "orchestrator.aggregation.privacy.distributed:DistributedDiscreteGaussian",
    "ftrl": "orchestrator.aggregation.privacy.ftrl:FtrlMechanism",
}

#: The accountants of ``dp-accounting`` a ledger can keep (``orchestrator.aggregation.privacy.accountant``):
#: privacy loss distributions, or Renyi DP.
ACCOUNTANTS: tuple[str, ...] = ("pld", "rdp")
#: How a round's cohort is drawn, as the accountant takes it: ceil(fraction x N) of the N idle devices
#: (``fixed``), or each device independently with probability fraction (``poisson``).
SAMPLINGS: tuple[str, ...] = ("fixed", "poisson")
#: How the model's noise is shared between its blocks: ``uniform`` (z_b = z sqrt(L), per-layer clipping
#: with equal noise) or ``utility`` (the multipliers that minimise the noise on the mean update under
#: the same model budget: ``orchestrator.aggregation.privacy.calibrate.allocate_multipliers``).
ALLOCATIONS: tuple[str, ...] = ("uniform", "utility")


class PrivacyBudgetSpent(Exception):
    """The next round would take the model's epsilon past the run's target: the run ends here.
    (Here, not beside the ledger, so the server catches it without importing ``dp-accounting``.)"""
