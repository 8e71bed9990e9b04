"""The autoscaler: how many workers exist, from queue depth, down to zero and back at once.

`policy` (the pure rule), `config` (the TOML file), `probes` (depth, busy/idle), `watch`
(wake-up from zero), `targets` (Kubernetes Deployments, local worker processes), `metrics`
(/metrics and the depth endpoint for KEDA), `daemon` (the loop), `cli`.
"""
