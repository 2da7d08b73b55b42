"""Per-pool autoscaling: a pure decision function (policy.py), what replicas report
(signals.py), and the adapter to Ray Serve's custom autoscaling hook (serve_policy.py)."""

from cluster.autoscaling.policy import Decision, Observation, PolicyState, Rules, decide, load_of

__all__ = ["Decision", "Observation", "PolicyState", "Rules", "decide", "load_of"]
