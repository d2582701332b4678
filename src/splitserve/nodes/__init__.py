"""The machines a run spans: joining a Ray cluster (ray_cluster.py) and what identifies this
splitserve on each node (fingerprint.py). Low in the layering: provisioning and serving use it,
it imports only errors.py and the package's version."""
