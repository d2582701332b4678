"""The cluster a run simulates: its design (catalog/designs.toml: split into prompt and token pools,
or one mixed pool), its pools of model instances, and what each instance is (`tp` x `pp` GPUs of
one machine kind, paying for them). Low in the layering: the simulator, provisioning and the
twin build clusters here; it imports only catalog/, policy/ and errors.py.

    designs.py    Parallelism, ClusterSpec, make_cluster (a design and its pools' counts), parse_count
    instance.py   Instance, make_instance, InstanceSpec (an instance with its hardware's figures)
"""
