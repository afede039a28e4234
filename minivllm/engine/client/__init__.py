"""Engine clients: the engine-core process and its client, data-parallel replicas."""
