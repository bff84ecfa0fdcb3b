"""Report intake and what bounds it: the plain intake (:mod:`.intake`), the norm bound, the
reference model and direction trust, and the secure-aggregation (:mod:`.secure`) and
differential-privacy (:mod:`.privacy`) intakes built on it."""
