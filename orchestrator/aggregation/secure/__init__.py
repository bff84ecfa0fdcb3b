"""Secure aggregation in the server (docs/security.md, "Secure aggregation"): the round's stages
(:mod:`.round`, sans-I/O) and the report intake that drives them (:mod:`.intake`)."""
