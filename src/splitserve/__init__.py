"""splitserve: phase-split (Splitwise) LLM serving, simulation and provisioning."""

__version__ = "0.1.0"
