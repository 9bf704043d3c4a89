"""The one router: which replica of a backend takes a request, for the ingress and for a
replica's handles alike. A backend's replicas and the requests sent to each (``table``), power
of two choices and route prefixes (``choice``), a canary's split (``split``), pooled connections
to replicas (``upstream``), and where the replicas are learned (``sources``: the controller in
process, or a daemon's watch)."""
