"""The ``eval`` and ``headroom`` commands: their configs, run functions and result views."""
