"""The operator's views: the fleet table (:mod:`.fleetview`), the run report (:mod:`.report`), the
terminal status (:mod:`.terminal`) and the device page and status site (:mod:`.web`)."""
