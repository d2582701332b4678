"""Reproduce published evaluations on the simulator (`splitserve reproduce splitwise`)."""
