"""profiles: what a device is (device classes, a probe) and the memory accounting of a model split."""
