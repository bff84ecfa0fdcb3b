"""Device-side parts of the federated algorithms that need more than the built-in phases.

Each module adds its phases, report hooks and selection kinds to a :class:`~edge_sdk.phases.DeviceRegistry`
(its ``DEVICE_STEPS``); the server-side part is the strategy of the same name in
``orchestrator/strategies``. :data:`DEFAULT_REGISTRY` is what a device knows unless its
configuration says otherwise (``DeviceSettings.registry``): the built-in phases plus every module here.
"""

from edge_sdk.algorithms import fedalign, width
from edge_sdk.phases import BUILTIN_REGISTRY, DeviceRegistry

__all__ = ["DEFAULT_REGISTRY"]

#: The built-in phases (train, evaluate, compare; tail and rows), FedALIGN's incentive check after
#: evaluate and train, and width reduction's channel selection.
DEFAULT_REGISTRY: DeviceRegistry = BUILTIN_REGISTRY.extended(**fedalign.DEVICE_STEPS).extended(**width.DEVICE_STEPS)
