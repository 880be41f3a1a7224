"""crossrl: one scenario spec, three distributed RL engines, compared honestly."""

__version__ = "0.1.0"
