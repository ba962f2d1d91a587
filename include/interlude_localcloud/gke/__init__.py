"""GKE in the local cloud: the Container API v1 subset and a Kubernetes API server per cluster."""
