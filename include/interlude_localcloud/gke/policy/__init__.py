"""Pure GKE behaviour for the local cloud: scheduling, cluster autoscaling with ComputeClasses, the HPA
algorithm and node maintenance, as functions of typed values and an explicit ``now`` (no clock, no I/O),
so reconcile loops can call them and tests can drive them from tables."""
