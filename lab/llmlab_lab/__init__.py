"""Lab tools: evaluations, sweeps and calibrations over the libraries (never imported by a service)."""
