"""Engine twin: hardware/model catalog, KV calculator and roofline step-time model for the simulator."""
