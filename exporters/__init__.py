"""exporters: turn a layered model into what devices run (ONNX chunks, training graphs, device bundles)
and what an app ships (the whole trained model).

Importing the package quiets, at their source, the libraries the ONNX exporters drive, which would
otherwise fill a server's terminal (in a run with ONNX Runtime devices, most of ``edgetrain serve``'s
standard error): the narration of every optimisation pass that onnxscript and onnx_ir log at INFO
("Skipping constant folding for node ...", "Removed 7 unused nodes", "Applied 1 of general pattern
rewrite rules"), and torch.onnx's warning, each time the dynamo exporter builds its registry, that
torchvision's detection operators are not registered because torchvision is not installed (the
project exports no torchvision operator). Only those: those libraries' warnings and errors, and
every other torch message, still show; a level set on those loggers before this import is kept.
This is the one place the project configures other libraries' logging.
"""

from __future__ import annotations

import logging

#: Loggers whose INFO records narrate each export pass; they keep WARNING and above.
PASS_LOGGERS = ("onnxscript", "onnx_ir")
#: The torch.onnx logger that warns of torchvision's operators, and the start of that message.
REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"
TORCHVISION_MISSING = "torchvision is not installed"


class _NotTorchvisionMissing(logging.Filter):
    """Drops torch.onnx's "torchvision is not installed. Skipping torchvision::<op>" and nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(TORCHVISION_MISSING)


def _quiet_exporter_libraries() -> None:
    for name in PASS_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:  # a level someone chose stays
            logger.setLevel(logging.WARNING)
    registry = logging.getLogger(REGISTRY_LOGGER)
    if not any(isinstance(f, _NotTorchvisionMissing) for f in registry.filters):
        registry.addFilter(_NotTorchvisionMissing())


_quiet_exporter_libraries()
