"""User-level differential privacy on the server: the ledger, the noise, the clips (docs/security.md,
"Differential privacy: accounting and noise").

- :mod:`~orchestrator.aggregation.privacy.accountant`: :class:`PrivacyLedger`, (epsilon, delta) per block and for
  the model after every round, with ``dp-accounting``; its state is plain JSON.
- :mod:`~orchestrator.aggregation.privacy.calibrate`: the noise multiplier for a target epsilon, the noise per
  coordinate it costs, per-block plans under partial training, and the settings refused up front.
- :mod:`~orchestrator.aggregation.privacy.noise`: central Gaussian noise on a block's sum, from the OS CSPRNG.
- :mod:`~orchestrator.aggregation.privacy.clipping`: the per-block clip (the devices' rule), per-layer clips,
  adaptive clipping (Andrew et al., 2021).

The devices' side (their clip and their discrete noise shares under secure aggregation) is
:mod:`edge_sdk.dp`.
"""

__all__ = ["PrivacyBudgetSpent"]


class PrivacyBudgetSpent(Exception):
    """The next round would take the model's epsilon past the run's target: the run ends here.
    (Here, not beside the ledger, so the server catches it without importing ``dp-accounting``.)"""
