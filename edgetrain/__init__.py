"""edgetrain: the command line (:mod:`edgetrain.cli`), a layer above the emulator and the orchestrator."""
