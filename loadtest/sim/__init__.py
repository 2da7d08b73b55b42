"""A discrete-event simulation of a tandem cluster that runs tandem's own policies (issue 32).
Everything it outputs is SIMULATED; see README.md for the reading order and what it models."""

LABEL = "SIMULATED"
