"""The typed-value converter of every setting, server and device alike: it lives in the device SDK
(:mod:`edge_sdk.values`, standard library only) so that both refuse a bad value the same way; the
server's modules and strategies import it from here."""

from edge_sdk.values import (ByteSize, Count, Fraction, NonNegative, NonNegativeInt, Positive, Range, SettingError, Unit,
                             accepted, convert, split_annotated)

__all__ = ["ByteSize", "Count", "Fraction", "NonNegative", "NonNegativeInt", "Positive", "Range", "SettingError", "Unit",
           "accepted", "convert", "split_annotated"]
