"""Imports every command module so that each registers its commands on the app."""

# One line per command module; keep sorted.
